//! The conntrack collector (`proxy_common::collector`): sweeps of both
//! conntrack tables that delete the entries whose idle timeout passed.
//!
//! While an agent runs, it sweeps from user space and hands what it did to
//! `ct_collector_sweep` (run through BPF_PROG_TEST_RUN), which records it
//! and pushes the timer back ([`AGENT_GRACE_NS`]). The timer, which
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
        AGENT_GRACE_NS, AgentSweep, CollectorStats, CollectorValue, KICK_GAP_NS, KICK_GAP_SWEEPS,
        Removal, SWEEP_INTERVAL_NS, removal,
    },
};

use crate::{
    conntrack::coarse_ns,
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
        let pressure = (*slot).stats.kick_pending();
        sweep(&mut (*slot).stats, pressure);
        bpf_timer_start(&raw mut (*slot).timer, SWEEP_INTERVAL_NS, 0);
    }
    0
}

/// Records the agent's sweep (`report`) and pushes the timer back by
/// [`AGENT_GRACE_NS`]. A kick's sweep is the timer's, at once, but a push
/// landing between the kick and its firing cancels that firing: when a
/// table asked for a sweep after the agent's had started, this program
/// sweeps under pressure in its place. 0, or -1 without the collector's value.
#[inline(always)]
pub fn record_agent_sweep(report: &AgentSweep) -> i64 {
    let Some(slot) = CT_COLLECTOR.get_ptr_mut(0) else {
        return -1;
    };
    // SAFETY: `slot` points into the array's only value; the helper checks the timer.
    unsafe {
        let stats = &mut (*slot).stats;
        stats.live = report.live;
        stats.live6 = report.live6;
        stats.sweeps += 1;
        stats.removed += report.removed;
        stats.removed_under_pressure += report.removed_under_pressure;
        // The timer may have swept since the agent's sweep started (a kick
        // meanwhile): that later sweep is the last.
        stats.last_sweep_ns = stats.last_sweep_ns.max(report.started_ns);
        stats.last_sweep_took_ns = report.took_ns;
        if stats.kick_pending() {
            sweep(stats, true);
        }
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

/// Deletes the entry if [`removal`] says so. Always 0: go on.
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
        let why = removal(
            &*ctx.config,
            ctx.now,
            ctx.pressure != 0,
            (*key).proto,
            value.flags,
            value.last_seen_ns,
        );
        if let Some(why) = why
            && bpf_map_delete_elem(map, key as *const c_void) == 0
        {
            ctx.removed += 1;
            if why == Removal::Unanswered {
                ctx.removed_under_pressure += 1;
            }
        }
    }
    0
}
