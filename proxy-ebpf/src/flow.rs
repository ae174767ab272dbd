//! What to do with a packet: the service logic shared by the TC and XDP programs.
//! It reads and writes maps only; applying the verdict to the packet is the
//! caller's job.

use aya_ebpf::maps::lpm_trie::Key;
use proxy_common::{
    Backend, BackendId, Counter, CtDirection, CtKey, CtValue, DatapathConfig, Scope, ServiceKey,
    ServiceValue, SourceRange, backend::flags as backend_flags, conntrack::flags as ct,
    service::flags as svc,
};

use crate::{
    config, conntrack, lb,
    maps::SOURCE_RANGES,
    monitor::Tuple,
    packet::{Packet, tcp_flags},
};

/// The tuple a packet leaves with.
#[derive(Clone, Copy)]
pub struct Rewrite {
    pub saddr_be: u32,
    pub sport_be: u16,
    pub daddr_be: u32,
    pub dport_be: u16,
}

pub enum Verdict {
    /// Not service traffic: leave the packet alone.
    Pass,
    Drop(Counter),
    /// Answer with a TCP RST or ICMP port unreachable.
    Reject(Counter),
    /// Rewrite to the given tuple and send it on.
    Forward(Rewrite, Counter),
}

#[inline(always)]
fn key_of(pkt: &Packet, direction: CtDirection) -> CtKey {
    CtKey::new(
        pkt.saddr_be,
        pkt.daddr_be,
        pkt.sport_be,
        pkt.dport_be,
        pkt.proto,
        direction,
    )
}

#[inline(always)]
fn unchanged(pkt: &Packet) -> Rewrite {
    Rewrite {
        saddr_be: pkt.saddr_be,
        sport_be: pkt.sport_be,
        daddr_be: pkt.daddr_be,
        dport_be: pkt.dport_be,
    }
}

/// The conntrack flags a TCP FIN or RST in `direction` sets.
#[inline(always)]
fn closing(pkt: &Packet, direction: CtDirection) -> u16 {
    if pkt.tcp_flags & tcp_flags::RST != 0 {
        ct::RST | ct::CLOSING
    } else if pkt.tcp_flags & tcp_flags::FIN != 0 {
        ct::CLOSING
            | match direction {
                CtDirection::Forward => ct::FIN_FORWARD,
                CtDirection::Reply => ct::FIN_REPLY,
            }
    } else {
        0
    }
}

/// A SYN without ACK: a client opening a connection.
#[inline(always)]
fn opens(pkt: &Packet) -> bool {
    pkt.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
}

#[inline(always)]
pub fn decide(pkt: &Packet, ifindex: u32, now: u64, hook: u8) -> Verdict {
    let config = config::get();
    if let Some(out) = reply(&config, pkt, now) {
        return Verdict::Forward(out, Counter::ReplyNat);
    }

    let forward_key = key_of(pkt, CtDirection::Forward);
    if let Some(hit) = conntrack::lookup(
        &config,
        &forward_key,
        now,
        closing(pkt, CtDirection::Forward),
    ) {
        let flow = hit.value;
        if opens(pkt) && flow.flags & ct::FINISHED != 0 {
            // A client reusing the tuple of a finished connection opens a new one.
            crate::stats::count(Counter::Reopened);
        } else {
            // The agent removes a backend's entry once no service uses it; such
            // flows are balanced again rather than sent into the void.
            match lb::backend(flow.backend_id) {
                Some(b) if b.addr_be == flow.nat_addr_be && b.port_be == flow.nat_port_be => {
                    let mut out = unchanged(pkt);
                    out.daddr_be = b.addr_be;
                    out.dport_be = b.port_be;
                    if flow.flags & ct::SNAT != 0 {
                        out.saddr_be = flow.snat_addr_be;
                        out.sport_be = flow.snat_port_be;
                    }
                    if hit.new_flags != 0 || hit.refreshed {
                        let snat = flow.flags & ct::SNAT != 0;
                        let reply = CtValue {
                            nat_addr_be: pkt.daddr_be,
                            nat_port_be: pkt.dport_be,
                            snat_addr_be: if snat { pkt.saddr_be } else { 0 },
                            snat_port_be: if snat { pkt.sport_be } else { 0 },
                            last_seen_ns: now,
                            flags: flow.flags | hit.new_flags,
                            ..flow
                        };
                        other_half(
                            &config,
                            &out,
                            pkt.proto,
                            CtDirection::Reply,
                            now,
                            hit.new_flags,
                            &reply,
                        );
                    }
                    return Verdict::Forward(out, Counter::Established);
                }
                _ => crate::stats::count(Counter::Rebalanced),
            }
        }
    }

    let key = ServiceKey::frontend(pkt.daddr_be, pkt.dport_be, pkt.proto);
    let frontend = lb::frontend(&key).filter(|f| !f.has(svc::HOST_ONLY));
    let Some(frontend) = frontend else {
        return if lb::frontend(&ServiceKey::cluster_ip(pkt.daddr_be))
            .is_some_and(|m| m.has(svc::CLUSTER_IP_MARKER))
        {
            Verdict::Reject(Counter::RejectUnknownPort)
        } else {
            Verdict::Pass
        };
    };
    match new_flow(
        &config,
        pkt,
        ifindex,
        now,
        key,
        &frontend,
        &forward_key,
        hook,
    ) {
        Ok(v) => v,
        Err(counter) => Verdict::Drop(counter),
    }
}

