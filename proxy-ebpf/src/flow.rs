//! What to do with a packet: the service logic shared by the TC and XDP programs.
//! It reads and writes maps only; applying the verdict to the packet is the
//! caller's job.

use aya_ebpf::maps::lpm_trie::Key;
use proxy_common::{
    BackendId, BackendOf, Counter, CtDirection, CtKeyOf, DatapathConfig, Family, Scope,
    ServiceKeyOf, ServiceValue, SourceRangeOf, V4, V6, backend::flags as backend_flags,
    conntrack::flags as ct, maglev::flow_hash, monitor::hook as monitor_hook,
    service::flags as svc,
};

use crate::{
    config,
    conntrack::{self, Clock},
    ip::{Ip, Scratch},
    lb,
    monitor::FlowIds,
    packet::{Packet, tcp_flags},
};

/// The tuple a packet leaves with.
#[derive(Clone, Copy)]
pub struct Rewrite<F: Family> {
    pub saddr_be: F::Addr,
    pub sport_be: u16,
    pub daddr_be: F::Addr,
    pub dport_be: u16,
}

pub enum Verdict<F: Family> {
    /// Not service traffic: leave the packet alone.
    Pass,
    Drop(Counter),
    /// Answer with a TCP RST or ICMP port unreachable.
    Reject(Counter),
    /// Rewrite to the given tuple and send it on (by the flow's cached next
    /// hop when it has one).
    Forward(Rewrite<F>, Counter, Option<conntrack::HopCache>),
}

#[inline(always)]
fn key_of<F: Ip>(pkt: &Packet<F>) -> CtKeyOf<F> {
    CtKeyOf::new(
        pkt.saddr_be,
        pkt.daddr_be,
        pkt.sport_be,
        pkt.dport_be,
        pkt.proto,
    )
}

#[inline(always)]
fn unchanged<F: Ip>(pkt: &Packet<F>) -> Rewrite<F> {
    Rewrite {
        saddr_be: pkt.saddr_be,
        sport_be: pkt.sport_be,
        daddr_be: pkt.daddr_be,
        dport_be: pkt.dport_be,
    }
}

