//! XDP: address and port rewrites with incremental checksum updates.
//! Frames from a wire carry complete checksums, so plain RFC 1624 math is right.

use aya_ebpf::programs::XdpContext;
use proxy_common::{Counter, proto};

use crate::{
    csum,
    flow::Rewrite,
    frame::Frame,
    packet::{ETH_HLEN, Ipv4Hdr, Packet},
};

#[inline(always)]
pub fn apply(ctx: &XdpContext, pkt: &Packet, out: &Rewrite) -> Result<(), Counter> {
    let ip = ctx
        .ptr_at::<Ipv4Hdr>(ETH_HLEN)
        .ok_or(Counter::DropMalformed)?;
    let ports = ctx
        .ptr_at::<[u16; 2]>(pkt.l4_off)
        .ok_or(Counter::DropMalformed)?;
    let check = ctx
        .ptr_at::<u16>(pkt.l4_csum_off())
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: all three pointers were bounds-checked above.
    let (ip, ports, check) = unsafe { (&mut *ip, &mut *ports, &mut *check) };
    let l4_has_csum = !(pkt.proto == proto::UDP && *check == 0);
    let mut l4 = *check;
    if ip.saddr != out.saddr_be {
        ip.check = csum::replace4(ip.check, ip.saddr, out.saddr_be);
        l4 = csum::replace4(l4, ip.saddr, out.saddr_be);
        ip.saddr = out.saddr_be;
    }
    if ip.daddr != out.daddr_be {
        ip.check = csum::replace4(ip.check, ip.daddr, out.daddr_be);
        l4 = csum::replace4(l4, ip.daddr, out.daddr_be);
        ip.daddr = out.daddr_be;
    }
    if ports[0] != out.sport_be {
        l4 = csum::replace2(l4, ports[0], out.sport_be);
        ports[0] = out.sport_be;
    }
    if ports[1] != out.dport_be {
        l4 = csum::replace2(l4, ports[1], out.dport_be);
        ports[1] = out.dport_be;
    }
    if l4_has_csum {
        // In UDP a computed 0 is sent as all ones; 0 would mean "no checksum".
        *check = if pkt.proto == proto::UDP && l4 == 0 {
            0xffff
        } else {
            l4
        };
    }
    Ok(())
}

/// Decrements the TTL of a packet this node forwards itself.
#[inline(always)]
pub fn decrement_ttl(ctx: &XdpContext) -> Result<(), Counter> {
    let ip = ctx
        .ptr_at::<Ipv4Hdr>(ETH_HLEN)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked above.
    let ip = unsafe { &mut *ip };
    // TTL and protocol share one 16-bit word of the header.
    let old = u16::from_ne_bytes([ip.ttl, ip.proto]);
    ip.ttl -= 1;
    let new = u16::from_ne_bytes([ip.ttl, ip.proto]);
    ip.check = csum::replace2(ip.check, old, new);
    Ok(())
}
