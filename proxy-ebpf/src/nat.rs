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

use crate::{
    flow::Rewrite,
    packet::{IP_CSUM_OFF, IP_DADDR_OFF, IP_SADDR_OFF, Packet},
};

#[inline(always)]
pub fn apply(ctx: &TcContext, pkt: &Packet, out: &Rewrite) -> Result<(), Counter> {
    rewrite(
        ctx,
        pkt,
        (pkt.daddr_be, IP_DADDR_OFF, pkt.dport_be, pkt.l4_off + 2),
        (out.daddr_be, out.dport_be),
    )?;
    rewrite(
        ctx,
        pkt,
        (pkt.saddr_be, IP_SADDR_OFF, pkt.sport_be, pkt.l4_off),
        (out.saddr_be, out.sport_be),
    )
}

#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    pkt: &Packet,
    (old_addr, addr_off, old_port, port_off): (u32, usize, u16, usize),
    (addr_be, port_be): (u32, u16),
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
        ctx.l4_csum_replace(
            csum_off,
            old_addr as u64,
            addr_be as u64,
            BPF_F_PSEUDO_HDR as u64 | mangled | 4,
        )
        .map_err(failed)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, old_addr as u64, addr_be as u64, 4)
            .map_err(failed)?;
        ctx.store(addr_off, &addr_be, 0).map_err(failed)?;
    }
    if old_port != port_be {
        ctx.l4_csum_replace(csum_off, old_port as u64, port_be as u64, mangled | 2)
            .map_err(failed)?;
        ctx.store(port_off, &port_be, 0).map_err(failed)?;
    }
    Ok(())
}