/// The conntrack flags a TCP FIN or RST in `direction` sets.
#[inline(always)]
fn closing<F: Ip>(pkt: &Packet<F>, direction: CtDirection) -> u16 {
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
fn opens<F: Ip>(pkt: &Packet<F>) -> bool {
    pkt.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
}

#[inline(always)]
pub fn decide<F: Ip>(pkt: &Packet<F>, ifindex: u32, hook: u8) -> Verdict<F> {
    let Some(config) = config::get() else {
        return Verdict::Pass;
    };
    if hook == monitor_hook::XDP && !crate::filter::may_finish(config, pkt) {
        return no_frontend(config, pkt, hook);
    }
    // XDP leaves a datagram's later fragments to TC, which rewrites their
    // addresses alone (`nat::apply`).
    if hook == monitor_hook::XDP && pkt.later_fragment {
        return Verdict::Pass;
    }
    let clock = Clock::lazy();
    // One lookup finds either half of a live flow: its own tuple.
    let hit = lookup_own(config, pkt, &clock, None);
    let now = || clock.now::<F>();
    if let Some(hit) = hit.as_ref().filter(|h| h.direction == CtDirection::Reply) {
        let out = reverse(config, pkt, hit, now());
        return Verdict::Forward(out, Counter::ReplyNat, Some(hit.hop));
    }
    if let Some(hit) = hit {
        let flow = hit.value;
        // The entry as it was before this packet: a SYN that itself carries
        // a FIN or RST does not reopen its own flow.
        let flags_before = flow.flags & !hit.new_flags;
        if opens(pkt) && flags_before & ct::FINISHED != 0 {
            // A client reusing the tuple of a finished connection opens a new one.
            crate::stats::count(Counter::Reopened);
            forget::<F>(now());
        } else {
            // The agent removes a backend's entry once no service uses it (a
            // pod deleted, or terminating while others are ready). A flow to
            // it goes on, as upstream's conntrack keeps it: a TCP or SCTP
            // connection until it ends (a terminating pod finishes what it
            // serves), a datagram flow until the agent flushes it when its
            // endpoint no longer serves (`flow_flush`), as upstream does. A
            // SYN reusing the tuple is balanced again.
            let connection =
                pkt.proto == proxy_common::proto::TCP || pkt.proto == proxy_common::proto::SCTP;
            let check = connection && opens(pkt);
            let live = !check
                || lb::backend::<F>(flow.backend_id).is_some_and(|b| {
                    b.addr_be == flow.nat_addr_be && b.port_be == flow.nat_port_be
                });
            if live {
                let mut out = unchanged(pkt);
                out.daddr_be = flow.nat_addr_be;
                out.dport_be = flow.nat_port_be;
                if flow.flags & ct::SNAT != 0 {
                    out.saddr_be = flow.snat_addr_be;
                    out.sport_be = flow.snat_port_be;
                }
                if hit.new_flags != 0 || hit.refreshed {
                    other_half(
                        config,
                        &OtherHalf {
                            pkt,
                            out: &out,
                            hit: &hit,
                            now: now(),
                        },
                        CtDirection::Reply,
                    );
                }
                return Verdict::Forward(out, Counter::Established, Some(hit.hop));
            }
            crate::stats::count(Counter::Rebalanced);
            forget::<F>(now());
        }
    }

    // A later fragment opens no flow: its first fragment did, or it passes.
    if pkt.later_fragment {
        return Verdict::Pass;
    }
    let key = ServiceKeyOf::<F>::frontend(pkt.daddr_be, pkt.dport_be, pkt.proto);
    let frontend = lb::frontend(&key).filter(|f| !f.has(svc::HOST_ONLY));
    let Some(frontend) = frontend else {
        return no_frontend(config, pkt, hook);
    };
    let arrival = Arrival {
        ifindex,
        now: now(),
        hook,
    };
    match new_flow(config, pkt, &arrival, &frontend) {
        Ok(v) => v,
        Err(counter) => Verdict::Drop(counter),
    }
}

/// Removes the flow whose forward entry a client's SYN found (its key still
/// in `Scratch::key`, as the lookup left it), when a new one is to replace
/// it (the old one finished, or its backend left): as the kernel's
/// conntrack drops the old connection when a SYN reuses its tuple. Left
/// behind, a late packet of the old backend would still be translated to
/// the client and rebuild the forward half (`other_half`); and if the new
/// flow cannot be opened, the old forward half would keep sending on a
/// reply tuple that may be another flow's by then.
#[inline(always)]
fn forget<F: Ip>(now: u64) {
    if F::AF == V6::AF {
        ct_forget6(now);
    } else {
        ct_forget4(now);
    }
}

// Global functions, as the port claim's: the new flow's frame on top of
// this one's would not fit in 512 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn ct_forget4(now: u64) -> u32 {
    forget_flow::<V4>(now)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn ct_forget6(now: u64) -> u32 {
    forget_flow::<V6>(now)
}

/// [`forget`]'s work: 1 when a flow was removed.
#[inline(always)]
fn forget_flow<F: Ip>(now: u64) -> u32 {
    let (Some(config), Some(Scratch { key, other_key, .. })) = (config::get(), F::scratch()) else {
        return 0;
    };
    let key: &CtKeyOf<F> = key;
    // SAFETY: the reference from the map lookup stays valid for this program run.
    let Some(flow) = (unsafe { F::conntrack().get(key) }) else {
        return 0;
    };
    let snat = flow.flags & ct::SNAT != 0;
    let (client_addr_be, client_port_be) = if snat {
        (flow.snat_addr_be, flow.snat_port_be)
    } else {
        (key.saddr_be, key.sport_be)
    };
    *other_key = CtKeyOf::new(
        flow.nat_addr_be,
        client_addr_be,
        flow.nat_port_be,
        client_port_be,
        key.proto,
    );
    // The reply half only while it is still this flow's: the tuple may be
    // another's now.
    let ours = conntrack::live(config, other_key, now).is_some_and(|reply| {
        reply.flags & ct::REPLY != 0
            && (reply.flags & ct::SNAT != 0) == snat
            && reply.nat_addr_be == key.daddr_be
            && reply.nat_port_be == key.dport_be
            && (!snat || (reply.snat_addr_be == key.saddr_be && reply.snat_port_be == key.sport_be))
    });
    if ours {
        let _ = F::conntrack().remove(other_key);
    }
    let _ = F::conntrack().remove(key);
    1
}

/// A packet no frontend claims: rejected when its destination is a
/// cluster IP (an unserved port of it), dropped when it is an unallocated
/// address of a service CIDR, else passed on. XDP passes rejects on to TC,
/// which answers them: there the cluster-IP marker matters only inside a
/// service CIDR, so pass-through traffic pays no lookup for it.
#[inline(always)]
fn no_frontend<F: Ip>(config: &DatapathConfig, pkt: &Packet<F>, hook: u8) -> Verdict<F> {
    let cluster_ip = || {
        lb::frontend(&ServiceKeyOf::<F>::cluster_ip(pkt.daddr_be))
            .is_some_and(|m| m.has(svc::CLUSTER_IP_MARKER))
    };
    if hook == monitor_hook::XDP {
        return if config::in_service_cidr::<F>(config, pkt.daddr_be) && !cluster_ip() {
            Verdict::Drop(Counter::DropUnallocated)
        } else {
            Verdict::Pass
        };
    }
    if cluster_ip() {
        Verdict::Reject(Counter::RejectUnknownPort)
    } else if config::in_service_cidr::<F>(config, pkt.daddr_be) {
        Verdict::Drop(Counter::DropUnallocated)
    } else {
        Verdict::Pass
    }
}

/// The live entry of `pkt`'s own tuple (of either half, or `only` the one
/// given), recording the flags the packet sets: a FIN or RST, and on a
/// reply that a reply was seen. The key is built in scratch memory: two
/// 40-byte IPv6 keys on the stack would not fit beside the rest.
#[inline(always)]
fn lookup_own<F: Ip>(
    config: &DatapathConfig,
    pkt: &Packet<F>,
    clock: &Clock,
    only: Option<CtDirection>,
) -> Option<conntrack::Hit<F>> {
    let key = &mut F::scratch()?.key;
    *key = key_of(pkt);
    conntrack::lookup(config, key, clock, |direction| {
        if only.is_some_and(|o| o != direction) {
            return None;
        }
        let seen = match direction {
            CtDirection::Forward => 0,
            CtDirection::Reply => ct::SEEN_REPLY,
        };
        Some(seen | closing(pkt, direction))
    })
}

/// Where and when a packet arrived.
#[derive(Clone, Copy)]
pub struct Arrival {
    pub ifindex: u32,
    pub now: u64,
    pub hook: u8,
}

/// A reply of a translated flow, rewritten; `None` for anything else.
#[inline(always)]
pub fn reply<F: Ip>(config: &DatapathConfig, pkt: &Packet<F>) -> Option<Rewrite<F>> {
    let clock = Clock::lazy();
    let hit = lookup_own(config, pkt, &clock, Some(CtDirection::Reply))?;
    Some(reverse(config, pkt, &hit, clock.now::<F>()))
}

/// A reply, whose entry `hit` was found, rewritten.
#[inline(always)]
fn reverse<F: Ip>(
    config: &DatapathConfig,
    pkt: &Packet<F>,
    hit: &conntrack::Hit<F>,
    now: u64,
) -> Rewrite<F> {
    // Replies get the frontend back as source and, when masqueraded, the client as destination.
    let reply = hit.value;
    let mut out = unchanged(pkt);
    out.saddr_be = reply.nat_addr_be;
    out.sport_be = reply.nat_port_be;
    if reply.flags & ct::SNAT != 0 {
        out.daddr_be = reply.snat_addr_be;
        out.dport_be = reply.snat_port_be;
    }
    if hit.new_flags != 0 || hit.refreshed {
        other_half(
            config,
            &OtherHalf {
                pkt,
                out: &out,
                hit,
                now,
            },
            CtDirection::Forward,
        );
    }
    out
}

/// A packet of a live flow, leaving as `out`, whose entry `hit` was found.
pub struct OtherHalf<'a, F: Ip> {
    pkt: &'a Packet<F>,
    out: &'a Rewrite<F>,
    hit: &'a conntrack::Hit<F>,
    now: u64,
}

