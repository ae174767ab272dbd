//! The backend slots of every frontend, in one array per family (`SLOTS`,
//! `SLOTS6`).
//!
//! A frontend's slot 0 entry in the service map names its slots by
//! [`crate::ServiceValue::first_slot`] and `count`: slot `s` (1-based, as
//! Maglev tables and affinity entries number them) is array index
//! `first_slot + s - 1`, and holds a [`crate::BackendId`]. The agent writes
//! the array through a memory mapping (the map is created
//! `BPF_F_MMAPABLE`), so programming a frontend of n backends costs one map
//! update instead of n + 1. It writes a frontend's slots before the `count`
//! that exposes them, and moves a frontend whose set outgrows its range to a
//! new range before it frees the old one.
//!
//! An array map rounds every element up to 8 bytes, so slots are packed
//! [`SLOTS_PER_ELEMENT`] to an element: the mapping is a plain `u32` array.

use crate::BackendId;

/// Slots per array element.
pub const SLOTS_PER_ELEMENT: u32 = 2;

/// `BPF_F_MMAPABLE`: the array can be mapped into the agent's memory.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// One element of `SLOTS`: the backends of [`SLOTS_PER_ELEMENT`]
/// consecutive slot indexes.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotPair {
    pub ids: [BackendId; SLOTS_PER_ELEMENT as usize],
}

/// Where array index `index` lives: (element, position in it).
pub const fn locate(index: u32) -> (u32, usize) {
    (
        index / SLOTS_PER_ELEMENT,
        (index % SLOTS_PER_ELEMENT) as usize,
    )
}

/// Array elements that hold `slots` slot indexes.
pub const fn elements_for(slots: u32) -> u32 {
    slots.div_ceil(SLOTS_PER_ELEMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_pack_two_to_an_element() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1), (0, 1));
        assert_eq!(locate(7), (3, 1));
        assert_eq!(elements_for(5), 3);
    }
}
