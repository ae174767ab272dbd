//! TC: address and port rewrites.
//!
//! The L4 checksum is updated by the kernel's helper (`bpf_l4_csum_replace`,
//! given the difference of the addresses and that of the ports): it also
//! keeps `skb->csum` right for CHECKSUM_COMPLETE, and leaves a
//! CHECKSUM_PARTIAL packet's field (the pseudo-header sum of a local
//! socket's packet) changed by the addresses only. The IPv4 header, ports
//! and MACs are written in place: a change that the checksum it lies under
//! absorbs leaves `skb->csum` as it was. IPv6 has no header checksum to
//! absorb its addresses: their difference goes into `skb->csum` with
//! `bpf_csum_update` (see [`nat_rewrite6`]).

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    helpers::bpf_csum_update,
    programs::TcContext,
};
use proxy_common::{Counter, V6, proto};

use crate::{
    csum,
    flow::Rewrite,
    frame::Frame,
    ip::Ip,
    packet::{MAX_L4_OFF, Packet},
    sctp,
};

/// Rewrites `pkt` to `out`.
///
/// Two helper calls at most for IPv4: the address changes enter the L4
/// checksum as one difference (`BPF_F_PSEUDO_HDR`, size 0), the port
/// changes as another; the addresses and ports are written in place first
/// (see the module documentation). IPv6 does the same in [`nat_rewrite6`].
#[inline(always)]
pub fn apply<F: Ip>(ctx: &TcContext, pkt: &Packet<F>, out: &Rewrite<F>) -> Result<(), Counter> {
    // A later fragment has no L4 header (its datagram's checksum, in the
    // first fragment, covered the addresses): the addresses alone, in IPv4
    // with the IP header's checksum.
    if pkt.later_fragment {
        if F::HDR_CSUM_OFF.is_none() {
            return apply_ipv6(ctx, pkt, out, 0);
        }
        if pkt.saddr_be != out.saddr_be || pkt.daddr_be != out.daddr_be {
            rewrite_ipv4_addresses(ctx, pkt, out)?;
        }
        return Ok(());
    }
    if pkt.proto == proto::SCTP {
        return apply_sctp(ctx, pkt, out);
    }
    // A zero UDP checksum means "none" and must stay zero.
    let mangled = if pkt.proto == proto::UDP {
        BPF_F_MARK_MANGLED_0
    } else {
        0
    };
    if F::HDR_CSUM_OFF.is_none() {
        return apply_ipv6(ctx, pkt, out, mangled);
    }
    let failed = |_| Counter::DropRewriteFailed;
    let csum_off = pkt.l4_csum_off();
    let new_saddr = pkt.saddr_be != out.saddr_be;
    let new_daddr = pkt.daddr_be != out.daddr_be;
    let readdressed = new_saddr || new_daddr;
    let (old_ports, new_ports) = ([pkt.sport_be, pkt.dport_be], [out.sport_be, out.dport_be]);
    let new_port_pair = old_ports != new_ports;
    // Written in place before any helper call (which would invalidate the
    // packet's pointers).
    if readdressed {
        rewrite_ipv4_addresses(ctx, pkt, out)?;
    }
    if new_port_pair {
        write_at(ctx, pkt.l4_off, &new_ports)?;
    }
    if readdressed {
        let mut diff = 0u32;
        if new_saddr {
            diff = add_diff::<F>(diff, &pkt.saddr_be, &out.saddr_be);
        }
        if new_daddr {
            diff = add_diff::<F>(diff, &pkt.daddr_be, &out.daddr_be);
        }
        ctx.l4_csum_replace(
            csum_off,
            0,
            diff as u64,
            (BPF_F_PSEUDO_HDR | mangled) as u64,
        )
        .map_err(failed)?;
    }
    if new_port_pair {
        ctx.l4_csum_replace(
            csum_off,
            0,
            ports_diff(old_ports, new_ports) as u64,
            mangled as u64,
        )
        .map_err(failed)?;
    }
    Ok(())
}

