//! Reports decisions to `proxy-agent monitor` while one holds a lease
//! (see `proxy_common::monitor`). Called only on the slow paths: drops,
//! rejects and new flows.

use aya_ebpf::maps::RingBuf;
use proxy_common::{
    Counter, MonitorEvent,
    monitor::{MONITOR_SLOTS, event_flags, kind},
};

use crate::{
    conntrack,
    maps::{MONITOR, MONITOR_RING_0, MONITOR_RING_1, MONITOR_RING_2, MONITOR_RING_3},
    stats::count,
};

static RINGS: [&RingBuf; MONITOR_SLOTS] = [
    &MONITOR_RING_0,
    &MONITOR_RING_1,
    &MONITOR_RING_2,
    &MONITOR_RING_3,
];

/// The tuple an event is about, before and (for flows) after translation.
#[derive(Clone, Copy, Default)]
pub struct Tuple {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
}

/// Sends `event` (stamped now) to every slot whose lease wants `flows` or
/// drops. A slot never used or released holds 0: no clock is read for it,
/// so with nobody listening this is four array lookups.
#[inline(always)]
fn report(flows: bool, event: &MonitorEvent) {
    let mut now = 0;
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
        if now == 0 {
            now = conntrack::now_ns();
        }
        if now >= until {
            continue;
        }
        let stamped = MonitorEvent {
            time_ns: now,
            ..*event
        };
        if ring.output::<MonitorEvent>(&stamped, 0).is_err() {
            count(Counter::MonitorLost);
        }
    }
}

/// A drop or reject (`what`: `kind::DROP` / `kind::REJECT`) counted by `reason`.
#[inline(always)]
pub fn dropped(what: u8, hook: u8, ifindex: u32, tuple: &Tuple, reason: Counter) {
    report(
        false,
        &MonitorEvent {
            kind: what,
            hook,
            ifindex,
            reason: reason as u8,
            ..event(tuple)
        },
    );
}

/// A new flow to `backend_id` of `service_id`, leaving as `out`.
#[inline(always)]
pub fn flow(hook: u8, ifindex: u32, tuple: &Tuple, out: &Tuple, ids: (u32, u32), snat: bool) {
    report(
        true,
        &MonitorEvent {
            kind: kind::FLOW,
            hook,
            ifindex,
            reason: Counter::NewFlow as u8,
            service_id: ids.0,
            backend_id: ids.1,
            nat_saddr_be: out.saddr_be,
            nat_daddr_be: out.daddr_be,
            nat_sport_be: out.sport_be,
            nat_dport_be: out.dport_be,
            flags: if snat { event_flags::SNAT } else { 0 },
            ..event(tuple)
        },
    );
}

#[inline(always)]
fn event(tuple: &Tuple) -> MonitorEvent {
    MonitorEvent {
        saddr_be: tuple.saddr_be,
        daddr_be: tuple.daddr_be,
        sport_be: tuple.sport_be,
        dport_be: tuple.dport_be,
        proto: tuple.proto,
        ..MonitorEvent::default()
    }
}
