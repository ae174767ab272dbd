//! XDP: address and port rewrites with incremental checksum updates.
//! Frames from a wire carry complete checksums, so plain RFC 1624 math is right.

use aya_ebpf::programs::XdpContext;
use proxy_common::{Counter, proto};

use crate::{csum, flow::Rewrite, frame::Frame, ip::Ip, packet::Packet, sctp};

#[inline(always)]
pub fn apply<F: Ip>(ctx: &XdpContext, pkt: &Packet<F>, out: &Rewrite<F>) -> Result<(), Counter> {
    // SCTP's CRC32c covers no address: it changes with the ports only.
    let sctp_crc = if pkt.proto == proto::SCTP {
        Some(sctp_checksum(ctx, pkt, out)?)
    } else {
        None
    };
    let saddr = ctx
        .ptr_at::<F::Addr>(F::SADDR_OFF)
        .ok_or(Counter::DropMalformed)?;
    let daddr = ctx
        .ptr_at::<F::Addr>(F::DADDR_OFF)
        .ok_or(Counter::DropMalformed)?;
    let ports = ctx
        .ptr_at::<[u16; 2]>(pkt.l4_off)
        .ok_or(Counter::DropMalformed)?;
    let check = ctx
        .ptr_at::<u16>(pkt.l4_csum_off())
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: all four pointers were bounds-checked above.
    let (saddr, daddr, ports, check) =
        unsafe { (&mut *saddr, &mut *daddr, &mut *ports, &mut *check) };
    let l4_has_csum = sctp_crc.is_none() && !(pkt.proto == proto::UDP && *check == 0);
    let mut l4 = *check;
    let mut ip = 0u32;
    let mut readdressed = false;
    for (addr, new) in [(saddr, &out.saddr_be), (daddr, &out.daddr_be)] {
        if *addr == *new {
            continue;
        }
        let (old_words, new_words) = (F::addr_words(addr), F::addr_words(new));
        for i in 0..old_words.len() {
            l4 = csum::replace4(l4, old_words[i], new_words[i]);
            ip = csum::add_u32(csum::add_u32(ip, !old_words[i]), new_words[i]);
        }
        *addr = *new;
        readdressed = true;
    }
    if let (true, Some(ip_csum_off)) = (readdressed, F::HDR_CSUM_OFF) {
        let ip_check = ctx
            .ptr_at::<u16>(ip_csum_off)
            .ok_or(Counter::DropMalformed)?;
        // SAFETY: bounds-checked above.
        let ip_check = unsafe { &mut *ip_check };
        *ip_check = !csum::fold((!*ip_check) as u32 + csum::fold(ip) as u32);
    }
    if ports[0] != out.sport_be {
        l4 = csum::replace2(l4, ports[0], out.sport_be);
        ports[0] = out.sport_be;
    }
    if ports[1] != out.dport_be {
        l4 = csum::replace2(l4, ports[1], out.dport_be);
        ports[1] = out.dport_be;
    }
    if let Some(crc) = sctp_crc {
        let field = ctx
            .ptr_at::<[u8; 4]>(pkt.l4_csum_off())
            .ok_or(Counter::DropMalformed)?;
        // SAFETY: bounds-checked above.
        unsafe { *field = crc };
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

/// The CRC32c field an SCTP packet gets with `out`'s ports.
// A BPF-to-BPF call: the CRC update's loops stay out of the caller's frame.
#[inline(never)]
fn sctp_checksum<F: Ip>(
    ctx: &XdpContext,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
) -> Result<[u8; 4], Counter> {
    let len = pkt.l4_len().ok_or(Counter::DropMalformed)?;
    let field = ctx
        .ptr_at::<[u8; 4]>(pkt.l4_csum_off())
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked above.
    let stored = unsafe { *field };
    Ok(sctp::checksum_after(
        stored,
        len,
        [pkt.sport_be, pkt.dport_be],
        [out.sport_be, out.dport_be],
    ))
}

/// Decrements the TTL / hop limit of a packet this node forwards itself.
#[inline(always)]
pub fn decrement_hop<F: Ip>(ctx: &XdpContext) -> Result<(), Counter> {
    let hop = ctx.ptr_at::<u8>(F::HOP_OFF).ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked above.
    let hop = unsafe { &mut *hop };
    if let Some(ip_csum_off) = F::HDR_CSUM_OFF {
        // In IPv4 the TTL is the high byte of its 16-bit checksum word.
        let check = ctx
            .ptr_at::<u16>(ip_csum_off)
            .ok_or(Counter::DropMalformed)?;
        // SAFETY: bounds-checked above.
        let check = unsafe { &mut *check };
        *check = csum::replace2(
            *check,
            u16::from_ne_bytes([*hop, 0]),
            u16::from_ne_bytes([hop.wrapping_sub(1), 0]),
        );
    }
    *hop = hop.wrapping_sub(1);
    Ok(())
}
