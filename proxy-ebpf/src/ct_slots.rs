//! The operations of `proxy_common::ct_table` (an open-addressed conntrack
//! table of cache-line slots, docs/proposal-conntrack-slots.md) for the
//! programs. Only the `ct_table` bench's object uses it so far; its crate
//! root needs `#![feature(core_intrinsics)]` (BPF's `core` has no atomic
//! compare-and-swap method, the intrinsic lowers to `BPF_CMPXCHG`).

use core::intrinsics::{AtomicOrdering, atomic_cxchg};

use aya_ebpf::maps::Array;
use proxy_common::{
    CtKeyOf, Family,
    ct_table::{CtSlotOf, CtWideSlotOf, PROBES, SlotFamily, hash, probe_index, state},
};

/// A slot the operations work on: a state word and a key, the value its own.
pub trait Slot<F: Family> {
    fn state(&mut self) -> *mut u64;
    fn key(&self) -> &CtKeyOf<F>;
    fn key_mut(&mut self) -> &mut CtKeyOf<F>;
}

macro_rules! slot {
    ($slot:ident) => {
        impl<F: SlotFamily> Slot<F> for $slot<F> {
            #[inline(always)]
            fn state(&mut self) -> *mut u64 {
                &raw mut self.state
            }
            #[inline(always)]
            fn key(&self) -> &CtKeyOf<F> {
                &self.key
            }
            #[inline(always)]
            fn key_mut(&mut self) -> &mut CtKeyOf<F> {
                &mut self.key
            }
        }
    };
}

slot!(CtSlotOf);
slot!(CtWideSlotOf);

/// What a key's chain holds.
pub enum Probe<S> {
    /// The key, live.
    Hit(*mut S),
    /// Not there; the first free slot of its chain (a tombstone, else the
    /// EMPTY one that ended it) and the state it was seen in.
    Free(*mut S, u64),
    /// Not there, and no slot free within `PROBES`: the table is full.
    Full,
}

/// Walks `key`'s chain in `table` (`mask + 1` slots).
#[inline(always)]
pub fn probe<F: Family, S: Slot<F>>(table: &Array<S>, mask: u32, key: &CtKeyOf<F>) -> Probe<S> {
    let home = hash(key);
    let mut free: Option<*mut S> = None;
    for i in 0..PROBES {
        let Some(slot) = table.get_ptr_mut(probe_index(home, i, mask)) else {
            break;
        };
        // SAFETY: a pointer into the array's value, valid for this program run.
        let s = unsafe { &mut *slot };
        // SAFETY: the state word is aligned; another CPU may write it (a
        // compare-and-swap or an aligned store), never half of it.
        let seen = unsafe { s.state().read_volatile() };
        match seen {
            state::LIVE if s.key() == key => return Probe::Hit(slot),
            state::EMPTY => {
                return match free {
                    Some(tombstone) => Probe::Free(tombstone, state::TOMBSTONE),
                    None => Probe::Free(slot, state::EMPTY),
                };
            }
            state::TOMBSTONE if free.is_none() => free = Some(slot),
            _ => {}
        }
    }
    match free {
        Some(tombstone) => Probe::Free(tombstone, state::TOMBSTONE),
        None => Probe::Full,
    }
}

/// Takes `slot`, free in state `seen`, for `key`: `write` fills the value
/// while the slot is BUSY, then it turns LIVE. False when another CPU took
/// it first.
#[inline(always)]
pub fn claim<F: Family, S: Slot<F>>(
    slot: *mut S,
    seen: u64,
    key: &CtKeyOf<F>,
    write: impl FnOnce(&mut S),
) -> bool {
    // SAFETY: a pointer into the array's value, valid for this program run.
    let s = unsafe { &mut *slot };
    // SAFETY: the state word is aligned and inside the slot.
    let (_, claimed) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Relaxed }>(
            s.state(),
            seen,
            state::BUSY,
        )
    };
    if !claimed {
        return false;
    }
    *s.key_mut() = *key;
    write(s);
    // The JIT keeps the stores in program order, and x86 keeps stores in
    // order too: a reader that sees LIVE sees the key and value.
    // SAFETY: as above.
    unsafe { s.state().write_volatile(state::LIVE) };
    true
}

/// Deletes a live slot (it becomes a tombstone); false when it was not live.
#[inline(always)]
pub fn remove<F: Family, S: Slot<F>>(slot: *mut S) -> bool {
    // SAFETY: a pointer into the array's value, valid for this program run.
    let s = unsafe { &mut *slot };
    // SAFETY: the state word is aligned and inside the slot.
    let (_, removed) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Relaxed }>(
            s.state(),
            state::LIVE,
            state::TOMBSTONE,
        )
    };
    removed
}
