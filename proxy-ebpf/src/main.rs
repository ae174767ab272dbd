//! The service datapath: TC programs for traffic from pods and from the
//! node's external interfaces, and an XDP fast path for the latter.
#![no_std]
#![no_main]

mod affinity;
mod collector;
mod config;
mod conntrack;
mod csum;
mod filter;
mod flow;
mod forward;
mod frame;
mod hops;
mod ip;
mod lb;
mod maps;
mod mem;
mod monitor;
mod nat;
mod packet;
mod reject;
mod sctp;
mod sock;
mod stats;
mod xdp_nat;

use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr, classifier, flow_dissector, xdp},
    programs::{FlowDissectorContext, SockAddrContext, SockContext, TcContext, XdpContext},
};
use proxy_common::{
    Counter, V4, V6,
    action::{TC_ACT_OK, TC_ACT_SHOT, XDP_DROP, XDP_PASS},
    collector::AgentSweep,
    monitor::{hook, kind},
};

use crate::{flow::Verdict, frame::Frame, ip::Ip, packet::L3, stats::count};

/// Attached at ingress of pod-facing interfaces: requests from pods are
/// balanced and replies from backends reverse-translated.
#[classifier]
pub fn tc_from_pod(ctx: TcContext) -> i32 {
    tc(&ctx, hook::FROM_POD)
}

/// Attached at ingress of the node's external interfaces: NodePort, external
/// IP and load-balancer traffic from outside, and replies of masqueraded flows.
#[classifier]
pub fn tc_from_netdev(ctx: TcContext) -> i32 {
    tc(&ctx, hook::FROM_NETDEV)
}

/// Attached at egress of pod-facing and external interfaces: replies that
/// this node's own sockets (hostNetwork endpoints) send on translated flows
/// get the frontend back as source. Forwarded packets carry no socket and
/// pass untouched.
#[classifier]
pub fn tc_from_host(ctx: TcContext) -> i32 {
    // SAFETY: reading the context's socket pointer; the verifier checks it.
    if unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk }.is_null() {
        return TC_ACT_OK;
    }
    match packet::l3_of(&ctx) {
        L3::V4 => host_reply::<V4>(&ctx),
        L3::V6 => host_reply::<V6>(&ctx),
        L3::Other => TC_ACT_OK,
    }
}

// A function of its own (a BPF-to-BPF call): each family's work gets a
// stack frame of its own instead of both sharing the 512 bytes of one.
#[inline(never)]
fn host_reply<F: Ip>(ctx: &TcContext) -> i32 {
    let Ok(Some(pkt)) = packet::parse::<_, F>(ctx) else {
        return TC_ACT_OK;
    };
    let pkt = &pkt;
    let Some(config) = config::get() else {
        return TC_ACT_OK;
    };
    let Some(out) = flow::reply(config, pkt) else {
        return TC_ACT_OK;
    };
    count(Counter::HostReply);
    if let Err(reason) = nat::apply(ctx, pkt, &out) {
        count(reason);
        monitor::dropped(kind::DROP, hook::FROM_HOST, ctx.ifindex(), pkt, reason);
        return TC_ACT_SHOT;
    }
    TC_ACT_OK
}

/// connect(2) from a socket in the attach cgroup: a service address becomes a backend.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    sock::forward::<V4>(&ctx)
}

/// UDP sendmsg(2) to an address: a service address becomes a backend.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::forward::<V4>(&ctx)
}

/// UDP recvmsg(2): a backend's datagram shows the service as its source.
#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<V4>(&ctx)
}

/// getpeername(2): a socket pointed at a backend shows the service.
#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<V4>(&ctx)
}

/// The IPv6 twins of the four hooks above.
#[cgroup_sock_addr(connect6)]
pub fn sock_connect6(ctx: SockAddrContext) -> i32 {
    sock::forward::<V6>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::forward::<V6>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<V6>(&ctx)
}

// Not `sock_getpeername6`: the kernel keeps 15 characters of a program's
// name, and that one would read as `sock_getpeername4` cut short.
#[cgroup_sock_addr(getpeername6)]
pub fn sock_peername6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<V6>(&ctx)
}

/// close(2) of a socket in the attach cgroup, either family: what the
/// hooks above kept for it goes.
#[cgroup_sock(sock_release)]
pub fn sock_release(ctx: SockContext) -> i32 {
    sock::release(&ctx)
}

/// The same work as `tc_from_netdev` before an skb exists; anything it does
/// not finish itself (rejects, packets routed elsewhere) goes on to TC.
#[xdp]
pub fn xdp_from_netdev(ctx: XdpContext) -> u32 {
    // XDP actions are small and non-negative.
    xdp(&ctx) as u32
}

#[inline(always)]
fn xdp(ctx: &XdpContext) -> i32 {
    match packet::l3_of(ctx) {
        L3::V4 => xdp_packet::<V4>(ctx),
        L3::V6 => xdp_packet::<V6>(ctx),
        L3::Other => XDP_PASS,
    }
}

