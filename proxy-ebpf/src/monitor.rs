//! Reports decisions to `proxy-agent monitor` while one holds a lease
//! (see `proxy_common::monitor`). Called only on the slow paths: drops,
//! rejects and new flows.

use proxy_common::{
    Counter, MonitorEvent,
    monitor::{event_flags, kind},
};

use crate::{
    conntrack,
    maps::{MONITOR, MONITOR_EVENTS},
    stats::count,
};

/// The tuple an event is about, before and (for flows) after translation.
#[derive(Clone, Copy, Default)]
pub struct Tuple {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
}

#[inline(always)]
fn wanted(flows: bool) -> Option<u64> {
    let control = MONITOR.get(0)?;
    let now = conntrack::now_ns();
    let until = if flows {
        control.flows_until_ns
    } else {
        control.drops_until_ns
    };
    (now < until).then_some(now)
}

/// A drop or reject (`what`: `kind::DROP` / `kind::REJECT`) counted by `reason`.
#[inline(always)]
pub fn dropped(what: u8, hook: u8, ifindex: u32, tuple: &Tuple, reason: Counter) {
    if let Some(now) = wanted(false) {
        emit(
            now,
            &MonitorEvent {
                kind: what,
                hook,
                ifindex,
                reason: reason as u8,
                ..event(tuple)
            },
        );
    }
}

/// A new flow to `backend_id` of `service_id`, leaving as `out`.
#[inline(always)]
pub fn flow(hook: u8, ifindex: u32, tuple: &Tuple, out: &Tuple, ids: (u32, u32), snat: bool) {
    if let Some(now) = wanted(true) {
        emit(
            now,
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

#[inline(always)]
fn emit(now: u64, event: &MonitorEvent) {
    let stamped = MonitorEvent {
        time_ns: now,
        ..*event
    };
    if MONITOR_EVENTS.output::<MonitorEvent>(&stamped, 0).is_err() {
        count(Counter::MonitorLost);
    }
}
