//! Sends translated packets on through the kernel's FIB instead of the
//! stack's forwarding path (and its netfilter hooks).

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup},
    helpers::{bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer},
    programs::{TcContext, XdpContext},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, XDP_DROP, XDP_TX},
    config::iface,
    conntrack::{NextHop, hop_flags},
    proto,
};

use crate::{
    config, conntrack::HopCache, flow::Rewrite, frame::Frame, hops, ip::Ip, maps::IFACES, nat,
    packet::Packet, stats::count, xdp_nat,
};

/// Asks the FIB where `out` goes, for a packet of IP length `len`
/// ([`fib_len`]); the answer is in `params` (scratch memory: the query is 64
/// bytes).
#[inline(always)]
fn lookup<C: Frame, F: Ip>(
    ctx: &C,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
    len: u16,
    params: &mut bpf_fib_lookup,
) -> i64 {
    crate::mem::zero(params);
    params.family = F::AF as u8;
    params.l4_protocol = pkt.proto;
    params.sport = out.sport_be;
    params.dport = out.dport_be;
    // Only an MTU check reads it.
    params.__bindgen_anon_1.tot_len = len;
    params.ifindex = ctx.ifindex();
    F::fib_addrs(params, out.saddr_be, out.daddr_be);
    fib(ctx, params)
}

#[inline(always)]
fn fib<C: Frame>(ctx: &C, params: &mut bpf_fib_lookup) -> i64 {
    // SAFETY: ctx is the program's own context and params lives on the stack.
    unsafe {
        aya_ebpf::helpers::bpf_fib_lookup(
            ctx.as_ptr(),
            params as *mut _,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    }
}

/// The IP total length the FIB's MTU check is asked about: of what leaves
/// the interface. A GSO packet (a local socket's bulk TCP) is split into
/// segments there, so its segments' length is the one that must fit, as the
/// stack's own forwarding checks it; asked about the whole datagram, the FIB
/// would answer "fragmentation needed" and every such packet would take the
/// stack's forwarding path after its translation.
#[inline(always)]
fn fib_len<C: Frame, F: Ip>(ctx: &C, pkt: &Packet<F>) -> u16 {
    let gso_size = ctx.gso_size();
    if gso_size != 0
        && let Some(l4_header) = l4_header_len(ctx, pkt)
    {
        let segment = pkt.l3_len() as u32 + l4_header + gso_size.min(u16::MAX as u32);
        return segment.min(u16::MAX as u32) as u16;
    }
    // A datagram beyond 64 KiB is a GSO one.
    pkt.tot_len.min(u16::MAX as u32) as u16
}

/// A GSO segment's L4 header length: TCP's data offset, UDP's 8 bytes;
/// `None` for SCTP, whose segments are its chunks (`GSO_BY_FRAGS`), of
/// lengths only the stack can tell.
#[inline(always)]
fn l4_header_len<C: Frame, F: Ip>(ctx: &C, pkt: &Packet<F>) -> Option<u32> {
    match pkt.proto {
        proto::TCP => {
            // The data offset is the high nibble of byte 12. Two bytes are
            // read: the bound check of a one-byte read compiles to a
            // comparison the verifier cannot take as a bound.
            let word = ctx.ptr_at::<[u8; 2]>(pkt.l4_off + 12)?;
            // SAFETY: bounds-checked by ptr_at.
            Some(((unsafe { (*word)[0] } >> 4) as u32) * 4)
        }
        proto::UDP => Some(8),
        _ => None,
    }
}

/// Where a translated packet goes.
enum Route {
    /// Out of `ifindex`, to `dmac` from `smac`; with [`hop_flags`].
    Hop {
        ifindex: u32,
        dmac: [u8; 6],
        smac: [u8; 6],
        flags: u16,
    },
    /// Out of `ifindex`, whose neighbour is not resolved yet.
    Unresolved(u32),
    /// A local or unreachable destination, or a packet too long for the
    /// route: the stack's job.
    Stack,
}

impl Route {
    #[inline(always)]
    fn of(hop: &NextHop) -> Self {
        Route::Hop {
            ifindex: hop.out_ifindex,
            dmac: hop.dmac,
            smac: hop.smac,
            flags: hop.flags,
        }
    }
}

/// The route of `out`, arriving on the program's interface: the flow's
/// cached next hop (`hop`), else (unless the flow's refresh is due) the one
/// cached for its destination while the family's routing depends on nothing
/// else ([`hops`]), else the FIB's answer, which both caches then keep.
#[inline(always)]
fn route<C: Frame, F: Ip>(
    ctx: &C,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
    hop: Option<HopCache>,
) -> Route {
    let ifindex = ctx.ifindex();
    let len = fib_len(ctx, pkt);
    if let Some(cached) = hop.and_then(|h| h.get(ifindex, len)) {
        count(Counter::NextHopCached);
        return Route::of(cached);
    }
    let by_destination = config::get().is_some_and(|c| c.flags & F::ROUTES_BY_DESTINATION != 0);
    let now = if by_destination { F::now_ns() } else { 0 };
    // A flow refreshing its own cache asks the FIB itself: the destination's
    // answer may be nearly a second old, and a flow follows a change within one.
    let refreshing = hop.is_some_and(|h| h.refresh_due());
    if by_destination
        && !refreshing
        && let Some(found) = hops::get::<F>(&out.daddr_be, ifindex, len, now)
    {
        if let Some(h) = hop {
            h.set(ifindex, len, &found);
        }
        count(Counter::NextHopCached);
        return Route::of(&found);
    }
    let Some(scratch) = F::scratch() else {
        return Route::Stack;
    };
    let params = &mut scratch.fib;
    let ret = lookup(ctx, pkt, out, len, params) as u32;
    if ret == BPF_FIB_LKUP_RET_NO_NEIGH {
        return Route::Unresolved(params.ifindex);
    }
    if ret != BPF_FIB_LKUP_RET_SUCCESS {
        return Route::Stack;
    }
    let answer = NextHop {
        in_ifindex: ifindex,
        out_ifindex: params.ifindex,
        dmac: params.dmac,
        smac: params.smac,
        fits_len: len,
        flags: out_flags(params.ifindex),
    };
    if let Some(h) = hop {
        h.set(ifindex, len, &answer);
    }
    if by_destination {
        hops::set::<F>(&out.daddr_be, &answer, now);
    }
    Route::of(&answer)
}

/// The [`hop_flags`] of sending out of `ifindex`, from the agent's `IFACES`:
/// read when the FIB is asked, then cached with its answer.
#[inline(always)]
fn out_flags(ifindex: u32) -> u16 {
    // SAFETY: map values are plain data.
    match unsafe { IFACES.get(&ifindex) } {
        Some(i) if i.flags & iface::PEER_IN_OTHER_NETNS != 0 => hop_flags::PEER,
        _ => 0,
    }
}

/// TC: redirect to the packet's next hop (see [`route`]), its TTL
/// decremented, or leave it to the stack when the route is local,
/// unreachable or the TTL runs out.
#[inline(always)]
pub fn tc<F: Ip>(ctx: &TcContext, pkt: &Packet<F>, out: &Rewrite<F>, hop: Option<HopCache>) -> i32 {
    if pkt.ttl <= 1 {
        count(Counter::FibPass);
        return TC_ACT_OK;
    }
    let route = route(ctx, pkt, out, hop);
    if matches!(route, Route::Stack) || nat::decrement_hop(ctx, pkt).is_err() {
        count(Counter::FibPass);
        return TC_ACT_OK;
    }
    count(Counter::FibRedirect);
    match route {
        Route::Hop {
            ifindex,
            dmac,
            smac,
            flags,
        } => redirect(ctx, ifindex, &dmac, &smac, flags),
        // SAFETY: a null neighbour means "resolve the packet's own destination".
        Route::Unresolved(ifindex) => unsafe {
            bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) as i32
        },
        Route::Stack => TC_ACT_OK,
    }
}