/// The other entry of a flow (in `direction`): it learns the flags this
/// packet set (a UDP stream, an established or closing TCP flow), and stays
/// as recently used as this one, so the LRU map evicts flows, not halves of
/// them; one it evicted anyway is rebuilt from this one. At most once a
/// second per flow, so a call of its own (and a frame of its own) is cheap.
#[inline(always)]
fn other_half<F: Ip>(config: &DatapathConfig, half: &OtherHalf<F>, direction: CtDirection) {
    let OtherHalf { pkt, out, hit, now } = *half;
    let Some(Scratch { key, value, .. }) = F::scratch() else {
        return;
    };
    *key = CtKeyOf::new(
        out.daddr_be,
        out.saddr_be,
        out.dport_be,
        out.sport_be,
        pkt.proto,
    );
    // An entry of the other kind there would be another flow's, not this
    // one's to replace (the datapath never lets that happen).
    let present = conntrack::lookup(config, key, &Clock::at(now), |found| {
        Some(if found == direction { hit.new_flags } else { 0 })
    });
    if present.is_some() {
        return;
    }
    // The other half's view of the same packet: a reply entry restores the
    // frontend as source (the packet's destination) and the client as
    // destination; a forward entry the other way round.
    let (nat_addr_be, nat_port_be, client_addr_be, client_port_be) = match direction {
        CtDirection::Reply => (pkt.daddr_be, pkt.dport_be, pkt.saddr_be, pkt.sport_be),
        CtDirection::Forward => (pkt.saddr_be, pkt.sport_be, pkt.daddr_be, pkt.dport_be),
    };
    let snat = hit.value.flags & ct::SNAT != 0;
    crate::mem::copy(value, hit.value);
    value.flags = match direction {
        CtDirection::Reply => value.flags | ct::REPLY,
        CtDirection::Forward => value.flags & !ct::REPLY,
    };
    value.nat_addr_be = nat_addr_be;
    value.nat_port_be = nat_port_be;
    value.snat_addr_be = if snat {
        client_addr_be
    } else {
        F::unspecified()
    };
    value.snat_port_be = if snat { client_port_be } else { 0 };
    value.last_seen_ns = now;
    if conntrack::insert(key, value).is_ok() {
        crate::stats::count(Counter::ConntrackRebuilt);
    }
}

