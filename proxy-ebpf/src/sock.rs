//! Socket-level balancing in cgroup socket-address hooks: a connect or UDP
//! send to a service address is pointed at a backend before any packet
//! exists, so the flow needs no per-packet NAT; `getpeername` and UDP
//! `recvmsg` are shown the service address back.
//!
//! The choice is the per-packet path's own ([`flow::pick`]): same frontends,
//! same traffic policies. The hooks see addresses, not packets, so they are
//! written against the address and port alone, generic over the family:
//! the IPv6 hooks read `user_ip6` into the same calls.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::{SockAddrContext, SockContext},
};
use proxy_common::{
    Counter, DatapathConfig, Family, ServiceKeyOf, SockDirection, SockKeyOf, SockValueOf, V4, V6,
    config::flags, proto, service::flags as svc,
};

use crate::{
    config,
    flow::{self, Pick},
    ip::Ip,
    lb,
    monitor::{self, Tuple},
    stats::count,
};

/// A cgroup socket-address program's "go on" and "refuse" return values.
pub const ALLOW: i32 = 1;
const REFUSE: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// connect(2) (TCP and UDP) and UDP sendmsg(2) with an address.
#[inline(always)]
pub fn forward<F: Ip>(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands the program a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(proto) = proto_of(sa.protocol) else {
        return ALLOW;
    };
    let Some(config) = config::get() else {
        return ALLOW;
    };
    let host = in_host_namespace(ctx, config);
    let wanted = if host {
        flags::SOCKET_LB_HOST
    } else {
        flags::SOCKET_LB_PODS
    };
    if config.flags & wanted == 0 {
        return ALLOW;
    }
    let addr_be = F::sock_addr(sa);
    // The port sits in network order in the low 16 bits.
    let port_be = sa.user_port as u16;
    let asked = Tuple::<F> {
        daddr_be: addr_be,
        dport_be: port_be,
        proto,
        ..Tuple::default()
    };
    let key = ServiceKeyOf::<F>::frontend(addr_be, port_be, proto);
    let Some(frontend) = lb::frontend(&key) else {
        if lb::frontend(&ServiceKeyOf::<F>::cluster_ip(addr_be))
            .is_some_and(|m| m.has(svc::CLUSTER_IP_MARKER))
        {
            return refuse(&asked);
        }
        // Upstream drops the packets; failing the call says it sooner.
        if crate::config::in_service_cidr::<F>(config, addr_be) {
            count(Counter::DropUnallocated);
            return refuse(&asked);
        }
        return ALLOW;
    };
    if frontend.has(svc::SOURCE_RANGES) {
        // A pod's own address is not known before the packet exists: the
        // per-packet path checks it. The node's sources are its addresses,
        // allowed as upstream allows them: when a range holds the primary.
        if !host {
            count(Counter::SockDeclined);
            return ALLOW;
        }
        if !flow::source_allowed::<F>(frontend.service_id, F::masquerade_addr(config)) {
            return refuse(&asked);
        }
    }
    // SAFETY: the helper accepts this program type's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let sticky = SockKeyOf::<F>::new(cookie, addr_be, port_be, proto, SockDirection::Forward);
    // A TCP socket connects once; only UDP sends come back to the hook.
    let kept = if proto == proto::UDP {
        kept_backend(&sticky)
    } else {
        None
    };
    if frontend.has(svc::MAGLEV)
        && let Some(scratch) = F::scratch()
    {
        scratch.maglev_hash = lb::below(u32::MAX);
    }
    let chosen = match kept {
        Some(kept) => Some(kept),
        // A pod's address is not known before its packet exists: affinity,
        // which is by client address, is left to the per-packet path.
        // Nor is its port, which Maglev hashes.
        None if frontend.has(svc::AFFINITY | svc::MAGLEV) && !host => {
            count(Counter::SockDeclined);
            return ALLOW;
        }
        // The node's own connections leave from its primary address, from
        // a port not chosen yet: a Maglev service gets a random bucket.
        None => match flow::pick(
            key,
            &frontend,
            true,
            F::masquerade_addr(config),
            F::now_ns(),
        ) {
            Ok(Pick::Backend(id, b)) => Some((id, b.addr_be, b.port_be)),
            Ok(Pick::Empty) => None,
            Err(reason) => {
                count(reason);
                None
            }
        },
    };
    let Some((backend_id, backend_addr_be, backend_port_be)) = chosen else {
        return refuse(&asked);
    };
    let reverse = SockKeyOf::<F>::new(
        cookie,
        backend_addr_be,
        backend_port_be,
        proto,
        SockDirection::Reverse,
    );
    let service = SockValueOf::<F> {
        addr_be,
        port_be,
        _pad: 0,
        service_id: frontend.service_id,
        backend_id,
    };
    let backend = SockValueOf::<F> {
        addr_be: backend_addr_be,
        port_be: backend_port_be,
        ..service
    };
    // Only the reverse entry is needed for the application to see the
    // service; a full map costs stickiness, never the connection.
    let _ = F::sockets().insert(&reverse, &service, 0);
    if proto == proto::UDP {
        let _ = F::sockets().insert(&sticky, &backend, 0);
    }
    F::set_sock_addr(sa, backend_addr_be);
    sa.user_port = backend_port_be as u32;
    count(Counter::SockTranslated);
    ALLOW
}

