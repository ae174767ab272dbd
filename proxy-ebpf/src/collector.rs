//! The conntrack collector (`proxy_common::collector`): sweeps of both
//! conntrack tables that delete the entries whose idle timeout passed.
//!
//! While an agent runs, it sweeps (`ct_collector_sweep`, run through
//! BPF_PROG_TEST_RUN from a thread of its own): in process context, where
//! the CPU's softirqs, and so its packets, go on during the sweep. Each of
//! those sweeps pushes the timer back ([`AGENT_GRACE_NS`]). The timer, which
//! the agent arms once (`ct_collector_arm`), sweeps in softirq: when no
//! agent swept for that long (the agent is gone), and at once when a new
//! flow finds a table full. It fires for as long as `CT_COLLECTOR` is
//! pinned, agent or no agent.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_timer,
    btf_maps::Array,
    helpers::{
        bpf_for_each_map_elem, bpf_ktime_get_ns, bpf_map_delete_elem, bpf_timer_init,
        bpf_timer_set_callback, bpf_timer_start,
    },
    macros::btf_map,
};
use proxy_common::{
    CtKeyOf, CtValueOf, DatapathConfig, Family, V4, V6,
    collector::{
        AGENT_GRACE_NS, CollectorStats, CollectorValue, KICK_GAP_NS, KICK_GAP_SWEEPS,
        SWEEP_INTERVAL_NS, UNANSWERED_UNDER_PRESSURE_NS,
    },
    conntrack::flags,
};

use crate::{
    conntrack::{coarse_ns, idle_timeout},
    maps::{CONNTRACK, CONNTRACK6},
};

/// The map value: the kernel finds the timer by its BTF type, so the
/// element is declared here with `bpf_timer`; user space reads it as
/// [`CollectorValue`].
#[repr(C)]
pub struct Collector {
    timer: bpf_timer,
    stats: CollectorStats,
}

const _: () = assert!(core::mem::size_of::<Collector>() == core::mem::size_of::<CollectorValue>());

#[btf_map]
pub static CT_COLLECTOR: Array<Collector, 1> = Array::new();

const CLOCK_MONOTONIC: u64 = 1;
const EBUSY: i64 = 16;

/// Arms the timer: the next sweep after [`SWEEP_INTERVAL_NS`]. A timer an
/// earlier agent armed (a pinned `CT_COLLECTOR`) takes this program's
/// callback, and the old program is released. 0 or a negative errno.
#[inline(always)]
pub fn arm() -> i64 {
    let Some(slot) = CT_COLLECTOR.get_ptr_mut(0) else {
        return -1;
    };
    // SAFETY: `slot` points into the array's only value; the helpers check the timer.
    unsafe {
        let timer = &raw mut (*slot).timer;
        let map = &CT_COLLECTOR as *const _ as *mut c_void;
        let e = bpf_timer_init(timer, map, CLOCK_MONOTONIC);
        if e != 0 && e != -EBUSY {
            return e;
        }
        let e = bpf_timer_set_callback(timer, on_timer as *mut c_void);
        if e != 0 {
            return e;
        }
        bpf_timer_start(timer, SWEEP_INTERVAL_NS, 0)
    }
}

/// A new flow found a table full: a sweep now (at most every
/// [`KICK_GAP_NS`], and every [`KICK_GAP_SWEEPS`] lengths of the last
/// sweep), under pressure.
#[inline(always)]
pub fn kick(now: u64) {
    let Some(slot) = CT_COLLECTOR.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `arm`; two CPUs kicking at once both start the timer, harmless.
    unsafe {
        let stats = &mut (*slot).stats;
        // Capped (at 18 minutes) so the product fits: a 128-bit multiply is no BPF instruction.
        let gap = KICK_GAP_NS.max(stats.last_sweep_took_ns.min(1 << 40) * KICK_GAP_SWEEPS);
        if now.saturating_sub(stats.kicked_ns) < gap {
            return;
        }
        stats.kicked_ns = now;
        bpf_timer_start(&raw mut (*slot).timer, 0, 0);
    }
}

/// One sweep's context, handed to the per-entry callbacks.
#[repr(C)]
struct Sweep {
    config: *const DatapathConfig,
    now: u64,
    pressure: u64,
    visited: u64,
    removed: u64,
    removed_under_pressure: u64,
}