/// What a new connection to a frontend gets.
pub enum Pick<F: Family> {
    Backend(BackendId, BackendOf<F>),
    /// No backend in the set the client may use.
    Empty,
}

/// Balances a new connection of `client` to `frontend` (found at `key`),
/// to the backend it is pinned to when the service has session affinity.
/// Clients of this node (`local_client`: its pods, and its own sockets)
/// reaching an external frontend whose policy is Local bypass the policy,
/// as upstream short-circuits them, as if they went out to the load
/// balancer and back.
#[inline(always)]
pub fn pick<F: Ip>(
    key: ServiceKeyOf<F>,
    frontend: &ServiceValue,
    local_client: bool,
    client: F::Addr,
    now: u64,
) -> Result<Pick<F>, Counter> {
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
    let affinity = frontend.has(svc::AFFINITY);
    if affinity
        && let Some((id, backend)) = crate::affinity::pinned(frontend, &set_key, &set, client, now)
    {
        crate::stats::count(Counter::AffinityHit);
        return Ok(Pick::Backend(id, backend));
    }
    let (slot, id, backend) = lb::select(&set_key, &set)?;
    if affinity {
        crate::affinity::pin(frontend, &set_key, client, (slot, id), now);
    }
    Ok(Pick::Backend(id, backend))
}

/// Keeps the hash of a new flow's client tuple for a Maglev lookup
/// (`proxy_common::maglev`) in scratch memory.
// A BPF-to-BPF call, and the hash passed in scratch memory: in the IPv6
// new-flow frame, neither the address's words nor one more live value fit.
#[inline(never)]
fn note_tuple_hash<F: Ip>(pkt: &Packet<F>) {
    if let Some(scratch) = F::scratch() {
        scratch.maglev_hash = flow_hash::<F>(&pkt.saddr_be, pkt.sport_be, pkt.dport_be, pkt.proto);
    }
}

