//! Bounds-checked parsing of Ethernet / IPv4 or IPv6 / TCP|UDP|SCTP headers,
//! done once per packet.

use proxy_common::{
    Counter, Family, V4, V6,
    fragment::{FragKey, FragKey6, FragPorts},
    proto,
};

use crate::{frame::Frame, ip::Ip};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;

pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

/// The 5-tuple and header facts of a TCP/UDP/SCTP packet (network byte order).
#[derive(Clone, Copy)]
pub struct Packet<F: Family> {
    pub saddr_be: F::Addr,
    pub daddr_be: F::Addr,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// TCP flags; for SCTP those its first chunk stands for
    /// ([`crate::sctp::conntrack_flags`]); 0 for UDP.
    pub tcp_flags: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// The IP datagram's length, headers included; 0 when the header does
    /// not say (BIG TCP, jumbograms).
    pub tot_len: u32,
    pub l4_off: usize,
    /// A later fragment of an IPv4 datagram: its ports are the first
    /// fragment's (`FRAGMENTS`), and it has no L4 header to rewrite.
    pub later_fragment: bool,
}

impl<F: Ip> Packet<F> {
    /// Offset of the L4 checksum field (SCTP's is a CRC32c of 4 bytes).
    #[inline(always)]
    pub fn l4_csum_off(&self) -> usize {
        match self.proto {
            proto::TCP => self.l4_off + 16,
            proto::SCTP => self.l4_off + crate::sctp::CSUM_OFF,
            _ => self.l4_off + 6,
        }
    }

    /// Bytes of L4 (header and payload), when the IP header says.
    #[inline(always)]
    pub fn l4_len(&self) -> Option<u32> {
        (self.tot_len != 0).then(|| self.tot_len.saturating_sub(self.l3_len() as u32))
    }

    /// Bytes of IP header (extension headers included) before L4.
    #[inline(always)]
    pub fn l3_len(&self) -> usize {
        self.l4_off - ETH_HLEN
    }
}

/// The address family an Ethernet frame carries, if it is IP.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    V4,
    V6,
    Other,
}

#[inline(always)]
pub fn l3_of<C: Frame>(ctx: &C) -> L3 {
    let Some(ethertype) = ctx.ptr_at::<u16>(12) else {
        return L3::Other;
    };
    // SAFETY: bounds checked by ptr_at.
    match u16::from_be(unsafe { *ethertype }) {
        ETH_P_IP => L3::V4,
        ETH_P_IPV6 => L3::V6,
        _ => L3::Other,
    }
}

#[repr(C)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag_off: u16,
    pub ttl: u8,
    pub proto: u8,
    pub check: u16,
    pub saddr: u32,
    pub daddr: u32,
}

#[repr(C)]
pub struct Ipv6Hdr {
    pub ver_tc_flow: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
}

/// Extension headers walked before giving up (and passing the packet).
pub const MAX_EXT_HEADERS: usize = 4;
/// The furthest an IPv6 L4 header may start (a frame offset) for the
/// packet to be translated: the rewrite (`nat::rewrite6`) needs a bound the
/// verifier can check. Past it, extension headers (each up to 2 KiB) leave
/// the packet to the kernel untouched, as headers not walked do: it must
/// not open a flow the rewrite then refuses.
pub const MAX_L4_OFF: usize = 1024;

mod ext {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const ESP: u8 = 50;
    pub const AUTH: u8 = 51;
    pub const DEST_OPTS: u8 = 60;
}

/// Parses the IP packet of a frame [`l3_of`] found to be of family `F`.
/// `Ok(None)`: not a packet the service datapath handles (pass it on
/// untouched). `Err`: one that claims to be TCP/UDP but is truncated or
/// malformed.
#[inline(always)]
pub fn parse<C: Frame, F: Ip>(ctx: &C) -> Result<Option<Packet<F>>, Counter> {
    F::parse(ctx)
}

