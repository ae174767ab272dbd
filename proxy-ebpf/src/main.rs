//! The service datapath: TC programs for traffic from pods and from the
//! node's external interfaces, and an XDP fast path for the latter.
#![no_std]
#![no_main]

mod config;
mod conntrack;
mod csum;
mod flow;
mod forward;
mod frame;
mod lb;
mod maps;
mod monitor;
mod nat;
mod packet;
mod reject;
mod sock;
mod stats;
mod xdp_nat;

use aya_ebpf::{
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_SHOT, XDP_DROP, XDP_PASS},
    monitor::{hook, kind},
};

use crate::{flow::Verdict, frame::Frame, stats::count};

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
    let pkt = match packet::parse(&ctx) {
        Ok(Some(pkt)) => pkt,
        _ => return TC_ACT_OK,
    };
    let config = config::get();
    let Some(out) = flow::reply(&config, &pkt, conntrack::now_ns()) else {
        return TC_ACT_OK;
    };
    count(Counter::HostReply);
    if let Err(reason) = nat::apply(&ctx, &pkt, &out) {
        count(reason);
        monitor::dropped(
            kind::DROP,
            hook::FROM_HOST,
            ctx.ifindex(),
            &pkt.tuple(),
            reason,
        );
        return TC_ACT_SHOT;
    }
    TC_ACT_OK
}

/// connect(2) from a socket in the attach cgroup: a service address becomes a backend.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    sock::forward(&ctx)
}

/// UDP sendmsg(2) to an address: a service address becomes a backend.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::forward(&ctx)
}

/// UDP recvmsg(2): a backend's datagram shows the service as its source.
#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx)
}

/// getpeername(2): a socket pointed at a backend shows the service.
#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx)
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
    let ifindex = ctx.ifindex();
    let pkt = match packet::parse(ctx) {
        Ok(Some(pkt)) => pkt,
        Ok(None) => return XDP_PASS,
        Err(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook::XDP, ifindex, &Default::default(), reason);
            return XDP_DROP;
        }
    };
    match flow::decide(&pkt, ifindex, conntrack::now_ns(), hook::XDP) {
        Verdict::Pass | Verdict::Reject(_) => XDP_PASS,
        Verdict::Drop(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook::XDP, ifindex, &pkt.tuple(), reason);
            XDP_DROP
        }
        Verdict::Forward(out, counter) => {
            count(Counter::Packets);
            count(counter);
            let Some(next_hop) = forward::xdp_next_hop(ctx, &pkt, &out) else {
                // TC finds the conntrack state this run created and finishes the job.
                count(Counter::XdpPass);
                return XDP_PASS;
            };
            if let Err(reason) = xdp_nat::apply(ctx, &pkt, &out) {
                count(reason);
                monitor::dropped(kind::DROP, hook::XDP, ifindex, &pkt.tuple(), reason);
                return XDP_DROP;
            }
            forward::xdp_transmit(ctx, next_hop)
        }
    }
}

#[inline(always)]
fn tc(ctx: &TcContext, hook: u8) -> i32 {
    let ifindex = ctx.ifindex();
    let pkt = match packet::parse(ctx) {
        Ok(Some(pkt)) => pkt,
        Ok(None) => return TC_ACT_OK,
        Err(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook, ifindex, &Default::default(), reason);
            return TC_ACT_SHOT;
        }
    };
    count(Counter::Packets);
    match flow::decide(&pkt, ifindex, conntrack::now_ns(), hook) {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop(reason) => {
            count(reason);
            monitor::dropped(kind::DROP, hook, ifindex, &pkt.tuple(), reason);
            TC_ACT_SHOT
        }
        Verdict::Reject(reason) => {
            count(reason);
            monitor::dropped(kind::REJECT, hook, ifindex, &pkt.tuple(), reason);
            reject::send(ctx, &pkt).unwrap_or_else(|failed| {
                count(failed);
                monitor::dropped(kind::DROP, hook, ifindex, &pkt.tuple(), failed);
                TC_ACT_SHOT
            })
        }
        Verdict::Forward(out, counter) => {
            count(counter);
            if let Err(reason) = nat::apply(ctx, &pkt, &out) {
                count(reason);
                monitor::dropped(kind::DROP, hook, ifindex, &pkt.tuple(), reason);
                return TC_ACT_SHOT;
            }
            forward::tc(ctx, &pkt, &out)
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