/// IPv6: the job goes to [`nat_rewrite6`] through scratch memory.
#[inline(always)]
fn apply_ipv6<F: Ip>(
    ctx: &TcContext,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
    mangled: u32,
) -> Result<(), Counter> {
    let job = &mut F::scratch().ok_or(Counter::DropRewriteFailed)?.rewrite;
    job.to = *out;
    job.l4_off = pkt.l4_off as u32;
    job.csum_off = pkt.l4_csum_off() as u32;
    job.csum_flags = mangled;
    job.addresses_only = pkt.later_fragment as u32;
    match nat_rewrite6(ctx.skb.skb) {
        0 => Ok(()),
        REWRITE_MALFORMED => Err(Counter::DropMalformed),
        _ => Err(Counter::DropRewriteFailed),
    }
}

/// [`nat_rewrite6`]'s answer when the packet is shorter than its job says.
const REWRITE_MALFORMED: i32 = 1;
/// [`nat_rewrite6`]'s answer when a helper failed or scratch memory is missing.
const REWRITE_FAILED: i32 = 2;

/// The IPv6 rewrite in `Scratch::rewrite` (the old tuple is the packet's
/// own): addresses and ports written in place, then the checksum helpers.
/// A global function, checked by the verifier once rather than on every
/// path of the program that reaches a rewrite: inlined, the same writes
/// made `tc_from_pod` cost 143,000 verified instructions (a 50,000-service
/// start 0.7 s longer); here 95,900, against 91,400 with the helper's
/// stores. 0, [`REWRITE_MALFORMED`] or [`REWRITE_FAILED`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn nat_rewrite6(skb: *mut __sk_buff) -> i32 {
    let ctx = TcContext::new(skb);
    match rewrite6(&ctx) {
        Ok(()) => 0,
        Err(Counter::DropMalformed) => REWRITE_MALFORMED,
        Err(_) => REWRITE_FAILED,
    }
}

// This frame sits on top of `tc_packet`'s (432 bytes of the 512).
#[inline(always)]
fn rewrite6(ctx: &TcContext) -> Result<(), Counter> {
    let job = &V6::scratch().ok_or(Counter::DropRewriteFailed)?.rewrite;
    // The bound the verifier needs for the offset read back from scratch
    // memory; `packet::parse6` passes packets beyond it on untouched.
    if job.l4_off > MAX_L4_OFF as u32 {
        return Err(Counter::DropMalformed);
    }
    let mut addr_diff = 0u32;
    let mut readdressed = false;
    for (off, new) in [
        (V6::SADDR_OFF, &job.to.saddr_be),
        (V6::DADDR_OFF, &job.to.daddr_be),
    ] {
        let at = ctx
            .ptr_at::<[u32; 4]>(off)
            .ok_or(Counter::DropMalformed)?
            .cast::<u32>();
        for (i, word) in new.iter().enumerate() {
            // SAFETY: bounds-checked by ptr_at; packet memory has no
            // alignment to keep.
            let old = unsafe { at.add(i).read_unaligned() };
            if old != *word {
                addr_diff = csum::add_u32(csum::add_u32(addr_diff, !old), *word);
                // SAFETY: as above.
                unsafe { at.add(i).write_unaligned(*word) };
                readdressed = true;
            }
        }
    }
    if job.addresses_only != 0 {
        // A later fragment: no L4 checksum to carry the difference, and no
        // IPv6 header checksum to absorb it; CHECKSUM_COMPLETE's sum takes it
        // (an error for other packets, ignored).
        if readdressed {
            // SAFETY: the program's own context.
            let _ = unsafe { bpf_csum_update(ctx.skb.skb, addr_diff) };
        }
        return Ok(());
    }
    let ports = ctx
        .ptr_at::<[u16; 2]>(job.l4_off as usize)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked by ptr_at; packet memory has no alignment to keep.
    let old_ports = unsafe { ports.read_unaligned() };
    let new_ports = [job.to.sport_be, job.to.dport_be];
    let new_port_pair = old_ports != new_ports;
    let port_diff = if new_port_pair {
        // SAFETY: as above.
        unsafe { ports.write_unaligned(new_ports) };
        ports_diff(old_ports, new_ports)
    } else {
        0
    };
    let failed = |_| Counter::DropRewriteFailed;
    let (csum_off, flags) = (job.csum_off as usize, job.csum_flags);
    if readdressed {
        // CHECKSUM_COMPLETE: the helper below takes the address difference
        // out of `skb->csum` with the checksum field's change, as IPv4 needs
        // (its header checksum absorbs the addresses). No IPv6 header
        // checksum does: this puts it back first. (The helper's newer
        // `BPF_F_IPV6` says the same, but kernels without the 2025 fix
        // refuse it.) Other packets: an error, ignored.
        // SAFETY: the program's own context.
        let _ = unsafe { bpf_csum_update(ctx.skb.skb, addr_diff) };
        ctx.l4_csum_replace(
            csum_off,
            0,
            addr_diff as u64,
            (BPF_F_PSEUDO_HDR | flags) as u64,
        )
        .map_err(failed)?;
    }
    if new_port_pair {
        ctx.l4_csum_replace(csum_off, 0, port_diff as u64, flags as u64)
            .map_err(failed)?;
    }
    Ok(())
}

