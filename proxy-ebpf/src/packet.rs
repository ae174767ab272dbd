//! Bounds-checked parsing of Ethernet / IPv4 / TCP|UDP headers, done once per packet.

use proxy_common::{Counter, proto};

use crate::frame::Frame;

pub const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
pub const IP_TTL_OFF: usize = ETH_HLEN + 8;
pub const IP_SADDR_OFF: usize = ETH_HLEN + 12;
pub const IP_DADDR_OFF: usize = ETH_HLEN + 16;
pub const IP_CSUM_OFF: usize = ETH_HLEN + 10;

pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

/// The 5-tuple and header facts of an IPv4 TCP/UDP packet (network byte order).
#[derive(Clone, Copy)]
pub struct Packet {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// TCP flags; 0 for UDP.
    pub tcp_flags: u8,
    pub ihl: u8,
    pub ttl: u8,
    pub tot_len: u16,
    pub l4_off: usize,
}

impl Packet {
    /// The packet's 5-tuple, for monitor events.
    #[inline(always)]
    pub fn tuple(&self) -> crate::monitor::Tuple {
        crate::monitor::Tuple {
            saddr_be: self.saddr_be,
            daddr_be: self.daddr_be,
            sport_be: self.sport_be,
            dport_be: self.dport_be,
            proto: self.proto,
        }
    }

    /// Offset of the L4 checksum field.
    #[inline(always)]
    pub fn l4_csum_off(&self) -> usize {
        if self.proto == proto::TCP {
            self.l4_off + 16
        } else {
            self.l4_off + 6
        }
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

/// `Ok(None)`: not a packet the service datapath handles (pass it on untouched).
/// `Err`: a packet that claims to be IPv4 TCP/UDP but is truncated.
#[inline(always)]
pub fn parse<F: Frame>(ctx: &F) -> Result<Option<Packet>, Counter> {
    let Some(ethertype) = ctx.ptr_at::<u16>(12) else {
        return Ok(None);
    };
    // SAFETY: bounds checked by ptr_at.
    if u16::from_be(unsafe { *ethertype }) != ETH_P_IP {
        return Ok(None);
    }
    let ip = ctx
        .ptr_at::<Ipv4Hdr>(ETH_HLEN)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.proto != proto::TCP && ip.proto != proto::UDP {
        return Ok(None);
    }
    // Later fragments carry no L4 header; they are left to the kernel.
    if u16::from_be(ip.frag_off) & 0x1fff != 0 {
        return Ok(None);
    }
    let ihl = (ip.ver_ihl & 0x0f) as usize * 4;
    // As the kernel's ip_rcv: a header that is not IPv4 or shorter than its
    // minimum is dropped, never translated.
    if ip.ver_ihl >> 4 != 4 || ihl < 20 {
        return Err(Counter::DropMalformed);
    }
    let l4_off = ETH_HLEN + ihl;
    let (saddr_be, daddr_be, proto, ttl, tot_len) = (
        ip.saddr,
        ip.daddr,
        ip.proto,
        ip.ttl,
        u16::from_be(ip.tot_len),
    );
    // Ports plus the checksum field must be readable: 18 bytes for TCP, 8 for UDP.
    let l4_need = if proto == proto::TCP { 18 } else { 8 };
    // ... and inside the datagram the header declares. A total length of 0
    // is a BIG TCP aggregate (the length is the skb's), and the bytes
    // beyond the linear data of a GRO packet are not in view: only the
    // lower bound can be checked here.
    if tot_len != 0 && (tot_len as usize) < ihl + l4_need {
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
    let tcp_flags = if proto == proto::TCP {
        let flags = ctx
            .ptr_at::<u8>(l4_off + 13)
            .ok_or(Counter::DropMalformed)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { *flags }
    } else {
        0
    };
    Ok(Some(Packet {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto,
        tcp_flags,
        ihl: ihl as u8,
        ttl,
        tot_len,
        l4_off,
    }))
}
