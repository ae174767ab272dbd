//! TC: address and port rewrites with the kernel's checksum helpers.
//!
//! The helpers are used (not hand-written checksum math) because they also
//! keep `skb->csum` right for CHECKSUM_COMPLETE and leave the pseudo-header
//! sum right for CHECKSUM_PARTIAL packets from local sockets.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use proxy_common::{Counter, proto};

use crate::{flow::Rewrite, ip::Ip, packet::Packet};

#[inline(always)]
pub fn apply<F: Ip>(ctx: &TcContext, pkt: &Packet<F>, out: &Rewrite<F>) -> Result<(), Counter> {
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
