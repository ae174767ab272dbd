//! Building and reading IPv4 TCP/UDP frames, for `BPF_PROG_TEST_RUN` and
//! anything else that needs to craft or check a packet byte for byte.

use std::net::Ipv4Addr;

use proxy_common::proto;

pub const ETH_HLEN: usize = 14;
pub const IPV4_HLEN: usize = 20;
pub const TCP_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;

/// TCP flags as they sit in byte 13 of the TCP header.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

/// The fields of a frame the datapath looks at or rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

impl Frame {
    pub fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto: proto::TCP,
        }
    }

    pub fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto: proto::UDP,
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

    /// An Ethernet + IPv4 + TCP (SYN) or UDP frame with `payload` and valid checksums.
    pub fn build(&self, payload: &[u8]) -> Vec<u8> {
        let l4_len = if self.proto == proto::TCP {
            TCP_HLEN
        } else {
            UDP_HLEN
        } + payload.len();
        let mut pkt = vec![0u8; ETH_HLEN + IPV4_HLEN + l4_len];
        pkt[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        pkt[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        pkt[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut pkt[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((IPV4_HLEN + l4_len) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6] = 0x40; // don't fragment
        ip[8] = 64;
        ip[9] = self.proto;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let l4 = &mut pkt[ETH_HLEN + IPV4_HLEN..];
        l4[0..2].copy_from_slice(&self.sport.to_be_bytes());
        l4[2..4].copy_from_slice(&self.dport.to_be_bytes());
        if self.proto == proto::TCP {
            l4[4..8].copy_from_slice(&1u32.to_be_bytes());
            l4[12] = 5 << 4;
            l4[13] = tcp_flags::SYN;
            l4[14..16].copy_from_slice(&64240u16.to_be_bytes());
            l4[TCP_HLEN..].copy_from_slice(payload);
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            l4[UDP_HLEN..].copy_from_slice(payload);
        }
        fix_checksums(&mut pkt);
        pkt
    }

    /// Reads the addresses and ports of an Ethernet + IPv4 + TCP/UDP frame.
    pub fn parse(pkt: &[u8]) -> Option<Self> {
        if pkt.len() < ETH_HLEN + IPV4_HLEN + 4 || pkt[12..14] != [0x08, 0x00] {
            return None;
        }
        let ip = &pkt[ETH_HLEN..];
        let ihl = (ip[0] & 0x0f) as usize * 4;
        let l4 = pkt.get(ETH_HLEN + ihl..ETH_HLEN + ihl + 4)?;
        Some(Self {
            src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            sport: u16::from_be_bytes([l4[0], l4[1]]),
            dport: u16::from_be_bytes([l4[2], l4[3]]),
            proto: ip[9],
        })
    }
}

/// Offset of the L4 checksum field within the frame.
pub fn l4_checksum_offset(pkt: &[u8]) -> usize {
    let l4 = ETH_HLEN + (pkt[ETH_HLEN] & 0x0f) as usize * 4;
    if pkt[ETH_HLEN + 9] == proto::TCP {
        l4 + 16
    } else {
        l4 + 6
    }
}

/// Recomputes the IPv4 header and TCP/UDP checksums in place.
pub fn fix_checksums(pkt: &mut [u8]) {
    let ihl = (pkt[ETH_HLEN] & 0x0f) as usize * 4;
    pkt[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
    let ip_sum = checksum(&[&pkt[ETH_HLEN..ETH_HLEN + ihl]]);
    pkt[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&ip_sum.to_be_bytes());
    let off = l4_checksum_offset(pkt);
    pkt[off..off + 2].fill(0);
    let mut sum = l4_checksum(pkt);
    if sum == 0 && pkt[ETH_HLEN + 9] == proto::UDP {
        sum = 0xffff;
    }
    pkt[off..off + 2].copy_from_slice(&sum.to_be_bytes());
}

/// True when the IPv4 header checksum and the L4 checksum (a zero UDP
/// checksum meaning "none" counts as valid) both verify.
pub fn checksums_valid(pkt: &[u8]) -> bool {
    let ihl = (pkt[ETH_HLEN] & 0x0f) as usize * 4;
    let ip_ok = checksum(&[&pkt[ETH_HLEN..ETH_HLEN + ihl]]) == 0;
    let off = l4_checksum_offset(pkt);
    let udp_none = pkt[ETH_HLEN + 9] == proto::UDP && pkt[off..off + 2] == [0, 0];
    ip_ok && (udp_none || l4_checksum(pkt) == 0)
}

fn l4_checksum(pkt: &[u8]) -> u16 {
    let ip = &pkt[ETH_HLEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let l4 = &ip[ihl..total];
    let mut pseudo = [0u8; 12];
    pseudo[0..8].copy_from_slice(&ip[12..20]);
    pseudo[9] = ip[9];
    pseudo[10..12].copy_from_slice(&(l4.len() as u16).to_be_bytes());
    checksum(&[&pseudo, l4])
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
        for f in [
            Frame::tcp(
                Ipv4Addr::new(198, 18, 0, 1),
                40000,
                Ipv4Addr::new(198, 19, 0, 1),
                80,
            ),
            Frame::udp(
                Ipv4Addr::new(198, 18, 0, 1),
                40000,
                Ipv4Addr::new(198, 19, 0, 1),
                53,
            ),
        ] {
            let pkt = f.build(b"hello");
            assert!(checksums_valid(&pkt));
            assert_eq!(Frame::parse(&pkt), Some(f));
            let mut broken = pkt.clone();
            *broken.last_mut().unwrap() ^= 0xff;
            assert!(!checksums_valid(&broken));
        }
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