/// A reply of a translated flow, rewritten; `None` for anything else.
#[inline(always)]
pub fn reply(config: &DatapathConfig, pkt: &Packet, now: u64) -> Option<Rewrite> {
    let hit = conntrack::lookup(
        config,
        &key_of(pkt, CtDirection::Reply),
        now,
        ct::SEEN_REPLY | closing(pkt, CtDirection::Reply),
    )?;
    Some(reply_rewrite(config, pkt, &hit, now))
}

/// Replies get the frontend back as source and, when masqueraded, the client as destination.
#[inline(always)]
fn reply_rewrite(config: &DatapathConfig, pkt: &Packet, hit: &conntrack::Hit, now: u64) -> Rewrite {
    let reply = &hit.value;
    let mut out = unchanged(pkt);
    out.saddr_be = reply.nat_addr_be;
    out.sport_be = reply.nat_port_be;
    if reply.flags & ct::SNAT != 0 {
        out.daddr_be = reply.snat_addr_be;
        out.dport_be = reply.snat_port_be;
    }
    if hit.new_flags != 0 || hit.refreshed {
        let snat = reply.flags & ct::SNAT != 0;
        let forward = CtValue {
            nat_addr_be: pkt.saddr_be,
            nat_port_be: pkt.sport_be,
            snat_addr_be: if snat { pkt.daddr_be } else { 0 },
            snat_port_be: if snat { pkt.dport_be } else { 0 },
            last_seen_ns: now,
            flags: reply.flags | hit.new_flags,
            ..*reply
        };
        other_half(
            config,
            &out,
            pkt.proto,
            CtDirection::Forward,
            now,
            hit.new_flags,
            &forward,
        );
    }
    out
}

/// The other entry of a flow whose packet leaves as `out`: it learns the
/// flags this packet set (a UDP stream, an established or closing TCP flow),
/// and stays as recently used as this one, so the LRU map evicts flows, not
/// halves of them; one it evicted anyway is rebuilt as `rebuilt`.
#[inline(always)]
fn other_half(
    config: &DatapathConfig,
    out: &Rewrite,
    proto: u8,
    direction: CtDirection,
    now: u64,
    flags: u16,
    rebuilt: &CtValue,
) {
    let key = CtKey::new(
        out.daddr_be,
        out.saddr_be,
        out.dport_be,
        out.sport_be,
        proto,
        direction,
    );
    if conntrack::lookup(config, &key, now, flags).is_none()
        && conntrack::insert(&key, rebuilt).is_ok()
    {
        crate::stats::count(Counter::ConntrackRebuilt);
    }
}

/// What a new connection to a frontend gets.
pub enum Pick {
    Backend(BackendId, Backend),
    /// No backend in the set the client may use.
    Empty,
}

