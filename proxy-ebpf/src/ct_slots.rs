//! The operations of `proxy_common::ct_table` (the open-addressed conntrack
//! table of cache-line slots) for the programs: `conntrack` uses them on the
//! wide slots, the `ct_table` bench on both kinds. The crate root needs
//! `#![feature(core_intrinsics)]` (BPF's `core` has no atomic
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

/// `key`'s chain in a table of `mask() + 1` slots, as a scalar (what a
/// global function can return; [`Probe::unpack`] makes it a [`Probe`]): `lookup` gives slot `index` of the table, `free` is room for the
/// first free slot seen. The datapath's probe keeps both the lookup's key
/// and `free` in scratch memory and reads the mask again on every probe:
/// its stack frame adds to the deepest call chain's 512 bytes, and this
/// leaves it none.
#[inline(always)]
pub fn probe_packed<F: Family, S: Slot<F>>(
    lookup: impl Fn(u32) -> Option<*mut S>,
    mask: impl Fn() -> u32,
    key: &CtKeyOf<F>,
    free: &mut u64,
) -> u64 {
    let home = hash(key);
    *free = packed::FULL;
    for i in 0..PROBES {
        let Some(slot) = lookup(probe_index(home, i, mask())) else {
            break;
        };
        // SAFETY: a pointer into the array's value, valid for this program run.
        let s = unsafe { &mut *slot };
        // SAFETY: the state word is aligned; another CPU may write it (a
        // compare-and-swap or an aligned store), never half of it.
        let seen = unsafe { s.state().read_volatile() };
        // The index again, not kept across the lookup.
        let index = || u64::from(probe_index(home, i, mask()));
        match seen {
            state::LIVE if s.key() == key => return packed::HIT | index(),
            state::EMPTY if *free == packed::FULL => return packed::FREE | index(),
            state::EMPTY => return *free,
            state::TOMBSTONE | state::OLD_TOMBSTONE if *free == packed::FULL => {
                *free = packed::FREE | seen << 32 | index();
            }
            _ => {}
        }
    }
    *free
}

impl<S> Probe<S> {
    /// [`probe_packed`]'s answer with the slot looked up again in `table`.
    #[inline(always)]
    pub fn unpack(answer: u64, table: &Array<S>) -> Probe<S> {
        let index = answer as u32;
        let Some(slot) = table.get_ptr_mut(index) else {
            return Probe::Full;
        };
        match answer & packed::KIND {
            packed::HIT => Probe::Hit(slot),
            packed::FREE => Probe::Free(slot, (answer >> 32) & 0xff),
            _ => Probe::Full,
        }
    }
}

/// [`probe_packed`]'s answers: the kind in the top byte, a free slot's
/// state in bits 32 to 39, the slot's index in the low 32 bits.
pub mod packed {
    pub const KIND: u64 = 0xff << 56;
    pub const FULL: u64 = 0;
    pub const HIT: u64 = 1 << 56;
    pub const FREE: u64 = 2 << 56;
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
    swap_state::<F, S>(slot, state::LIVE, state::TOMBSTONE)
}

/// Moves `slot` from state `from` to `to`, unless another CPU changed it
/// first (then false).
#[inline(always)]
pub fn swap_state<F: Family, S: Slot<F>>(slot: *mut S, from: u64, to: u64) -> bool {
    // SAFETY: a pointer into the array's value, valid for this program run.
    let s = unsafe { &mut *slot };
    // SAFETY: the state word is aligned and inside the slot.
    let (_, swapped) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Relaxed }>(
            s.state(),
            from,
            to,
        )
    };
    swapped
}
