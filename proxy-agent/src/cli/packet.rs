//! Building and reading Ethernet + IPv4/IPv6 + TCP/UDP/SCTP frames, for
//! `BPF_PROG_TEST_RUN` and anything else that needs to craft or check a
//! packet byte for byte. The family of a frame is the family of its
//! addresses; everything here answers for both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_common::proto;

pub const ETH_HLEN: usize = 14;
pub const IPV4_HLEN: usize = 20;
pub const IPV6_HLEN: usize = 40;
pub const TCP_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;
/// SCTP's common header (ports, verification tag, CRC32c).
pub const SCTP_HLEN: usize = 12;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;

/// IPv6 extension headers [`Frame::parse`] walks (RFC 8200 §4): hop-by-hop,
/// routing, fragment, destination options.
const IPV6_EXTENSIONS: [u8; 4] = [0, 43, 44, 60];
const IPV6_MAX_EXTENSIONS: usize = 8;

/// TCP flags as they sit in byte 13 of the TCP header.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

/// SCTP chunk types (RFC 9260 §3.2).
pub mod sctp_chunk {
    pub const DATA: u8 = 0;
    pub const INIT: u8 = 1;
    pub const INIT_ACK: u8 = 2;
    pub const ABORT: u8 = 6;
    pub const SHUTDOWN: u8 = 7;
    pub const SHUTDOWN_ACK: u8 = 8;
    pub const COOKIE_ECHO: u8 = 10;
    pub const SHUTDOWN_COMPLETE: u8 = 14;

    /// A chunk of `kind` with `value`, padded to 4 bytes.
    pub fn chunk(kind: u8, flags: u8, value: &[u8]) -> Vec<u8> {
        let mut c = vec![kind, flags];
        c.extend(((4 + value.len()) as u16).to_be_bytes());
        c.extend(value);
        c.resize(c.len().next_multiple_of(4), 0);
        c
    }

    /// An INIT chunk (initiate tag, a_rwnd, streams, initial TSN).
    pub fn init(tag: u32) -> Vec<u8> {
        let mut v = tag.to_be_bytes().to_vec();
        v.extend(65_535u32.to_be_bytes());
        v.extend([0, 10, 0, 10]);
        v.extend(1u32.to_be_bytes());
        chunk(INIT, 0, &v)
    }

    /// A DATA chunk (TSN, stream 0, sequence 0, payload protocol 0) with `user_data`.
    pub fn data(tsn: u32, user_data: &[u8]) -> Vec<u8> {
        let mut v = tsn.to_be_bytes().to_vec();
        v.extend([0, 0, 0, 0, 0, 0, 0, 0]);
        v.extend(user_data);
        chunk(DATA, 0x03, &v)
    }
}

/// The fields of a frame the datapath looks at or rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

impl Frame {
    pub fn tcp(src: impl Into<IpAddr>, sport: u16, dst: impl Into<IpAddr>, dport: u16) -> Self {
        Self {
            src: src.into(),
            dst: dst.into(),
            sport,
            dport,
            proto: proto::TCP,
        }
    }