/// Balances a new connection to `frontend` (found at `key`). Clients of
/// this node (`local_client`: its pods, and its own sockets) reaching an
/// external frontend whose policy is Local bypass the policy, as upstream
/// short-circuits them, as if they went out to the load balancer and back.
#[inline(always)]
pub fn pick(key: ServiceKey, frontend: &ServiceValue, local_client: bool) -> Result<Pick, Counter> {
    let (set_key, set) =
        if frontend.has(svc::EXTERNAL) && frontend.has(svc::POLICY_LOCAL) && local_client {
            let k = key.with_scope(Scope::ClusterWide);
            (k, lb::frontend(&k).unwrap_or_default())
        } else {
            (key, *frontend)
        };
    if set.count == 0 {
        return Ok(Pick::Empty);
    }
    let (id, backend) = lb::select(&set_key, &set)?;
    Ok(Pick::Backend(id, backend))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn new_flow(
    config: &DatapathConfig,
    pkt: &Packet,
    ifindex: u32,
    now: u64,
    key: ServiceKey,
    frontend: &ServiceValue,
    forward_key: &CtKey,
    hook: u8,
) -> Result<Verdict, Counter> {
    if frontend.has(svc::SOURCE_RANGES) && !source_allowed(frontend.service_id, pkt.saddr_be) {
        return Err(Counter::DropSourceRange);
    }
    let local_client = config::from_local_pod(config, pkt.saddr_be, ifindex);
    let external = frontend.has(svc::EXTERNAL);
    let policy_local = frontend.has(svc::POLICY_LOCAL);

    let (backend_id, backend) = match pick(key, frontend, local_client)? {
        Pick::Backend(id, backend) => (id, backend),
        Pick::Empty => {
            return Ok(if frontend.has(svc::REJECT_WHEN_EMPTY) {
                Verdict::Reject(Counter::RejectNoEndpoints)
            } else {
                Verdict::Drop(Counter::DropNoLocalEndpoints)
            });
        }
    };

    // A backend on this node itself is reached through local delivery,
    // which a masqueraded source (this node's own address) would break.
    let masquerade = (if external {
        !policy_local
    } else {
        config.flags & proxy_common::config::flags::MASQUERADE_ALL != 0
            || (config::detects_local(config) && !local_client)
    } || backend.addr_be == pkt.saddr_be)
        && backend.flags & backend_flags::HOST_LOCAL == 0;

    let mut forward = CtValue {
        nat_addr_be: backend.addr_be,
        nat_port_be: backend.port_be,
        service_id: frontend.service_id,
        backend_id,
        last_seen_ns: now,
        created_ns: now,
        ..CtValue::default()
    };
    let mut reply = CtValue {
        nat_addr_be: pkt.daddr_be,
        nat_port_be: pkt.dport_be,
        ..forward
    };
    let mut out = unchanged(pkt);
    out.daddr_be = backend.addr_be;
    out.dport_be = backend.port_be;

    let masquerade = masquerade && config.masquerade_addr_be != 0;
    let reply_key = CtKey::new(
        backend.addr_be,
        pkt.saddr_be,
        backend.port_be,
        pkt.sport_be,
        pkt.proto,
        CtDirection::Reply,
    );
    // The source a new port is claimed on: the masquerade address, or the
    // client's own when another live flow's replies already come back on
    // this flow's reply tuple (the client reached the same endpoint from the
    // same port through another frontend); as the kernel's NAT, which picks
    // a unique tuple, this flow then gets a source port of its own.
    let snat_addr_be = if masquerade {
        config.masquerade_addr_be
    } else if conntrack::peek(config, &reply_key, now).is_some_and(|other| {
        other.flags & ct::SNAT != 0
            || other.nat_addr_be != pkt.daddr_be
            || other.nat_port_be != pkt.dport_be
    }) {
        pkt.saddr_be
    } else {
        0
    };
    if snat_addr_be != 0 {
        reply.flags = ct::SNAT;
        reply.snat_addr_be = pkt.saddr_be;
        reply.snat_port_be = pkt.sport_be;
        let port_be = claim_snat_port(config, pkt, snat_addr_be, &backend, &reply, now)?;
        forward.flags = ct::SNAT;
        forward.snat_addr_be = snat_addr_be;
        forward.snat_port_be = port_be;
        out.saddr_be = snat_addr_be;
        out.sport_be = port_be;
        if masquerade {
            crate::stats::count(Counter::Masqueraded);
        }
    } else {
        // Reply state first: a reply can never arrive before the request is forwarded.
        conntrack::insert(&reply_key, &reply)?;
    }
    conntrack::insert(forward_key, &forward)?;
    let left = Tuple {
        saddr_be: out.saddr_be,
        daddr_be: out.daddr_be,
        sport_be: out.sport_be,
        dport_be: out.dport_be,
        proto: pkt.proto,
    };
    let ids = (frontend.service_id, backend_id);
    crate::monitor::flow(hook, ifindex, &pkt.tuple(), &left, ids, snat_addr_be != 0);
    Ok(Verdict::Forward(out, Counter::NewFlow))
}

#[inline(always)]
pub fn source_allowed(service_id: u32, saddr_be: u32) -> bool {
    let key = Key::new(
        64,
        SourceRange {
            service_be: service_id.to_be(),
            addr_be: saddr_be,
        },
    );
    SOURCE_RANGES.get(&key).is_some()
}

const SNAT_ATTEMPTS: u32 = 8;

/// Finds a source port whose reply tuple (backend → `addr_be`:port) no
/// live flow uses, and claims it with the reply entry.
#[inline(always)]
fn claim_snat_port(
    config: &DatapathConfig,
    pkt: &Packet,
    addr_be: u32,
    backend: &Backend,
    reply: &CtValue,
    now: u64,
) -> Result<u16, Counter> {
    let (min, max) = if config.snat_port_min == 0 || config.snat_port_max < config.snat_port_min {
        (61000u32, 65535u32)
    } else {
        (config.snat_port_min as u32, config.snat_port_max as u32)
    };
    let span = max - min + 1;
    let mut port = min + lb::below(span);
    for _ in 0..SNAT_ATTEMPTS {
        let port_be = (port as u16).to_be();
        let key = CtKey::new(
            backend.addr_be,
            addr_be,
            backend.port_be,
            port_be,
            pkt.proto,
            CtDirection::Reply,
        );
        if conntrack::claim(config, &key, reply, now) {
            return Ok(port_be);
        }
        port = min + lb::below(span);
    }
    Err(Counter::DropSnatExhausted)
}
