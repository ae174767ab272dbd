//! Sends translated packets on through the kernel's FIB instead of the
//! stack's forwarding path (and its netfilter hooks).

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup},
    helpers::{bpf_redirect, bpf_redirect_neigh},
    programs::{TcContext, XdpContext},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, XDP_DROP, XDP_TX},
};

use crate::{
    flow::Rewrite,
    frame::Frame,
    packet::{IP_CSUM_OFF, IP_TTL_OFF, Packet},
    stats::count,
    xdp_nat,
};

const AF_INET: u8 = 2;

#[inline(always)]
fn lookup<F: Frame>(ctx: &F, pkt: &Packet, out: &Rewrite) -> (i64, bpf_fib_lookup) {
    // SAFETY: an all-zero bpf_fib_lookup is a valid input.
    let mut params: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    params.family = AF_INET;
    params.l4_protocol = pkt.proto;
    params.sport = out.sport_be;
    params.dport = out.dport_be;
    params.__bindgen_anon_1.tot_len = pkt.tot_len;
    params.ifindex = ctx.ifindex();
    params.__bindgen_anon_3.ipv4_src = out.saddr_be;
    params.__bindgen_anon_4.ipv4_dst = out.daddr_be;
    (fib(ctx, &mut params), params)
}

#[inline(always)]
fn fib<F: Frame>(ctx: &F, params: &mut bpf_fib_lookup) -> i64 {
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

/// TC: redirect to the FIB's next hop, or leave it to the stack when the
/// route is local, unreachable or the TTL runs out.
#[inline(always)]
pub fn tc(ctx: &TcContext, pkt: &Packet, out: &Rewrite) -> i32 {
    if pkt.ttl <= 1 {
        count(Counter::FibPass);
        return TC_ACT_OK;
    }
    let (ret, params) = lookup(ctx, pkt, out);
    let ret = ret as u32;
    if ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH {
        count(Counter::FibPass);
        return TC_ACT_OK;
    }
    if decrement_ttl(ctx, pkt).is_err() {
        count(Counter::FibPass);
        return TC_ACT_OK;
    }
    count(Counter::FibRedirect);
    if ret == BPF_FIB_LKUP_RET_NO_NEIGH {
        // SAFETY: a null neighbour means "resolve the packet's own destination".
        return unsafe { bpf_redirect_neigh(params.ifindex, core::ptr::null_mut(), 0, 0) } as i32;
    }
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&params.dmac);
    macs[6..].copy_from_slice(&params.smac);
    if ctx.store(0, &macs, 0).is_err() {
        return TC_ACT_OK;
    }
    // SAFETY: helper without preconditions.
    unsafe { bpf_redirect(params.ifindex, 0) as i32 }
}

#[inline(always)]
fn decrement_ttl(ctx: &TcContext, pkt: &Packet) -> Result<(), i64> {
    // TTL and protocol share one 16-bit word of the header.
    let old = u16::from_ne_bytes([pkt.ttl, pkt.proto]);
    let new = u16::from_ne_bytes([pkt.ttl - 1, pkt.proto]);
    ctx.l3_csum_replace(IP_CSUM_OFF, old as u64, new as u64, 2)?;
    ctx.store(IP_TTL_OFF, &(pkt.ttl - 1), 0)
}

/// XDP: where to send a translated frame when it goes straight back out of
/// the interface it came in on (the one-armed node): the FIB's next hop.
/// Anything else is left untouched to TC, which redirects it; translating
/// here and passing it up would show the stack local source addresses on
/// an external interface, which it drops as martians.
#[inline(always)]
pub fn xdp_next_hop(ctx: &XdpContext, pkt: &Packet, out: &Rewrite) -> Option<([u8; 6], [u8; 6])> {
    if pkt.ttl <= 1 {
        return None;
    }
    let (ret, params) = lookup(ctx, pkt, out);
    if ret as u32 != BPF_FIB_LKUP_RET_SUCCESS || params.ifindex != ctx.ifindex() {
        return None;
    }
    Some((params.dmac, params.smac))
}

/// XDP: rewrites the Ethernet addresses and TTL and sends the frame back out.
#[inline(always)]
pub fn xdp_transmit(ctx: &XdpContext, (dmac, smac): ([u8; 6], [u8; 6])) -> i32 {
    let Some(eth) = ctx.ptr_at::<[u8; 12]>(0) else {
        return XDP_DROP;
    };
    if xdp_nat::decrement_ttl(ctx).is_err() {
        return XDP_DROP;
    }
    // SAFETY: bounds-checked by ptr_at.
    let eth = unsafe { &mut *eth };
    eth[..6].copy_from_slice(&dmac);
    eth[6..].copy_from_slice(&smac);
    count(Counter::XdpTx);
    XDP_TX
}
