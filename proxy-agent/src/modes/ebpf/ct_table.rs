//! A conntrack table (`proxy_common::ct_table`: open-addressed slots in a
//! `BPF_F_MMAPABLE` array) as the agent works it: mapped into its memory
//! and changed with the programs' own protocol. A key is found by the shared
//! hash and linear probing; a slot is claimed and deleted by
//! compare-and-swap on its state word, never written whole over a slot a
//! program may be updating in place. Reads copy a live slot's key and value
//! as they are at that moment (a program may be refreshing its timer).

use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{Array, MapData};
use proxy_common::{
    CtKeyOf, CtValueOf,
    ct_table::{CtWideSlotOf, SlotFamily, capacity_of, chain, state},
};

use super::mapped_array::MappedArray;

#[derive(Debug, thiserror::Error)]
#[error(
    "{map}: no free slot in the key's chain of {probes} (the table is full where the key hashes)",
    probes = proxy_common::ct_table::PROBES
)]
pub struct TableFull {
    pub map: &'static str,
}

pub struct CtTable<F: SlotFamily> {
    slots: MappedArray<CtWideSlotOf<F>>,
    name: &'static str,
}

impl<F: SlotFamily> CtTable<F> {
    /// Maps the table `array`, named `name` in errors.
    pub fn new(array: Array<MapData, CtWideSlotOf<F>>, name: &'static str) -> anyhow::Result<Self> {
        let slots = array.len();
        anyhow::ensure!(
            slots.is_power_of_two(),
            "{name} holds {slots} slots, not a power of two: not a conntrack table of this version"
        );
        Ok(CtTable {
            slots: MappedArray::new(array, name)?,
            name,
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn map(&self) -> &MapData {
        aya::maps::IterableMap::map(self.slots.array())
    }

    /// The table's slots (a power of two).
    pub fn slots(&self) -> u32 {
        self.slots.elements()
    }

    /// The flows the table is sized for: half its slots.
    pub fn capacity(&self) -> u32 {
        capacity_of(self.slots())
    }

    fn mask(&self) -> u32 {
        self.slots() - 1
    }

    fn slot(&self, index: u32) -> *mut CtWideSlotOf<F> {
        debug_assert!(index < self.slots());
        // SAFETY: in bounds of the mapping (indexes are masked or counted).
        unsafe { self.slots.as_ptr().add(index as usize).cast_mut() }
    }

    fn state(&self, index: u32) -> &AtomicU64 {
        // SAFETY: the state word is the slot's first, 8-byte aligned (slots
        // start on cache lines), and lives as long as the mapping; the
        // programs change it only by compare-and-swap or whole stores.
        unsafe { AtomicU64::from_ptr(&raw mut (*self.slot(index)).state) }
    }

    /// The key and value of slot `index`, if it is live.
    fn live_at(&self, index: u32) -> Option<(CtKeyOf<F>, CtValueOf<F>)> {
        if self.state(index).load(Ordering::Acquire) != state::LIVE {
            return None;
        }
        let slot = self.slot(index);
        // SAFETY: in bounds; volatile, as the programs write these fields.
        unsafe {
            Some((
                (&raw const (*slot).key).read_volatile(),
                (&raw const (*slot).value).read_volatile(),
            ))
        }
    }

    /// The live slot holding `key`.
    fn find(&self, key: &CtKeyOf<F>) -> Option<u32> {
        for index in chain::<F>(key, self.mask()) {
            match self.state(index).load(Ordering::Acquire) {
                state::EMPTY => return None,
                // SAFETY: in bounds; the key of a live slot stays as it is.
                state::LIVE if unsafe { (*self.slot(index)).key } == *key => return Some(index),
                _ => {}
            }
        }
        None
    }

    /// The live entries, copied out.
    pub fn iter(&self) -> impl Iterator<Item = (CtKeyOf<F>, CtValueOf<F>)> + '_ {
        (0..self.slots()).filter_map(|index| self.live_at(index))
    }

    /// Live entries: a walk of the mapping (about a millisecond per 500k slots).
    pub fn len(&self) -> usize {
        (0..self.slots())
            .filter(|&index| self.state(index).load(Ordering::Relaxed) == state::LIVE)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live entry for `key`.
    pub fn get(&self, key: &CtKeyOf<F>) -> Option<CtValueOf<F>> {
        self.live_at(self.find(key)?).map(|(_, value)| value)
    }

    /// Deletes `key`'s entry; false when it held none.
    pub fn remove(&mut self, key: &CtKeyOf<F>) -> bool {
        self.find(key).is_some_and(|index| self.delete_at(index))
    }

    fn delete_at(&self, index: u32) -> bool {
        self.state(index)
            .compare_exchange(
                state::LIVE,
                state::TOMBSTONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Deletes every live entry that `matches`; how many were deleted.
    pub fn remove_where(&mut self, matches: impl Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool) -> usize {
        (0..self.slots())
            .filter(|&index| {
                self.live_at(index)
                    .is_some_and(|(key, value)| matches(&key, &value) && self.delete_at(index))
            })
            .count()
    }

    /// Inserts `key`'s entry, or replaces the live one.
    pub fn insert(&mut self, key: &CtKeyOf<F>, value: &CtValueOf<F>) -> Result<(), TableFull> {
        if let Some(index) = self.find(key) {
            // SAFETY: in bounds; a whole-value store, as the programs' replace.
            unsafe { (&raw mut (*self.slot(index)).value).write_volatile(*value) };
            return Ok(());
        }
        // The first free slot of the chain, as the programs take it; one
        // taken (or cleared by the collector) meanwhile sends the walk round
        // again, never past an EMPTY slot.
        for _ in 0..4 {
            let Some((index, seen)) = chain::<F>(key, self.mask())
                .map(|index| (index, self.state(index).load(Ordering::Acquire)))
                .find(|&(_, seen)| state::is_free(seen))
            else {
                break;
            };
            if self
                .state(index)
                .compare_exchange(seen, state::BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let slot = self.slot(index);
            // SAFETY: in bounds, and this slot is ours while BUSY.
            unsafe {
                (&raw mut (*slot).key).write_volatile(*key);
                (&raw mut (*slot).value).write_volatile(*value);
            }
            self.state(index).store(state::LIVE, Ordering::Release);
            return Ok(());
        }
        Err(TableFull { map: self.name })
    }

    /// Copies every slot of `other` (a table of as many slots) as it is.
    pub fn copy_from(&mut self, other: &CtTable<F>) {
        self.slots.copy_from(&other.slots);
    }
}

/// The live entries of the conntrack table `map` (any family: slots of the
/// map's value size, the state word first), counted through a read-only
/// mapping of it, for readers that hold the map untyped.
pub fn count_live(map: &MapData) -> std::io::Result<u64> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let info = map.info().map_err(std::io::Error::other)?;
    let (slots, stride) = (info.max_entries() as usize, info.value_size() as usize);
    if stride < size_of::<u64>() || stride % size_of::<u64>() != 0 {
        return Err(std::io::Error::other(format!(
            "values of {stride} bytes are no conntrack slots"
        )));
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let bytes = (slots * stride).div_ceil(page) * page;
    // SAFETY: a read-only shared mapping of the map's values, unmapped below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ,
            libc::MAP_SHARED,
            map.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let base = at.cast::<u8>();
    let live = (0..slots)
        // SAFETY: inside the mapping; each slot starts with its aligned state word.
        .filter(|i| unsafe {
            AtomicU64::from_ptr(base.add(i * stride).cast::<u64>()).load(Ordering::Relaxed)
                == state::LIVE
        })
        .count();
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(at, bytes) };
    Ok(live as u64)
}
