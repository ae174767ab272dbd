//! A family's `SLOTS` array (`proxy_common::slots`) mapped into the agent's
//! memory: writing a frontend's backend slots is a few stores, not one
//! `bpf()` call per slot.

use aya::maps::{Array, MapData};
use proxy_common::{BackendId, slots::SlotPair};

use super::mapped_array::MappedArray;

pub struct SlotTable {
    mapped: MappedArray<SlotPair>,
    /// Slot indexes the array holds.
    slots: u32,
}

impl SlotTable {
    /// Maps `array` (created `BPF_F_MMAPABLE`) into memory.
    pub fn new(array: Array<MapData, SlotPair>) -> anyhow::Result<Self> {
        let mapped = MappedArray::new(array, "SLOTS")?;
        let slots = mapped.elements() * proxy_common::slots::SLOTS_PER_ELEMENT;
        Ok(SlotTable { mapped, slots })
    }

    /// How many slot indexes the array holds.
    pub fn capacity(&self) -> u32 {
        self.slots
    }

    pub fn array(&self) -> &Array<MapData, SlotPair> {
        self.mapped.array()
    }

    /// The slots as ids (a slot pair is two aligned 32-bit ids).
    fn ids(&mut self) -> *mut BackendId {
        self.mapped.as_mut_ptr().cast()
    }

    /// Writes `ids` at indexes `first..`; `false` (nothing written) when
    /// they do not fit.
    pub fn write(&mut self, first: u32, ids: &[BackendId]) -> bool {
        if !self.fits(first, ids.len()) {
            return false;
        }
        let base = self.ids();
        for (i, id) in ids.iter().enumerate() {
            // SAFETY: in bounds (checked above); a volatile aligned store,
            // which the datapath reads whole.
            unsafe { base.add(first as usize + i).write_volatile(*id) };
        }
        true
    }

    /// The `count` ids at `first..` (none when out of bounds).
    pub fn read(&self, first: u32, count: usize) -> Vec<BackendId> {
        if !self.fits(first, count) {
            return Vec::new();
        }
        let base = self.mapped_ids();
        (0..count)
            // SAFETY: in bounds (checked above).
            .map(|i| unsafe { base.add(first as usize + i).read_volatile() })
            .collect()
    }

    /// Copies the slots `other` holds (as many as both arrays have).
    pub fn copy_from(&mut self, other: &SlotTable) {
        let n = self.slots.min(other.slots) as usize;
        let (to, from) = (self.ids(), other.mapped_ids());
        // SAFETY: both mappings hold at least `n` slots, and are distinct.
        unsafe { std::ptr::copy_nonoverlapping(from, to, n) };
    }

    fn mapped_ids(&self) -> *const BackendId {
        self.mapped.as_ptr().cast()
    }

    fn fits(&self, first: u32, count: usize) -> bool {
        (first as usize)
            .checked_add(count)
            .is_some_and(|end| end <= self.slots as usize)
    }
}