#[inline(always)]
pub fn parse4<C: Frame>(ctx: &C) -> Result<Option<Packet<V4>>, Counter> {
    let ip = ctx
        .ptr_at::<Ipv4Hdr>(ETH_HLEN)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if !is_service_proto(ip.proto) {
        return Ok(None);
    }
    let ihl = (ip.ver_ihl & 0x0f) as usize * 4;
    let well_formed = ip.ver_ihl >> 4 == 4 && ihl >= 20;
    let (saddr_be, daddr_be, ttl) = (ip.saddr, ip.daddr, ip.ttl);
    let tot_len = u16::from_be(ip.tot_len) as u32;
    let frag_off = u16::from_be(ip.frag_off);
    // Built only for fragments, which are rare.
    let fragment = || FragKey {
        saddr_be,
        daddr_be,
        id_be: ip.id,
        proto: ip.proto,
        _pad: 0,
    };
    // A later fragment carries no L4 header: the ports its first fragment
    // left, if that passed; else it is left to the kernel.
    if frag_off & IP_OFFSET != 0 {
        // A header that does not fit its packet is the kernel's to drop (a
        // total length of 0 is a GSO aggregate's, never a fragment's).
        let fits = tot_len as usize >= ihl && ctx.data() + ETH_HLEN + ihl <= ctx.data_end();
        if !well_formed || !fits {
            return Ok(None);
        }
        // SAFETY: a plain value of a map the programs only read and insert.
        let Some(ports) = (unsafe { crate::maps::FRAGMENTS.get(&fragment()) }) else {
            return Ok(None);
        };
        let header = (ip.proto, ttl, tot_len, ETH_HLEN + ihl);
        return Ok(Some(later_fragment((saddr_be, daddr_be), header, ports)));
    }
    // As the kernel's ip_rcv: a header that is not IPv4 or shorter than its
    // minimum is dropped, never translated.
    if !well_formed {
        return Err(Counter::DropMalformed);
    }
    let pkt = l4(
        ctx,
        (saddr_be, daddr_be),
        ip.proto,
        ttl,
        tot_len,
        ETH_HLEN + ihl,
    )?;
    if frag_off & IP_MORE_FRAGMENTS != 0 {
        let ports = FragPorts {
            sport_be: pkt.sport_be,
            dport_be: pkt.dport_be,
        };
        // A full table makes room (LRU); a failed insert leaves the later
        // fragments untranslated, as before there was a table.
        let _ = crate::maps::FRAGMENTS.insert(&fragment(), &ports, 0);
    }
    Ok(Some(pkt))
}

/// A later fragment of a datagram whose first fragment left `ports`: its
/// `(protocol, TTL, total length, where its payload starts)`. The offset is
/// not read: a later fragment has no L4 header to rewrite.
#[inline(always)]
fn later_fragment<F: Family>(
    (saddr_be, daddr_be): (F::Addr, F::Addr),
    (proto, ttl, tot_len, l4_off): (u8, u8, u32, usize),
    ports: &FragPorts,
) -> Packet<F> {
    Packet {
        saddr_be,
        daddr_be,
        sport_be: ports.sport_be,
        dport_be: ports.dport_be,
        proto,
        tcp_flags: 0,
        ttl,
        tot_len,
        l4_off,
        later_fragment: true,
    }
}

/// IPv4 `frag_off`: the fragment's offset, and "more fragments follow".
const IP_OFFSET: u16 = 0x1fff;
const IP_MORE_FRAGMENTS: u16 = 0x2000;

#[inline(always)]
pub fn parse6<C: Frame>(ctx: &C) -> Result<Option<Packet<V6>>, Counter> {
    let ip = ctx
        .ptr_at::<Ipv6Hdr>(ETH_HLEN)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    // As the kernel's ipv6_rcv: a header that is not IPv6 is dropped.
    if u32::from_be(ip.ver_tc_flow) >> 28 != 6 {
        return Err(Counter::DropMalformed);
    }
    let (saddr_be, daddr_be, hop_limit) = (ip.saddr, ip.daddr, ip.hop_limit);
    let payload_len = u16::from_be(ip.payload_len) as u32;
    let mut next = ip.next_header;
    let mut off = ETH_HLEN + V6::HDR_LEN;
    let mut walked = 0;
    // A fragment header's identification, the protocol it says follows, and
    // whether this is a later fragment (else a first one, more to follow).
    let mut fragment: Option<(u32, u8, bool)> = None;
    while !is_service_proto(next) {
        match next {
            ext::HOP_BY_HOP | ext::ROUTING | ext::DEST_OPTS | ext::FRAGMENT
                if walked < MAX_EXT_HEADERS => {}
            // More headers than walked; or encrypted; or authenticated,
            // which address translation would break: service traffic
            // perhaps, but not translatable here.
            ext::HOP_BY_HOP
            | ext::ROUTING
            | ext::DEST_OPTS
            | ext::FRAGMENT
            | ext::AUTH
            | ext::ESP => {
                crate::stats::count(Counter::PassUnparsed);
                return Ok(None);
            }
            // ICMPv6 and the rest: not service traffic.
            _ => return Ok(None),
        }
        let hdr = ctx.ptr_at::<[u8; 4]>(off).ok_or(Counter::DropMalformed)?;
        // SAFETY: bounds checked by ptr_at.
        let hdr = unsafe { *hdr };
        if next == ext::FRAGMENT {
            let later = u16::from_be_bytes([hdr[2], hdr[3]]) & 0xfff8 != 0;
            let more = hdr[3] & 1 != 0;
            if later || more {
                // Its identification: what every fragment of the datagram carries.
                let Some(id) = ctx.ptr_at::<u32>(off + 4) else {
                    return if later {
                        Ok(None)
                    } else {
                        Err(Counter::DropMalformed)
                    };
                };
                // SAFETY: bounds checked by ptr_at; packet memory has no
                // alignment to keep.
                fragment = Some((unsafe { id.read_unaligned() }, hdr[0], later));
                // A later fragment carries no L4 header: its ports are its
                // first fragment's (below).
                if later {
                    break;
                }
            }
            // The fragment header is 8 bytes; its second byte is reserved
            // (zero), which lets one length formula serve every header
            // walked (one formula keeps the verifier's paths few).
            if hdr[1] != 0 {
                crate::stats::count(Counter::PassUnparsed);
                return Ok(None);
            }
        }
        next = hdr[0];
        off += (hdr[1] as usize + 1) * 8;
        walked += 1;
    }
    // The key is built in scratch memory: 40 bytes more on the stack of the
    // deepest call chain would not fit.
    let frag_key = |(id_be, proto): (u32, u8)| -> Option<&'static FragKey6> {
        let key = &mut V6::scratch()?.fragment6;
        *key = FragKey6 {
            saddr_be,
            daddr_be,
            id_be,
            proto,
            _pad: [0; 3],
        };
        Some(key)
    };
    if let Some((id, proto, true)) = fragment {
        let key = frag_key((id, proto)).ok_or(Counter::DropMalformed)?;
        // SAFETY: a plain value of a map the programs only read and insert.
        let Some(ports) = (unsafe { crate::maps::FRAGMENTS6.get(key) }) else {
            return Ok(None);
        };
        if !is_service_proto(proto) {
            return Ok(None);
        }
        let tot_len = payload_len + V6::HDR_LEN as u32;
        let header = (proto, hop_limit, tot_len, ETH_HLEN + V6::HDR_LEN);
        return Ok(Some(later_fragment((saddr_be, daddr_be), header, ports)));
    }
    if walked != 0 {
        // Each number of headers walked leaves the verifier its own range
        // for `off`, and it would check the rest of the program once per
        // range (beyond its limit). Read back from memory it does not
        // track, the offset is one unknown value, bounded once.
        let slot = &mut V6::scratch().ok_or(Counter::DropMalformed)?.l4_off;
        // SAFETY: a plain per-CPU u32, written then read back.
        off = unsafe {
            core::ptr::write_volatile(slot, off as u32);
            core::ptr::read_volatile(slot)
        } as usize;
        if off > MAX_L4_OFF {
            crate::stats::count(Counter::PassUnparsed);
            return Ok(None);
        }
    }
    let tot_len = if payload_len == 0 {
        0
    } else {
        payload_len + V6::HDR_LEN as u32
    };
    let pkt = l4(ctx, (saddr_be, daddr_be), next, hop_limit, tot_len, off)?;
    // A first fragment whose header says its L4 follows at once: its later
    // fragments name the same protocol.
    if let Some((id, proto, false)) = fragment
        && proto == pkt.proto
    {
        let ports = FragPorts {
            sport_be: pkt.sport_be,
            dport_be: pkt.dport_be,
        };
        if let Some(key) = frag_key((id, proto)) {
            let _ = crate::maps::FRAGMENTS6.insert(key, &ports, 0);
        }
    }
    Ok(Some(pkt))
}

