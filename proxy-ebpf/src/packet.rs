//! Bounds-checked parsing of Ethernet / IPv4 / TCP|UDP headers, done once per packet.

use aya_ebpf::programs::TcContext;
use proxy_common::{Counter, proto};

pub const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
pub const IP_SADDR_OFF: usize = ETH_HLEN + 12;
pub const IP_DADDR_OFF: usize = ETH_HLEN + 16;
pub const IP_CSUM_OFF: usize = ETH_HLEN + 10;

/// The 5-tuple and header offsets of an IPv4 TCP/UDP packet (network byte order).
pub struct Packet {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    pub l4_off: usize,
}

impl Packet {
    /// Offset of the L4 checksum field.
    pub fn l4_csum_off(&self) -> usize {
        if self.proto == proto::TCP {
            self.l4_off + 16
        } else {
            self.l4_off + 6
        }
    }
}

#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    if start + offset + core::mem::size_of::<T>() > ctx.data_end() {
        return None;
    }
    Some((start + offset) as *const T)
}

#[repr(C)]
struct Ipv4Hdr {
    ver_ihl: u8,
    tos: u8,
    tot_len: u16,
    id: u16,
    frag_off: u16,
    ttl: u8,
    proto: u8,
    check: u16,
    saddr: u32,
    daddr: u32,
}

/// `Ok(None)`: not a packet the service datapath handles (pass it on untouched).
/// `Err`: a packet that claims to be IPv4 TCP/UDP but is truncated.
#[inline(always)]
pub fn parse(ctx: &TcContext) -> Result<Option<Packet>, Counter> {
    let Some(ethertype) = ptr_at::<u16>(ctx, 12) else {
        return Ok(None);
    };
    // SAFETY: bounds checked by ptr_at.
    if u16::from_be(unsafe { *ethertype }) != ETH_P_IP {
        return Ok(None);
    }
    let ip = match ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) {
        Some(ip) => ip,
        None => return Err(Counter::DropMalformed),
    };
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
    if ihl < 20 {
        return Err(Counter::DropMalformed);
    }
    let l4_off = ETH_HLEN + ihl;
    let (saddr_be, daddr_be, proto) = (ip.saddr, ip.daddr, ip.proto);
    // Ports plus the checksum field must be readable: 18 bytes for TCP, 8 for UDP.
    let l4_need = if proto == proto::TCP { 18 } else { 8 };
    if ctx.data() + l4_off + l4_need > ctx.data_end() {
        return Err(Counter::DropMalformed);
    }
    let ports = ptr_at::<[u16; 2]>(ctx, l4_off).ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds checked by ptr_at.
    let [sport_be, dport_be] = unsafe { *ports };
    Ok(Some(Packet {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto,
        l4_off,
    }))
}
