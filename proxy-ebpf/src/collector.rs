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
//!
//! A sweep walks every slot of both tables (`proxy_common::ct_table`): a
//! live entry past its timeout becomes a tombstone, a tombstone becomes an
//! old one, and a run of old tombstones that an EMPTY slot ends is cleared
//! to EMPTY, backwards from it, so that chains stay short.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_timer,
    btf_maps::Array,
    helpers::{
        bpf_for_each_map_elem, bpf_ktime_get_ns, bpf_loop, bpf_timer_init, bpf_timer_set_callback,
        bpf_timer_start,
    },
    macros::btf_map,
    maps::Array as SlotArray,
};
use proxy_common::{
    DatapathConfig, V4, V6,
    collector::{
        AGENT_GRACE_NS, CollectorStats, CollectorValue, KICK_GAP_NS, KICK_GAP_SWEEPS,
        SWEEP_INTERVAL_NS, UNANSWERED_UNDER_PRESSURE_NS,
    },
    conntrack::flags,
    ct_table::{CtWideSlotOf, SlotFamily, state},
};

use crate::{
    conntrack::{coarse_ns, idle_timeout},
    ct_slots,
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

/// One sweep's context, handed to the per-slot callbacks.
#[repr(C)]
struct Sweep {
    config: *const DatapathConfig,
    now: u64,
    pressure: u64,
    /// Live entries seen.
    visited: u64,
    removed: u64,
    removed_under_pressure: u64,
    /// 1: the slot before the one being visited is an old tombstone. A flag,
    /// not a count: the verifier checks the per-slot callback until its
    /// states repeat, which a growing count never does.
    after_old_tombstone: u64,
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
            after_old_tombstone: 0,
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
        ctx.after_old_tombstone = 0;
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
    _map: *mut c_void,
    index: *mut u32,
    slot: *mut CtWideSlotOf<V4>,
    ctx: *mut Sweep,
) -> i64 {
    // SAFETY: the kernel hands the current slot, its index and our context.
    unsafe { visit(*index, slot, &mut *ctx, clear4 as *mut c_void) }
}

extern "C" fn visit6(
    _map: *mut c_void,
    index: *mut u32,
    slot: *mut CtWideSlotOf<V6>,
    ctx: *mut Sweep,
) -> i64 {
    // SAFETY: as in `visit4`.
    unsafe { visit(*index, slot, &mut *ctx, clear6 as *mut c_void) }
}

extern "C" fn clear4(back: u64, empty: *mut u32) -> i64 {
    // SAFETY: `bpf_loop` hands the context `visit` gave it.
    clear_one(&CONNTRACK, unsafe { *empty }, back)
}

extern "C" fn clear6(back: u64, empty: *mut u32) -> i64 {
    // SAFETY: as in `clear4`.
    clear_one(&CONNTRACK6, unsafe { *empty }, back)
}

/// The longest run of old tombstones one EMPTY slot clears (the rest wait
/// for a later sweep, or for an insert to reuse them).
const CLEAR_MAX: u32 = 64;

/// One slot of a sweep. A live entry is deleted if it expired (or, under
/// pressure, never saw a reply and was idle
/// [`UNANSWERED_UNDER_PRESSURE_NS`]). `clear` is the family's
/// [`clear_one`] callback. Always 0: go on.
#[inline(always)]
fn visit<F: SlotFamily>(
    index: u32,
    slot: *mut CtWideSlotOf<F>,
    ctx: &mut Sweep,
    clear: *mut c_void,
) -> i64 {
    // SAFETY: the kernel hands the current slot; its state word is aligned,
    // and other CPUs change it only whole.
    let seen = unsafe { (&raw const (*slot).state).read_volatile() };
    let after_old_tombstone = ctx.after_old_tombstone != 0;
    ctx.after_old_tombstone = 0;
    match seen {
        state::LIVE => {
            ctx.visited += 1;
            // SAFETY: the kernel hands the current slot.
            let (key, value) = unsafe { (&(*slot).key, &(*slot).value) };
            let idle = ctx.now.saturating_sub(value.last_seen_ns);
            // SAFETY: the sweep's configuration, read before the walk.
            let timeout = idle_timeout(unsafe { &*ctx.config }, key.proto, value.flags);
            let expired = idle > timeout;
            let unanswered = ctx.pressure != 0
                && value.flags & flags::SEEN_REPLY == 0
                && idle >= UNANSWERED_UNDER_PRESSURE_NS;
            if (expired || unanswered) && ct_slots::remove::<F, _>(slot) {
                ctx.removed += 1;
                if !expired {
                    ctx.removed_under_pressure += 1;
                }
            }
        }
        state::TOMBSTONE => {
            ct_slots::swap_state::<F, _>(slot, state::TOMBSTONE, state::OLD_TOMBSTONE);
        }
        state::OLD_TOMBSTONE => ctx.after_old_tombstone = 1,
        state::EMPTY if after_old_tombstone => {
            // Through `bpf_loop`, whose callback is verified once: a loop
            // here made the sweep's callback too large to verify.
            let mut empty = index;
            // SAFETY: the callback and its context are this family's.
            unsafe { bpf_loop(CLEAR_MAX, clear, &raw mut empty as *mut c_void, 0) };
        }
        _ => {}
    }
    0
}

/// Turns the old tombstone `back + 1` slots before the EMPTY slot `empty`
/// EMPTY; 1 (stop) at the end of the run (a slot that is no old tombstone:
/// the run's start, or one an insert took meanwhile) or of the table. Nearest first: no chain loses a key, as an insert
/// takes the first free slot of its chain, so no key lies past an EMPTY
/// slot on its chain, and so none past these tombstones.
#[inline(always)]
fn clear_one<F: SlotFamily>(table: &SlotArray<CtWideSlotOf<F>>, empty: u32, back: u64) -> i64 {
    let back = back as u32 + 1;
    if back > empty {
        return 1;
    }
    let Some(slot) = table.get_ptr_mut(empty - back) else {
        return 1;
    };
    if ct_slots::swap_state::<F, _>(slot, state::OLD_TOMBSTONE, state::EMPTY) {
        0
    } else {
        1
    }
}