    pub fn udp(src: impl Into<IpAddr>, sport: u16, dst: impl Into<IpAddr>, dport: u16) -> Self {
        Self {
            proto: proto::UDP,
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// An SCTP packet; [`Frame::build`] takes its chunks as the payload
    /// (none: an INIT).
    pub fn sctp(src: impl Into<IpAddr>, sport: u16, dst: impl Into<IpAddr>, dport: u16) -> Self {
        Self {
            proto: proto::SCTP,
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// The reverse direction of this frame.
    pub fn reply(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }

    pub fn is_ipv6(&self) -> bool {
        self.src.is_ipv6()
    }

    /// An Ethernet + IPv4/IPv6 + TCP (SYN), UDP or SCTP frame with `payload`
    /// (SCTP: its chunks, an INIT when empty) and valid checksums. Panics if
    /// the two addresses are of different families.
    pub fn build(&self, payload: &[u8]) -> Vec<u8> {
        let init;
        let payload = if self.proto == proto::SCTP && payload.is_empty() {
            init = sctp_chunk::init(0x5c7f_0001);
            &init[..]
        } else {
            payload
        };
        let l4_len = match self.proto {
            proto::TCP => TCP_HLEN,
            proto::SCTP => SCTP_HLEN,
            _ => UDP_HLEN,
        } + payload.len();
        let mut pkt = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                pkt.extend(ETH_P_IP.to_be_bytes());
                pkt.extend([0x45, 0]);
                pkt.extend(((IPV4_HLEN + l4_len) as u16).to_be_bytes());
                pkt.extend(0x1234u16.to_be_bytes());
                pkt.extend([0x40, 0]); // don't fragment
                pkt.extend([64, self.proto, 0, 0]);
                pkt.extend(src.octets());
                pkt.extend(dst.octets());
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                pkt.extend(ETH_P_IPV6.to_be_bytes());
                pkt.extend([0x60, 0, 0, 0]);
                pkt.extend((l4_len as u16).to_be_bytes());
                pkt.extend([self.proto, 64]);
                pkt.extend(src.octets());
                pkt.extend(dst.octets());
            }
            (src, dst) => panic!("a frame from {src} to {dst} mixes address families"),
        }
        let l4 = pkt.len();
        pkt.resize(l4 + l4_len, 0);
        let l4 = &mut pkt[l4..];
        l4[0..2].copy_from_slice(&self.sport.to_be_bytes());
        l4[2..4].copy_from_slice(&self.dport.to_be_bytes());
        if self.proto == proto::TCP {
            l4[4..8].copy_from_slice(&1u32.to_be_bytes());
            l4[12] = 5 << 4;
            l4[13] = tcp_flags::SYN;
            l4[14..16].copy_from_slice(&64240u16.to_be_bytes());
            l4[TCP_HLEN..].copy_from_slice(payload);
        } else if self.proto == proto::SCTP {
            // An INIT goes with tag 0; anything else with the peer's tag.
            let tag: u32 = if payload.first() == Some(&sctp_chunk::INIT) {
                0
            } else {
                0x5c7f_0002
            };
            l4[4..8].copy_from_slice(&tag.to_be_bytes());
            l4[SCTP_HLEN..].copy_from_slice(payload);
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            l4[UDP_HLEN..].copy_from_slice(payload);
        }
        fix_checksums(&mut pkt);
        pkt
    }

    /// Reads the addresses and ports of an Ethernet + IPv4/IPv6 + TCP/UDP
    /// frame (IPv6: after any extension headers of [`IPV6_EXTENSIONS`]).
    pub fn parse(pkt: &[u8]) -> Option<Self> {
        let layout = Layout::of(pkt)?;
        let l4 = pkt.get(layout.l4..layout.l4 + 4)?;
        let ip = &pkt[ETH_HLEN..];
        let (src, dst) = if layout.ipv6 {
            let addr = |at: usize| {
                IpAddr::V6(Ipv6Addr::from(
                    <[u8; 16]>::try_from(&ip[at..at + 16]).unwrap(),
                ))
            };
            (addr(8), addr(24))
        } else {
            let addr =
                |at: usize| IpAddr::V4(Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]));
            (addr(12), addr(16))
        };
        Some(Self {
            src,
            dst,
            sport: u16::from_be_bytes([l4[0], l4[1]]),
            dport: u16::from_be_bytes([l4[2], l4[3]]),
            proto: layout.proto,
        })
    }
}

/// Where the parts of a frame sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub ipv6: bool,
    /// Offset of the L4 header in the frame.
    pub l4: usize,
    /// The L4 protocol (IPv6: the last next-header value).
    pub proto: u8,
}

impl Layout {
    /// The layout of an Ethernet + IPv4/IPv6 frame, `None` for other
    /// ethertypes and headers too short to hold their own length.
    pub fn of(pkt: &[u8]) -> Option<Self> {
        let ethertype = u16::from_be_bytes(pkt.get(12..14)?.try_into().ok()?);
        match ethertype {
            ETH_P_IP => {
                let ip = pkt.get(ETH_HLEN..ETH_HLEN + IPV4_HLEN)?;
                Some(Self {
                    ipv6: false,
                    l4: ETH_HLEN + (ip[0] & 0x0f) as usize * 4,
                    proto: ip[9],
                })
            }
            ETH_P_IPV6 => {
                let ip = pkt.get(ETH_HLEN..ETH_HLEN + IPV6_HLEN)?;
                let mut next = ip[6];
                let mut at = ETH_HLEN + IPV6_HLEN;
                for _ in 0..IPV6_MAX_EXTENSIONS {
                    if !IPV6_EXTENSIONS.contains(&next) {
                        break;
                    }
                    let ext = pkt.get(at..at + 2)?;
                    let len = if next == 44 {
                        8
                    } else {
                        (ext[1] as usize + 1) * 8
                    };
                    next = ext[0];
                    at += len;
                }
                Some(Self {
                    ipv6: true,
                    l4: at,
                    proto: next,
                })
            }
            _ => None,
        }
    }