// Not inlined (a BPF-to-BPF call, so at most five arguments): the
// new-flow path's state gets a stack frame of its own, which the IPv6
// instance needs to stay within 512 bytes.
#[inline(always)]
fn new_flow<F: Ip>(
    config: &DatapathConfig,
    pkt: &Packet<F>,
    arrival: &Arrival,
    frontend: &ServiceValue,
) -> Result<Verdict<F>, Counter> {
    let Arrival { ifindex, now, .. } = *arrival;
    if frontend.has(svc::SOURCE_RANGES) && !source_allowed::<F>(frontend.service_id, pkt.saddr_be) {
        return Err(Counter::DropSourceRange);
    }
    let local_client = config::from_local_pod::<F>(config, pkt.saddr_be, ifindex);
    let external = frontend.has(svc::EXTERNAL);
    let policy_local = frontend.has(svc::POLICY_LOCAL);

    let key = ServiceKeyOf::<F>::frontend(pkt.daddr_be, pkt.dport_be, pkt.proto);
    if frontend.has(svc::MAGLEV) {
        note_tuple_hash(pkt);
    }
    let (backend_id, backend) = match pick(key, frontend, local_client, pkt.saddr_be, now)? {
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
            || (config::detects_local::<F>(config) && !local_client)
    } || backend.addr_be == pkt.saddr_be)
        && backend.flags & backend_flags::HOST_LOCAL == 0;
    let masquerade_addr = F::masquerade_addr(config);
    let masquerade = masquerade && masquerade_addr != F::unspecified();

    // One key and one value (in per-CPU scratch memory) serve both
    // entries, the reply half first: a reply can never arrive before the
    // request is forwarded.
    let scratch = F::scratch().ok_or(Counter::DropConntrackFull)?;
    let Scratch { key, value, .. } = scratch;
    *key = CtKeyOf::new(
        backend.addr_be,
        pkt.saddr_be,
        backend.port_be,
        pkt.sport_be,
        pkt.proto,
    );
    crate::mem::zero(value);
    value.nat_addr_be = pkt.daddr_be;
    value.nat_port_be = pkt.dport_be;
    value.flags = ct::REPLY;
    value.service_id = frontend.service_id;
    value.backend_id = backend_id;
    value.last_seen_ns = now;
    value.created_ns = now;
    // The source a new port is claimed on: the masquerade address, or the
    // client's own when another live flow holds this flow's reply tuple
    // (the client reached the same endpoint from the same port through
    // another frontend, or the tuple is another flow's own); as the
    // kernel's NAT, which picks a unique tuple, this flow then gets a
    // source port of its own.
    // Inserted only where the tuple is free, as it nearly always is: one
    // map operation, not a lookup and then an insert.
    let reply_inserted = !masquerade && conntrack::insert_new(key, value);
    let snat_addr_be = if masquerade {
        masquerade_addr
    } else if !reply_inserted
        && conntrack::live(config, key, now).is_some_and(|other| {
            other.flags & ct::REPLY == 0
                || other.flags & ct::SNAT != 0
                || other.nat_addr_be != pkt.daddr_be
                || other.nat_port_be != pkt.dport_be
        })
    {
        pkt.saddr_be
    } else {
        F::unspecified()
    };
    let snat = snat_addr_be != F::unspecified();
    let mut out = unchanged(pkt);
    out.daddr_be = backend.addr_be;
    out.dport_be = backend.port_be;
    if snat {
        value.flags |= ct::SNAT;
        value.snat_addr_be = pkt.saddr_be;
        value.snat_port_be = pkt.sport_be;
        key.daddr_be = snat_addr_be;
        out.saddr_be = snat_addr_be;
        out.sport_be = claim_snat_port::<F>(now)?;
        if masquerade {
            crate::stats::count(Counter::Masqueraded);
        }
    } else if !reply_inserted {
        // An expired flow's entry, or this flow's own from an earlier
        // connection through the same frontend: replaced.
        conntrack::insert(key, value)?;
    }
    // Now the forward half: the backend, and the source it leaves with.
    value.flags &= !ct::REPLY;
    value.nat_addr_be = backend.addr_be;
    value.nat_port_be = backend.port_be;
    value.snat_addr_be = if snat { out.saddr_be } else { F::unspecified() };
    value.snat_port_be = if snat { out.sport_be } else { 0 };
    *key = key_of(pkt);
    conntrack::insert(key, value)?;
    let ids = FlowIds {
        service_id: frontend.service_id,
        backend_id,
        snat,
    };
    crate::monitor::flow(arrival, pkt, &out, &ids);
    Ok(Verdict::Forward(out, Counter::NewFlow, None))
}

#[inline(always)]
pub fn source_allowed<F: Ip>(service_id: u32, saddr_be: F::Addr) -> bool {
    let key = Key::new(
        32 + F::BITS,
        SourceRangeOf::<F> {
            service_be: service_id.to_be(),
            addr_be: saddr_be,
        },
    );
    F::source_ranges().get(&key).is_some()
}

const SNAT_ATTEMPTS: u32 = 8;