/// The timer's callback: a sweep (under pressure when a full table kicked
/// it), then the next one in [`SWEEP_INTERVAL_NS`].
extern "C" fn on_timer(_map: *mut c_void, _key: *mut u32, slot: *mut Collector) -> i32 {
    // SAFETY: the kernel hands the timer's map value.
    unsafe {
        let pressure = kick_pending(&(*slot).stats);
        sweep(&mut (*slot).stats, pressure);
        bpf_timer_start(&raw mut (*slot).timer, SWEEP_INTERVAL_NS, 0);
    }
    0
}

/// Whether a full table asked for a sweep that has not run yet.
#[inline(always)]
fn kick_pending(stats: &CollectorStats) -> bool {
    stats.kicked_ns != 0 && stats.kicked_ns >= stats.last_sweep_ns
}

/// The agent's sweep; the timer is pushed back by [`AGENT_GRACE_NS`]. A
/// kick's sweep is the timer's, at once, but a push landing between the
/// kick and its firing cancels that firing: then this sweep runs under
/// pressure in its place. 0, or -1 without the collector's value.
#[inline(always)]
pub fn sweep_for_agent() -> i64 {
    let Some(slot) = CT_COLLECTOR.get_ptr_mut(0) else {
        return -1;
    };
    // SAFETY: `slot` points into the array's only value; the helper checks the timer.
    unsafe {
        let pressure = kick_pending(&(*slot).stats);
        sweep(&mut (*slot).stats, pressure);
        // Fails only while the timer is unarmed, as before the agent's first
        // arming: then there is nothing to push back.
        bpf_timer_start(&raw mut (*slot).timer, AGENT_GRACE_NS, 0);
    }
    0
}

/// Both tables, once.
#[inline(always)]
fn sweep(stats: &mut CollectorStats, pressure: bool) {
    let Some(config) = crate::config::get() else {
        return;
    };
    // SAFETY: the kernel's clock helpers and the programs' own maps.
    unsafe {
        let started = bpf_ktime_get_ns();
        let mut ctx = Sweep {
            config,
            now: coarse_ns(),
            pressure: u64::from(pressure),
            visited: 0,
            removed: 0,
            removed_under_pressure: 0,
        };
        let ctx_ptr = &raw mut ctx as *mut c_void;
        bpf_for_each_map_elem(
            &CONNTRACK as *const _ as *mut c_void,
            visit4 as *mut c_void,
            ctx_ptr,
            0,
        );
        let live = ctx.visited - ctx.removed;
        let removed4 = ctx.removed;
        ctx.visited = 0;
        bpf_for_each_map_elem(
            &CONNTRACK6 as *const _ as *mut c_void,
            visit6 as *mut c_void,
            ctx_ptr,
            0,
        );
        stats.live = live;
        stats.live6 = ctx.visited - (ctx.removed - removed4);
        stats.sweeps += 1;
        stats.removed += ctx.removed;
        stats.removed_under_pressure += ctx.removed_under_pressure;
        stats.last_sweep_ns = ctx.now;
        stats.last_sweep_took_ns = bpf_ktime_get_ns() - started;
    }
}

extern "C" fn visit4(
    map: *mut c_void,
    key: *mut CtKeyOf<V4>,
    value: *mut CtValueOf<V4>,
    ctx: *mut Sweep,
) -> i64 {
    visit(map, key, value, ctx)
}

extern "C" fn visit6(
    map: *mut c_void,
    key: *mut CtKeyOf<V6>,
    value: *mut CtValueOf<V6>,
    ctx: *mut Sweep,
) -> i64 {
    visit(map, key, value, ctx)
}

/// Deletes the entry if it expired (or, under pressure, never saw a reply
/// and was idle [`UNANSWERED_UNDER_PRESSURE_NS`]). Always 0: go on.
#[inline(always)]
fn visit<F: Family>(
    map: *mut c_void,
    key: *mut CtKeyOf<F>,
    value: *mut CtValueOf<F>,
    ctx: *mut Sweep,
) -> i64 {
    // SAFETY: the kernel hands the current element and our context.
    unsafe {
        let ctx = &mut *ctx;
        let value = &*value;
        ctx.visited += 1;
        let idle = ctx.now.saturating_sub(value.last_seen_ns);
        let expired = idle > idle_timeout(&*ctx.config, (*key).proto, value.flags);
        let unanswered = ctx.pressure != 0
            && value.flags & flags::SEEN_REPLY == 0
            && idle >= UNANSWERED_UNDER_PRESSURE_NS;
        if (expired || unanswered) && bpf_map_delete_elem(map, key as *const c_void) == 0 {
            ctx.removed += 1;
            if !expired {
                ctx.removed_under_pressure += 1;
            }
        }
    }
    0
}