/// TCP, UDP or SCTP: the protocols of service ports.
#[inline(always)]
fn is_service_proto(p: u8) -> bool {
    p == proto::TCP || p == proto::UDP || p == proto::SCTP
}

/// The L4 part of a packet whose IP header ends at `l4_off`.
#[inline(always)]
fn l4<C: Frame, F: Family>(
    ctx: &C,
    (saddr_be, daddr_be): (F::Addr, F::Addr),
    proto: u8,
    ttl: u8,
    tot_len: u32,
    l4_off: usize,
) -> Result<Packet<F>, Counter> {
    // Ports plus the checksum field must be readable: 18 bytes for TCP, 8
    // for UDP; for SCTP its common header and the first chunk's header.
    let l4_need = match proto {
        proto::TCP => 18,
        proto::SCTP => crate::sctp::COMMON_HLEN + 4,
        _ => 8,
    };
    // ... and inside the datagram the header declares. A total length of 0
    // is a BIG TCP aggregate (the length is the skb's), and the bytes
    // beyond the linear data of a GRO packet are not in view: only the
    // lower bound can be checked here.
    if tot_len != 0 && (tot_len as usize) < l4_off - ETH_HLEN + l4_need {
        return Err(Counter::DropMalformed);
    }
    if ctx.data() + l4_off + l4_need > ctx.data_end() {
        return Err(Counter::DropMalformed);
    }
    let ports = ctx
        .ptr_at::<[u16; 2]>(l4_off)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds checked by ptr_at.
    let [sport_be, dport_be] = unsafe { *ports };
    // TCP's flags, or SCTP's first chunk type.
    let flags_off = match proto {
        proto::TCP => Some(l4_off + 13),
        proto::SCTP => Some(l4_off + crate::sctp::COMMON_HLEN),
        _ => None,
    };
    let tcp_flags = match flags_off {
        Some(off) => {
            let byte = ctx.ptr_at::<u8>(off).ok_or(Counter::DropMalformed)?;
            // SAFETY: bounds checked by ptr_at.
            let byte = unsafe { *byte };
            if proto == proto::SCTP {
                crate::sctp::conntrack_flags(byte)
            } else {
                byte
            }
        }
        None => 0,
    };
    Ok(Packet {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto,
        tcp_flags,
        ttl,
        tot_len,
        l4_off,
        later_fragment: false,
    })
}