    /// Offset of the TTL (IPv4) or hop limit (IPv6) byte.
    pub fn ttl(&self) -> usize {
        ETH_HLEN + if self.ipv6 { 7 } else { 8 }
    }

    /// Offset of the L4 checksum field.
    pub fn l4_checksum(&self) -> usize {
        self.l4
            + match self.proto {
                proto::TCP => 16,
                proto::UDP => 6,
                proto::SCTP => 8,
                _ => 2, // ICMP, ICMPv6
            }
    }
}

/// Offset of the L4 checksum field within the frame.
pub fn l4_checksum_offset(pkt: &[u8]) -> usize {
    Layout::of(pkt).expect("an IP frame").l4_checksum()
}

/// Sets the TTL (hop limit) of an IP frame and fixes the checksums.
pub fn set_ttl(pkt: &mut [u8], ttl: u8) {
    let at = Layout::of(pkt).expect("an IP frame").ttl();
    pkt[at] = ttl;
    fix_checksums(pkt);
}

/// Recomputes the IPv4 header checksum (IPv4) and the TCP/UDP/ICMP
/// checksum in place.
pub fn fix_checksums(pkt: &mut [u8]) {
    let layout = Layout::of(pkt).expect("an IP frame");
    if !layout.ipv6 {
        let ihl = layout.l4 - ETH_HLEN;
        pkt[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
        let ip_sum = checksum(&[&pkt[ETH_HLEN..ETH_HLEN + ihl]]);
        pkt[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&ip_sum.to_be_bytes());
    }
    let off = layout.l4_checksum();
    if layout.proto == proto::SCTP {
        let crc = sctp_crc32c(pkt, &layout);
        pkt[off..off + 4].copy_from_slice(&crc.to_le_bytes());
        return;
    }
    pkt[off..off + 2].fill(0);
    let mut sum = l4_checksum(pkt, &layout);
    if sum == 0 && layout.proto == proto::UDP {
        sum = 0xffff;
    }
    pkt[off..off + 2].copy_from_slice(&sum.to_be_bytes());
}

/// True when the IPv4 header checksum (IPv4) and the L4 checksum (a zero
/// UDP checksum meaning "none" counts as valid) both verify.
pub fn checksums_valid(pkt: &[u8]) -> bool {
    let Some(layout) = Layout::of(pkt) else {
        return false;
    };
    let ip_ok = layout.ipv6 || checksum(&[&pkt[ETH_HLEN..layout.l4]]) == 0;
    let off = layout.l4_checksum();
    if layout.proto == proto::SCTP {
        return ip_ok
            && pkt
                .get(off..off + 4)
                .is_some_and(|f| f == sctp_crc32c(pkt, &layout).to_le_bytes());
    }
    let Some(field) = pkt.get(off..off + 2) else {
        return false;
    };
    let udp_none = layout.proto == proto::UDP && field == [0, 0];
    ip_ok && (udp_none || l4_checksum(pkt, &layout) == 0)
}

/// SCTP's CRC32c (RFC 9260 appendix A) over the packet, its checksum field
/// taken as zero; stored little-endian. No pseudo-header: addresses are
/// not covered.
fn sctp_crc32c(pkt: &[u8], layout: &Layout) -> u32 {
    let end = l4_end(pkt, layout);
    let mut l4 = pkt[layout.l4..end].to_vec();
    l4[8..12].fill(0);
    crc32c::crc32c(&l4)
}

/// Where the IP datagram ends (its header's length, within the frame).
fn l4_end(pkt: &[u8], layout: &Layout) -> usize {
    let ip = &pkt[ETH_HLEN..];
    let end = if layout.ipv6 {
        ETH_HLEN + IPV6_HLEN + u16::from_be_bytes([ip[4], ip[5]]) as usize
    } else {
        ETH_HLEN + u16::from_be_bytes([ip[2], ip[3]]) as usize
    };
    end.min(pkt.len())
}

/// The checksum over the L4 segment and its pseudo-header (RFC 793, RFC
/// 8200 §8.1); ICMP (IPv4) has none.
fn l4_checksum(pkt: &[u8], layout: &Layout) -> u16 {
    let ip = &pkt[ETH_HLEN..];
    if layout.ipv6 {
        let end =
            (ETH_HLEN + IPV6_HLEN + u16::from_be_bytes([ip[4], ip[5]]) as usize).min(pkt.len());
        let l4 = &pkt[layout.l4..end];
        let mut pseudo = [0u8; 40];
        pseudo[0..32].copy_from_slice(&ip[8..40]);
        pseudo[32..36].copy_from_slice(&(l4.len() as u32).to_be_bytes());
        pseudo[39] = layout.proto;
        checksum(&[&pseudo, l4])
    } else {
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        let l4 = &pkt[layout.l4..(ETH_HLEN + total).min(pkt.len())];
        if layout.proto == proto::ICMP {
            return checksum(&[l4]);
        }
        let mut pseudo = [0u8; 12];
        pseudo[0..8].copy_from_slice(&ip[12..20]);
        pseudo[9] = layout.proto;
        pseudo[10..12].copy_from_slice(&(l4.len() as u16).to_be_bytes());
        checksum(&[&pseudo, l4])
    }
}

/// The Internet checksum (RFC 1071) over the concatenation of `parts`.
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for byte in parts.iter().flat_map(|p| p.iter().copied()) {
        match odd.take() {
            Some(hi) => sum += u32::from(u16::from_be_bytes([hi, byte])),
            None => odd = Some(byte),
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(hi) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_frames_verify_and_parse_back() {
        let v4 = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 19, 0, 1));
        let v6 = (
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8:ffff::1".parse::<Ipv6Addr>().unwrap(),
        );
        for f in [
            Frame::tcp(v4.0, 40000, v4.1, 80),
            Frame::udp(v4.0, 40000, v4.1, 53),
            Frame::tcp(v6.0, 40000, v6.1, 80),
            Frame::udp(v6.0, 40000, v6.1, 53),
        ] {
            let pkt = f.build(b"hello");
            assert!(checksums_valid(&pkt), "{f:?}");
            assert_eq!(Frame::parse(&pkt), Some(f));
            let mut broken = pkt.clone();
            *broken.last_mut().unwrap() ^= 0xff;
            assert!(!checksums_valid(&broken), "{f:?}");
            let mut ttl = pkt.clone();
            set_ttl(&mut ttl, 1);
            assert_eq!(ttl[Layout::of(&pkt).unwrap().ttl()], 1);
            assert!(checksums_valid(&ttl));
        }
    }

    #[test]
    fn ipv6_frames_have_the_rfc_8200_layout() {
        let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let pkt = Frame::udp(src, 1, dst, 2).build(b"");
        assert_eq!(pkt.len(), ETH_HLEN + IPV6_HLEN + UDP_HLEN);
        assert_eq!(&pkt[12..14], &[0x86, 0xdd]);
        let ip = &pkt[ETH_HLEN..];
        assert_eq!(
            (ip[0], ip[4], ip[5], ip[6], ip[7]),
            (0x60, 0, 8, proto::UDP, 64)
        );
        // By hand: the non-zero words of the pseudo-header (addresses,
        // length, next header) and of the UDP header (ports, length).
        let sum = 0x2001u32 + 0x0db8 + 1 + 0x2001 + 0x0db8 + 2 + 8 + 17 + 1 + 2 + 8;
        assert_eq!(sum, 0x5b99);
        assert_eq!(
            &pkt[ETH_HLEN + IPV6_HLEN + 6..],
            &(!(sum as u16)).to_be_bytes()
        );
    }

    #[test]
    fn ipv6_extension_headers_are_walked_to_the_ports() {
        let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let plain = Frame::tcp(src, 40000, dst, 80).build(b"");
        // One 8-byte destination-options header (Pad6) before TCP.
        let mut pkt = plain[..ETH_HLEN + IPV6_HLEN].to_vec();
        pkt[ETH_HLEN + 6] = 60;
        pkt[ETH_HLEN + 5] += 8;
        pkt.extend([proto::TCP, 0, 1, 4, 0, 0, 0, 0]);
        pkt.extend(&plain[ETH_HLEN + IPV6_HLEN..]);
        let layout = Layout::of(&pkt).unwrap();
        assert_eq!(
            (layout.l4, layout.proto),
            (ETH_HLEN + IPV6_HLEN + 8, proto::TCP)
        );
        assert_eq!(Frame::parse(&pkt), Frame::parse(&plain));
        assert!(checksums_valid(&pkt));
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 section 3 example: the sum of these words is 0xddf2.
        assert_eq!(
            checksum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]),
            !0xddf2
        );
    }
}