/// getpeername(2) and UDP recvmsg(2): the backend shown as the service.
#[inline(always)]
pub fn reverse<F: Ip>(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands the program a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(proto) = proto_of(sa.protocol) else {
        return ALLOW;
    };
    // SAFETY: the helper accepts this program type's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockKeyOf::<F>::new(
        cookie,
        F::sock_addr(sa),
        sa.user_port as u16,
        proto,
        SockDirection::Reverse,
    );
    // SAFETY: map values are plain data and copied out immediately.
    if let Some(service) = unsafe { F::sockets().get(&key) }.copied() {
        F::set_sock_addr(sa, service.addr_be);
        sa.user_port = service.port_be as u32;
        count(Counter::SockReverse);
    }
    ALLOW
}

/// close(2) of a socket in the attach cgroup: the entries the hooks wrote
/// for it go with it. A socket's cookie is never reused, so they would
/// only hold room in the LRU map until evicted: a node's short connections
/// filled it (262,144 entries), evicting live UDP sockets' choices, and
/// every walk of the map (a UDP backend leaving) read them all. A socket
/// that sent unconnected datagrams to services keeps one choice per
/// service, which the hook cannot find from the socket: those stay until
/// evicted.
#[inline(always)]
pub fn release(ctx: &SockContext) -> i32 {
    // SAFETY: the kernel hands the program a valid bpf_sock.
    let sk = unsafe { &*ctx.sock };
    // SAFETY: reading fields of the kernel's context.
    let (family, protocol) = unsafe {
        (
            core::ptr::read_volatile(&sk.family),
            core::ptr::read_volatile(&sk.protocol),
        )
    };
    let Some(proto) = proto_of(protocol) else {
        return ALLOW;
    };
    match family {
        f if f == u32::from(V4::AF) => forget_socket::<V4>(ctx, sk, proto),
        f if f == u32::from(V6::AF) => forget_socket::<V6>(ctx, sk, proto),
        _ => {}
    }
    ALLOW
}

#[inline(always)]
fn forget_socket<F: Ip>(ctx: &SockContext, sk: &aya_ebpf::bindings::bpf_sock, proto: u8) {
    // SAFETY: reading a field of the kernel's context (16 bits, network order).
    let port_be = unsafe { core::ptr::read_volatile(&sk.dst_port) };
    if port_be == 0 {
        return; // never connected
    }
    // SAFETY: the helper accepts this program type's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let reverse = SockKeyOf::<F>::new(
        cookie,
        F::sock_peer(sk),
        port_be,
        proto,
        SockDirection::Reverse,
    );
    // SAFETY: map values are plain data and copied out immediately.
    let Some(service) = (unsafe { F::sockets().get(&reverse) }).copied() else {
        return; // not one the hooks translated
    };
    let _ = F::sockets().remove(&reverse);
    if proto == proto::UDP {
        let sticky = SockKeyOf::<F>::new(
            cookie,
            service.addr_be,
            service.port_be,
            proto,
            SockDirection::Forward,
        );
        let _ = F::sockets().remove(&sticky);
    }
}

/// The backend this UDP socket's earlier datagrams to the service went to,
/// while it still serves the service.
#[inline(always)]
fn kept_backend<F: Ip>(sticky: &SockKeyOf<F>) -> Option<(u32, F::Addr, u16)> {
    // SAFETY: map values are plain data and copied out immediately.
    let kept = unsafe { F::sockets().get(sticky) }.copied()?;
    let backend = lb::backend::<F>(kept.backend_id)?;
    (backend.addr_be == kept.addr_be && backend.port_be == kept.port_be).then_some((
        kept.backend_id,
        kept.addr_be,
        kept.port_be,
    ))
}

#[inline(always)]
fn refuse<F: Ip>(asked: &Tuple<F>) -> i32 {
    count(Counter::SockRefused);
    monitor::refused(asked);
    // SAFETY: sets this hook's error for the system call (Linux 5.18+);
    // without it the refusal would read EPERM.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    REFUSE
}

#[inline(always)]
fn in_host_namespace(ctx: &SockAddrContext, config: &DatapathConfig) -> bool {
    // SAFETY: the helper accepts this program type's context.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    config.host_netns_cookie != 0 && netns == config.host_netns_cookie
}

#[inline(always)]
fn proto_of(protocol: u32) -> Option<u8> {
    match protocol {
        6 => Some(proto::TCP),
        17 => Some(proto::UDP),
        _ => None,
    }
}