/// The checksum difference of the port pair changing from `old` to `new`.
#[inline(always)]
fn ports_diff(old: [u16; 2], new: [u16; 2]) -> u32 {
    let (old, new) = (ports_word(old), ports_word(new));
    csum::add_u32(csum::add_u32(0, !old), new)
}

/// Writes `value` at `offset` of the packet, in place.
#[inline(always)]
fn write_at<T: Copy>(ctx: &TcContext, offset: usize, value: &T) -> Result<(), Counter> {
    let at = ctx.ptr_at::<T>(offset).ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked by ptr_at; packet memory has no alignment to keep.
    unsafe { at.write_unaligned(*value) };
    Ok(())
}

/// `diff` plus the checksum difference of an address changing from `old` to `new`.
#[inline(always)]
fn add_diff<F: Ip>(mut diff: u32, old: &F::Addr, new: &F::Addr) -> u32 {
    let (old_words, new_words) = (F::addr_words(old), F::addr_words(new));
    for i in 0..old_words.len() {
        diff = csum::add_u32(csum::add_u32(diff, !old_words[i]), new_words[i]);
    }
    diff
}

/// The two ports as the 32-bit word they make in memory.
#[inline(always)]
fn ports_word(ports: [u16; 2]) -> u32 {
    let [a, b] = [ports[0].to_ne_bytes(), ports[1].to_ne_bytes()];
    u32::from_ne_bytes([a[0], a[1], b[0], b[1]])
}

/// IPv4: the header checksum and both addresses written in place, the
/// checksum updated for what changed.
#[inline(always)]
fn rewrite_ipv4_addresses<F: Ip>(
    ctx: &TcContext,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
) -> Result<(), Counter> {
    let hdr = ctx
        .ptr_at::<[u16; 5]>(F::HOP_OFF + 2)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked by ptr_at (words 5-9 of the header: checksum,
    // source, destination).
    let hdr = unsafe { &mut *hdr };
    let (saddr, daddr) = (
        F::addr_words(&out.saddr_be)[0],
        F::addr_words(&out.daddr_be)[0],
    );
    let mut check = hdr[0];
    check = csum::replace4(check, F::addr_words(&pkt.saddr_be)[0], saddr);
    check = csum::replace4(check, F::addr_words(&pkt.daddr_be)[0], daddr);
    hdr[0] = check;
    hdr[1] = saddr as u16;
    hdr[2] = (saddr >> 16) as u16;
    hdr[3] = daddr as u16;
    hdr[4] = (daddr >> 16) as u16;
    Ok(())
}

/// Decrements the TTL / hop limit of a packet this node forwards itself,
/// in place (in IPv4 with its header checksum).
#[inline(always)]
pub fn decrement_hop<F: Ip>(ctx: &TcContext, pkt: &Packet<F>) -> Result<(), Counter> {
    if F::HDR_CSUM_OFF.is_none() {
        return write_at(ctx, F::HOP_OFF, &(pkt.ttl - 1));
    }
    let hdr = ctx
        .ptr_at::<[u16; 2]>(F::HOP_OFF)
        .ok_or(Counter::DropMalformed)?;
    // SAFETY: bounds-checked by ptr_at (TTL and protocol, then the checksum).
    let hdr = unsafe { &mut *hdr };
    let decremented = u16::from_ne_bytes([pkt.ttl - 1, pkt.proto]);
    hdr[1] = csum::replace2(hdr[1], hdr[0], decremented);
    hdr[0] = decremented;
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
            let (old_words, new_words) = (F::addr_words(old), F::addr_words(new));
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