#[inline(always)]
fn redirect(ctx: &TcContext, ifindex: u32, dmac: &[u8; 6], smac: &[u8; 6], flags: u16) -> i32 {
    let Some(eth) = ctx.ptr_at::<[u8; 12]>(0) else {
        return TC_ACT_OK;
    };
    // SAFETY: bounds-checked by ptr_at; the MACs are outside every checksum.
    let eth = unsafe { &mut *eth };
    eth[..6].copy_from_slice(dmac);
    eth[6..].copy_from_slice(smac);
    // A pod's veth: straight to the pod's ingress, as the stack would
    // deliver it after the veth's transmit and the backlog queue (only a TC
    // ingress program may do this; every caller of `tc` is one).
    // SAFETY: helpers without preconditions.
    unsafe {
        if flags & hop_flags::PEER != 0 {
            bpf_redirect_peer(ifindex, 0) as i32
        } else {
            bpf_redirect(ifindex, 0) as i32
        }
    }
}

/// XDP: where to send a translated frame when it goes straight back out of
/// the interface it came in on (the one-armed node): its next hop (see
/// [`route`]). Anything else is left untouched to TC, which redirects it;
/// translating here and passing it up would show the stack local source
/// addresses on an external interface, which it drops as martians.
#[inline(always)]
pub fn xdp_next_hop<F: Ip>(
    ctx: &XdpContext,
    pkt: &Packet<F>,
    out: &Rewrite<F>,
    hop: Option<HopCache>,
) -> Option<([u8; 6], [u8; 6])> {
    if pkt.ttl <= 1 {
        return None;
    }
    match route(ctx, pkt, out, hop) {
        Route::Hop {
            ifindex,
            dmac,
            smac,
            ..
        } if ifindex == ctx.ifindex() => Some((dmac, smac)),
        _ => None,
    }
}

/// XDP: rewrites the Ethernet addresses and TTL and sends the frame back out.
#[inline(always)]
pub fn xdp_transmit<F: Ip>(ctx: &XdpContext, (dmac, smac): ([u8; 6], [u8; 6])) -> i32 {
    let Some(eth) = ctx.ptr_at::<[u8; 12]>(0) else {
        return XDP_DROP;
    };
    if xdp_nat::decrement_hop::<F>(ctx).is_err() {
        return XDP_DROP;
    }
    // SAFETY: bounds-checked by ptr_at.
    let eth = unsafe { &mut *eth };
    eth[..6].copy_from_slice(&dmac);
    eth[6..].copy_from_slice(&smac);
    count(Counter::XdpTx);
    XDP_TX
}