/// Finds a source port whose reply tuple (`Scratch::key` with that port as
/// its destination port) no live flow uses, and claims it with the reply
/// entry in `Scratch::value`; when every attempt found a flow there, takes
/// over one that only a closed flow held (`conntrack::take_over`).
#[inline(always)]
fn claim_snat_port<F: Ip>(now: u64) -> Result<u16, Counter> {
    let v6 = F::AF == V6::AF;
    let mut port_be = if v6 {
        snat_claim_port6(now)
    } else {
        snat_claim_port4(now)
    };
    if port_be & CLOSED_ONLY != 0 {
        port_be = if v6 {
            snat_take_over6(now)
        } else {
            snat_take_over4(now)
        };
    }
    match port_be {
        0 => Err(Counter::DropSnatExhausted),
        port_be => Ok(port_be as u16),
    }
}

/// In [`claim_port`]'s answer: no free tuple was found, but `Scratch::key`
/// is one only a closed flow holds.
const CLOSED_ONLY: u32 = 1 << 16;

// Global functions: the verifier checks the claim (up to eight conntrack
// lookups and inserts) once, for any state, instead of on every path of
// the program that opens a masqueraded flow. They take the scratch key and
// value from the map themselves (a global function's arguments are
// scalars); the caller writes the key whole again before reading it. The
// take-over is a function of its own, not part of the claim's: the two
// frames on top of the new flow's would not fit in 512 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn snat_claim_port4(now: u64) -> u32 {
    claim_port::<V4>(now)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn snat_claim_port6(now: u64) -> u32 {
    claim_port::<V6>(now)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn snat_take_over4(now: u64) -> u32 {
    take_over_port::<V4>(now)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn snat_take_over6(now: u64) -> u32 {
    take_over_port::<V6>(now)
}

/// The masquerade port range and the second one (`(0, 0)`: none), host order.
#[inline(always)]
fn snat_port_ranges(config: &DatapathConfig) -> ((u32, u32), (u32, u32)) {
    let first = if config.snat_port_min == 0 || config.snat_port_max < config.snat_port_min {
        (61000u32, 65535u32)
    } else {
        (config.snat_port_min as u32, config.snat_port_max as u32)
    };
    let (min2, max2) = (config.snat_port_min2 as u32, config.snat_port_max2 as u32);
    let second = if min2 != 0 && max2 >= min2 {
        (min2, max2)
    } else {
        (0, 0)
    };
    (first, second)
}

/// Whether `port` (host order) is one masqueraded flows are given.
#[inline(always)]
pub fn is_snat_port(config: &DatapathConfig, port: u16) -> bool {
    let ((min, max), (min2, max2)) = snat_port_ranges(config);
    let port = port as u32;
    (min..=max).contains(&port) || (min2 != 0 && (min2..=max2).contains(&port))
}

/// The claimed port (network order); 0 when every attempt found its tuple
/// taken by a live flow, [`CLOSED_ONLY`] when some were only held by closed
/// ones (the first such port then in `Scratch::key`).
#[inline(always)]
fn claim_port<F: Ip>(now: u64) -> u32 {
    let (Some(config), Some(Scratch { key, value, .. })) = (config::get(), F::scratch()) else {
        return 0;
    };
    let ((min, max), (min2, max2)) = snat_port_ranges(config);
    let span = max - min + 1;
    let span2 = if min2 != 0 { max2 - min2 + 1 } else { 0 };
    let mut closed_port_be = 0u16;
    for _ in 0..SNAT_ATTEMPTS {
        let pick = lb::below(span + span2);
        let port = if pick < span {
            min + pick
        } else {
            min2 + (pick - span)
        };
        key.dport_be = (port as u16).to_be();
        match conntrack::claim(config, key, value, now) {
            conntrack::Claim::Claimed => return key.dport_be as u32,
            conntrack::Claim::Closed if closed_port_be == 0 => closed_port_be = key.dport_be,
            _ => {}
        }
    }
    if closed_port_be == 0 {
        return 0;
    }
    key.dport_be = closed_port_be;
    CLOSED_ONLY
}

/// [`claim_port`]'s closed flow's port, taken over: the port, or 0 when its
/// tuple is no longer a closed flow's.
#[inline(always)]
fn take_over_port<F: Ip>(now: u64) -> u32 {
    let (
        Some(config),
        Some(Scratch {
            key,
            value,
            other_key,
            ..
        }),
    ) = (config::get(), F::scratch())
    else {
        return 0;
    };
    if conntrack::take_over(config, key, value, other_key, now) {
        key.dport_be as u32
    } else {
        0
    }
}