// A function of its own (a BPF-to-BPF call): each family's work gets a
// stack frame of its own instead of both sharing the 512 bytes of one.
#[inline(never)]
fn xdp_packet<F: Ip>(ctx: &XdpContext) -> i32 {
    let ifindex = ctx.ifindex();
    let pkt = match packet::parse::<_, F>(ctx) {
        Ok(Some(pkt)) => pkt,
        Ok(None) => return XDP_PASS,
        Err(reason) => {
            dropped_malformed::<F>(hook::XDP, ifindex, reason);
            return XDP_DROP;
        }
    };
    let pkt = &pkt;
    match flow::decide(pkt, ifindex, hook::XDP) {
        Verdict::Pass | Verdict::Reject(_) => XDP_PASS,
        Verdict::Drop(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook::XDP, ifindex, pkt, reason);
            XDP_DROP
        }
        Verdict::Forward(out, counter, hop) => {
            count(Counter::Packets);
            count(counter);
            let Some(next_hop) = forward::xdp_next_hop(ctx, pkt, &out, hop) else {
                // TC finds the conntrack state this run created and finishes the job.
                count(Counter::XdpPass);
                return XDP_PASS;
            };
            if let Err(reason) = xdp_nat::apply(ctx, pkt, &out) {
                count(reason);
                monitor::dropped(kind::DROP, hook::XDP, ifindex, pkt, reason);
                return XDP_DROP;
            }
            forward::xdp_transmit::<F>(ctx, next_hop)
        }
    }
}

#[inline(always)]
fn tc(ctx: &TcContext, hook: u8) -> i32 {
    match packet::l3_of(ctx) {
        L3::V4 => match tc_packet::<V4>(ctx, hook) {
            REJECT => tc_reject::<V4>(ctx, hook),
            action => action,
        },
        L3::V6 => match tc_packet::<V6>(ctx, hook) {
            REJECT => tc_reject::<V6>(ctx, hook),
            action => action,
        },
        L3::Other => TC_ACT_OK,
    }
}

/// [`tc_packet`]'s answer when the packet is to be rejected: the reply is
/// built by [`tc_reject`], a call after it rather than under it, so the two
/// frames never add up on the 512-byte stack.
const REJECT: i32 = i32::MIN;

#[inline(never)]
fn tc_reject<F: Ip>(ctx: &TcContext, hook: u8) -> i32 {
    let Ok(Some(pkt)) = packet::parse::<_, F>(ctx) else {
        return TC_ACT_SHOT;
    };
    reject::send(ctx, &pkt).unwrap_or_else(|failed| {
        count(failed);
        monitor::dropped(kind::DROP, hook, ctx.ifindex(), &pkt, failed);
        TC_ACT_SHOT
    })
}

/// Counts and reports a malformed packet; its tuple is unknown.
#[inline(always)]
fn dropped_malformed<F: Ip>(hook: u8, ifindex: u32, reason: Counter) {
    count(reason);
    monitor::dropped_unparsed::<F>(hook, ifindex, reason);
}

// A function of its own (a BPF-to-BPF call): each family's work gets a
// stack frame of its own instead of both sharing the 512 bytes of one.
#[inline(never)]
fn tc_packet<F: Ip>(ctx: &TcContext, hook: u8) -> i32 {
    let ifindex = ctx.ifindex();
    let pkt = match packet::parse::<_, F>(ctx) {
        Ok(Some(pkt)) => pkt,
        Ok(None) => return TC_ACT_OK,
        Err(reason) => {
            dropped_malformed::<F>(hook, ifindex, reason);
            return TC_ACT_SHOT;
        }
    };
    let pkt = &pkt;
    count(Counter::Packets);
    match flow::decide(pkt, ifindex, hook) {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook, ifindex, pkt, reason);
            TC_ACT_SHOT
        }
        Verdict::Reject(reason) => {
            count(reason);
            monitor::dropped(kind::REJECT, hook, ifindex, pkt, reason);
            REJECT
        }
        Verdict::Forward(out, counter, hop) => {
            count(counter);
            if let Err(reason) = nat::apply(ctx, pkt, &out) {
                count(reason);
                monitor::dropped(kind::DROP, hook, ifindex, pkt, reason);
                return TC_ACT_SHOT;
            }
            forward::tc(ctx, pkt, &out, hop)
        }
    }
}

#[cfg(not(test))]
/// Run by the agent (BPF_PROG_TEST_RUN, any frame) to arm the conntrack
/// collector: XDP_PASS when armed, else the kernel's errno in an answer no
/// XDP verdict uses (`proxy_common::collector::arm_answer`). Never attached.
#[xdp]
pub fn ct_collector_arm(_ctx: XdpContext) -> u32 {
    proxy_common::collector::arm_answer(collector::arm())
}

/// Run by the agent (BPF_PROG_TEST_RUN) after each of its sweeps, its data
/// the sweep's [`AgentSweep`]: records it and holds the timer off. A flow
/// dissector program because its test run leaves the CPU's softirqs enabled
/// (XDP and TC runs disable them, and tracing programs may not use a map
/// holding a timer) for the sweep it makes itself when a full table asked
/// for one meanwhile; it is never attached. 0 when recorded.
#[flow_dissector]
pub fn ct_collector_sweep(ctx: FlowDissectorContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + core::mem::size_of::<AgentSweep>() > end {
        return 2;
    }
    // SAFETY: the bounds check above covers the whole report (the verifier
    // checks it again); AgentSweep is plain u64s, read unaligned.
    let report = unsafe { core::ptr::read_unaligned(start as *const AgentSweep) };
    if collector::record_agent_sweep(&report) == 0 {
        0
    } else {
        1
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
