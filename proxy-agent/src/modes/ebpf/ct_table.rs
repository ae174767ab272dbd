//! A conntrack table (`proxy_common::ct_table`: open-addressed slots in a
//! `BPF_F_MMAPABLE` array) as the agent works it: mapped into its memory
//! and changed with the programs' own protocol. A key is found by the shared
//! hash and linear probing; a slot is claimed and deleted by
//! compare-and-swap on its state word, never written whole over a slot a
//! program may be updating in place. Reads copy a live slot's key and value
//! as they are at that moment (a program may be refreshing its timer).
//!
//! The mapping is made when first needed and kept until [`CtTable::release`]:
//! the kernel maps every page of a BPF array at `mmap` (`remap_vmalloc_range`),
//! so a table kept mapped counts whole in the agent's resident memory (80 MB
//! for the default tables of both families).

use std::{
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::maps::{Array, IterableMap as _, MapData};
use proxy_common::{
    CtKeyOf, CtValueOf,
    ct_table::{CtWideSlotOf, SlotFamily, capacity_of, chain, state},
};

/// A shared mapping of a map's values, unmapped on drop.
struct Mapping {
    base: *mut u8,
    bytes: usize,
}

// SAFETY: the mapping is plain shared memory, owned by this value; every
// access through it goes by atomics or volatile copies.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `slots` values of `stride` bytes of the map `fd`, read-write or read-only.
    fn new(
        fd: BorrowedFd<'_>,
        slots: usize,
        stride: usize,
        writable: bool,
    ) -> std::io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let bytes = (slots * stride).div_ceil(page) * page;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a shared mapping of the map's values, unmapped in Drop.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            base: at.cast(),
            bytes,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{map}: no free slot in the key's chain of {probes} (the table is full where the key hashes)",
    probes = proxy_common::ct_table::PROBES
)]
pub struct TableFull {
    pub map: &'static str,
}

pub struct CtTable<F: SlotFamily> {
    array: Array<MapData, CtWideSlotOf<F>>,
    slots: u32,
    mapping: OnceLock<Mapping>,
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
            array,
            slots,
            mapping: OnceLock::new(),
            name,
        })
    }

    /// Unmaps the table until it is next used (see the module's documentation).
    pub fn release(&mut self) {
        self.mapping.take();
    }

    fn base(&self) -> *mut CtWideSlotOf<F> {
        let mapping = self.mapping.get_or_init(|| {
            let fd = self.map().fd().as_fd();
            let stride = size_of::<CtWideSlotOf<F>>();
            Mapping::new(fd, self.slots as usize, stride, true).unwrap_or_else(|e| {
                // The array was created BPF_F_MMAPABLE, by this version
                // (`new` checked its shape): only a failing kernel refuses.
                panic!("mapping {} into memory: {e}", self.name)
            })
        });
        mapping.base.cast()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn map(&self) -> &MapData {
        self.array.map()
    }

    /// The table's slots (a power of two).
    pub fn slots(&self) -> u32 {
        self.slots
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
        unsafe { self.base().add(index as usize) }
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
}

/// The live entries of the conntrack table `map` (any family: slots of the
/// map's value size, the state word first), counted through a read-only
/// mapping of it, for readers that hold the map untyped.
pub fn count_live(map: &MapData) -> std::io::Result<u64> {
    let info = map.info().map_err(std::io::Error::other)?;
    let (slots, stride) = (info.max_entries() as usize, info.value_size() as usize);
    if stride < size_of::<u64>() || stride % size_of::<u64>() != 0 {
        return Err(std::io::Error::other(format!(
            "values of {stride} bytes are no conntrack slots"
        )));
    }
    let mapping = Mapping::new(map.fd().as_fd(), slots, stride, false)?;
    let live = (0..slots)
        // SAFETY: inside the mapping; each slot starts with its aligned state word.
        .filter(|i| unsafe {
            AtomicU64::from_ptr(mapping.base.add(i * stride).cast::<u64>()).load(Ordering::Relaxed)
                == state::LIVE
        })
        .count();
    Ok(live as u64)
}
