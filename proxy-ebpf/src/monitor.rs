//! Reports decisions to `proxy-agent monitor` while one holds a lease
//! (see `proxy_common::monitor`). Called only on the slow paths: drops,
//! rejects and new flows.

use aya_ebpf::maps::RingBuf;
use proxy_common::{
    Counter, Family, MonitorEventOf, V4,
    monitor::{MONITOR_SLOTS, event_flags, hook, kind},
};

use crate::{
    flow::{Arrival, Rewrite},
    ip::Ip,
    maps::{MONITOR, MONITOR_RING_0, MONITOR_RING_1, MONITOR_RING_2, MONITOR_RING_3},
    packet::Packet,
    stats::count,
};

static RINGS: [&RingBuf; MONITOR_SLOTS] = [
    &MONITOR_RING_0,
    &MONITOR_RING_1,
    &MONITOR_RING_2,
    &MONITOR_RING_3,
];

/// The tuple an event is about: a packet's, or what a socket hook was asked for.
#[derive(Clone, Copy, Default)]
pub struct Tuple<F: Family> {
    pub saddr_be: F::Addr,
    pub daddr_be: F::Addr,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
}

/// Sends an event (filled by `fill`, stamped now) to every slot whose
/// lease wants `flows` or drops. A slot never used or released holds 0: no
/// clock is read for it, so with nobody listening this is four array
/// lookups. The event is built in scratch memory (an IPv6 one is too large
/// for the stack) and only when someone listens.
#[inline(always)]
fn report<F: Ip>(flows: bool, fill: impl Fn(&mut MonitorEventOf<F>)) {
    let mut event: Option<&mut MonitorEventOf<F>> = None;
    for (i, ring) in RINGS.iter().enumerate() {
        let Some(slot) = MONITOR.get(i as u32) else {
            continue;
        };
        let until = if flows {
            slot.flows_until_ns
        } else {
            slot.drops_until_ns
        };
        if until == 0 {
            continue;
        }
        if event.is_none() {
            let Some(scratch) = F::scratch() else {
                return;
            };
            let e = &mut scratch.event;
            crate::mem::zero(e);
            fill(e);
            // The precise clock: events are ordered and timed by it.
            // SAFETY: helper without preconditions.
            e.time_ns = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
            event = Some(e);
        }
        let Some(e) = event.as_deref() else {
            return;
        };
        if e.time_ns >= until {
            continue;
        }
        if ring.output::<MonitorEventOf<F>>(e, 0).is_err() {
            count(Counter::MonitorLost);
        }
    }
}

/// A drop or reject of `pkt` (`what`: `kind::DROP` / `kind::REJECT`)
/// counted by `reason`.
// Not inlined: the event is built in a frame of its own, once for all callers.
#[inline(never)]
pub fn dropped<F: Ip>(what: u8, hook: u8, ifindex: u32, pkt: &Packet<F>, reason: Counter) {
    report::<F>(false, |e| {
        e.kind = what;
        e.hook = hook;
        e.ifindex = ifindex;
        e.reason = reason as u8;
        put_packet(e, pkt);
    });
}

/// A packet dropped before its tuple was known (malformed headers).
#[inline(never)]
pub fn dropped_unparsed<F: Ip>(hook: u8, ifindex: u32, reason: Counter) {
    report::<F>(false, |e| {
        e.kind = kind::DROP;
        e.hook = hook;
        e.ifindex = ifindex;
        e.reason = reason as u8;
        e.family = family_byte::<F>();
    });
}

/// A connect or send the socket hooks refused: `tuple` is what was asked.
#[inline(never)]
pub fn refused<F: Ip>(tuple: &Tuple<F>) {
    report::<F>(false, |e| {
        e.kind = kind::REJECT;
        e.hook = hook::SOCKET;
        e.reason = Counter::SockRefused as u8;
        put_tuple(e, tuple);
    });
}

/// What a new flow was balanced to.
pub struct FlowIds {
    pub service_id: u32,
    pub backend_id: u32,
    /// The source was rewritten (masquerade, or a port of its own).
    pub snat: bool,
}

/// A new flow: `pkt` leaving as `out`.
#[inline(always)]
pub fn flow<F: Ip>(at: &Arrival, pkt: &Packet<F>, out: &Rewrite<F>, ids: &FlowIds) {
    report::<F>(true, |e| {
        e.kind = kind::FLOW;
        e.hook = at.hook;
        e.ifindex = at.ifindex;
        e.reason = Counter::NewFlow as u8;
        e.service_id = ids.service_id;
        e.backend_id = ids.backend_id;
        e.nat_saddr_be = out.saddr_be;
        e.nat_daddr_be = out.daddr_be;
        e.nat_sport_be = out.sport_be;
        e.nat_dport_be = out.dport_be;
        e.flags = if ids.snat { event_flags::SNAT } else { 0 };
        put_packet(e, pkt);
    });
}

#[inline(always)]
fn put_packet<F: Ip>(e: &mut MonitorEventOf<F>, pkt: &Packet<F>) {
    put_tuple(
        e,
        &Tuple {
            saddr_be: pkt.saddr_be,
            daddr_be: pkt.daddr_be,
            sport_be: pkt.sport_be,
            dport_be: pkt.dport_be,
            proto: pkt.proto,
        },
    );
}

#[inline(always)]
fn put_tuple<F: Ip>(e: &mut MonitorEventOf<F>, tuple: &Tuple<F>) {
    e.saddr_be = tuple.saddr_be;
    e.daddr_be = tuple.daddr_be;
    e.sport_be = tuple.sport_be;
    e.dport_be = tuple.dport_be;
    e.proto = tuple.proto;
    e.family = family_byte::<F>();
}

/// [`MonitorEventOf::family`]: 0 in IPv4 events (the padding they always had).
#[inline(always)]
fn family_byte<F: Family>() -> u8 {
    if F::AF == V4::AF { 0 } else { F::AF as u8 }
}
