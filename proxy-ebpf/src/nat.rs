//! TC: address and port rewrites with the kernel's checksum helpers.
//!
//! The helpers are used (not hand-written checksum math) because they also
//! keep `skb->csum` right for CHECKSUM_COMPLETE and leave the pseudo-header
//! sum right for CHECKSUM_PARTIAL packets from local sockets.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    programs::TcContext,
};
use proxy_common::{Counter, proto};

use crate::{flow::Rewrite, ip::Ip, packet::Packet, sctp};

#[inline(always)]
pub fn apply<F: Ip>(ctx: &TcContext, pkt: &Packet<F>, out: &Rewrite<F>) -> Result<(), Counter> {
    if pkt.proto == proto::SCTP {
        return apply_sctp(ctx, pkt, out);
    }
    rewrite(
        ctx,
        pkt,
        (&pkt.daddr_be, F::DADDR_OFF, pkt.dport_be, pkt.l4_off + 2),
        (&out.daddr_be, out.dport_be),
    )?;
    rewrite(
        ctx,
        pkt,
        (&pkt.saddr_be, F::SADDR_OFF, pkt.sport_be, pkt.l4_off),
        (&out.saddr_be, out.sport_be),
    )
}

#[inline(always)]
fn rewrite<F: Ip>(
    ctx: &TcContext,
    pkt: &Packet<F>,
    (old_addr, addr_off, old_port, port_off): (&F::Addr, usize, u16, usize),
    (addr_be, port_be): (&F::Addr, u16),
) -> Result<(), Counter> {
    // A zero UDP checksum means "none" and must stay zero.
    let mangled = if pkt.proto == proto::UDP {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    };
    let csum_off = pkt.l4_csum_off();
    let failed = |_| Counter::DropRewriteFailed;
    if old_addr != addr_be {
        // Word by word: the helpers take 4-byte differences; in IPv6 the
        // words an address shares with the old one (its prefix) cost nothing.
        let (old_words, new_words) = (F::words(old_addr), F::words(addr_be));
        for i in 0..old_words.len() {
            let (old, new) = (old_words[i], new_words[i]);
            if old == new {
                continue;
            }
            ctx.l4_csum_replace(
                csum_off,
                old as u64,
                new as u64,
                BPF_F_PSEUDO_HDR as u64 | mangled | 4,
            )
            .map_err(failed)?;
            if let Some(ip_csum_off) = F::HDR_CSUM_OFF {
                ctx.l3_csum_replace(ip_csum_off, old as u64, new as u64, 4)
                    .map_err(failed)?;
            }
        }
        ctx.store(addr_off, addr_be, 0).map_err(failed)?;
    }
    if old_port != port_be {
        ctx.l4_csum_replace(csum_off, old_port as u64, port_be as u64, mangled | 2)
            .map_err(failed)?;
        ctx.store(port_off, &port_be, 0).map_err(failed)?;
    }
    Ok(())
}

/// SCTP: no pseudo-header in its CRC32c, so an address rewrite touches only
/// the IPv4 header checksum; the ports and the CRC32c are written together.
/// The stores keep `skb->csum` right for CHECKSUM_COMPLETE packets.
// A BPF-to-BPF call: the CRC update's loops stay out of the caller's frame.
#[inline(never)]
fn apply_sctp<F: Ip>(ctx: &TcContext, pkt: &Packet<F>, out: &Rewrite<F>) -> Result<(), Counter> {
    let failed = |_| Counter::DropRewriteFailed;
    let len = pkt.l4_len().ok_or(Counter::DropMalformed)?;
    for (old, new, off) in [
        (&pkt.saddr_be, &out.saddr_be, F::SADDR_OFF),
        (&pkt.daddr_be, &out.daddr_be, F::DADDR_OFF),
    ] {
        if old == new {
            continue;
        }
        if let Some(ip_csum_off) = F::HDR_CSUM_OFF {
            let (old_words, new_words) = (F::words(old), F::words(new));
            for i in 0..old_words.len() {
                ctx.l3_csum_replace(ip_csum_off, old_words[i] as u64, new_words[i] as u64, 4)
                    .map_err(failed)?;
            }
        }
        ctx.store(off, new, BPF_F_RECOMPUTE_CSUM as u64)
            .map_err(failed)?;
    }
    let (old, new) = ([pkt.sport_be, pkt.dport_be], [out.sport_be, out.dport_be]);
    if old == new {
        return Ok(());
    }
    let stored: [u8; 4] = ctx.load(pkt.l4_csum_off()).map_err(failed)?;
    let crc = sctp::checksum_after(stored, len, old, new);
    ctx.store(pkt.l4_off, &new, BPF_F_RECOMPUTE_CSUM as u64)
        .map_err(failed)?;
    ctx.store(pkt.l4_csum_off(), &crc, BPF_F_RECOMPUTE_CSUM as u64)
        .map_err(failed)
}
