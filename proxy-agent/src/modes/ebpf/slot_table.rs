//! A family's `SLOTS` array (`proxy_common::slots`) mapped into the agent's
//! memory: writing a frontend's backend slots is a few stores, not one
//! `bpf()` call per slot.

use std::os::fd::{AsFd as _, AsRawFd as _};
use std::ptr::NonNull;

use anyhow::Context as _;
use aya::maps::{Array, IterableMap as _, MapData};
use proxy_common::{BackendId, slots::SlotPair};

pub struct SlotTable {
    array: Array<MapData, SlotPair>,
    base: NonNull<u32>,
    /// Slot indexes the array holds.
    slots: u32,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and only written through
// `&mut self`; the kernel side reads it concurrently by design (each slot is
// one aligned 32-bit store).
unsafe impl Send for SlotTable {}
// SAFETY: as above; `&self` only reads.
unsafe impl Sync for SlotTable {}

impl SlotTable {
    /// Maps `array` (created `BPF_F_MMAPABLE`) into memory.
    pub fn new(array: Array<MapData, SlotPair>) -> anyhow::Result<Self> {
        let elements = array.len();
        let slots = elements * proxy_common::slots::SLOTS_PER_ELEMENT;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let bytes = (elements as usize * size_of::<SlotPair>()).div_ceil(page) * page;
        let fd = array.map().fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of the map's fd, of the size the kernel
        // gives the array's values (page-rounded); unmapped in Drop.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .context("mapping the SLOTS array into memory (is it BPF_F_MMAPABLE?)");
        }
        Ok(SlotTable {
            array,
            base: NonNull::new(at.cast()).context("mmap returned null")?,
            slots,
            bytes,
        })
    }

    /// How many slot indexes the array holds.
    pub fn capacity(&self) -> u32 {
        self.slots
    }

    pub fn array(&self) -> &Array<MapData, SlotPair> {
        &self.array
    }

    /// Writes `ids` at indexes `first..`; `false` (nothing written) when
    /// they do not fit.
    pub fn write(&mut self, first: u32, ids: &[BackendId]) -> bool {
        if !self.fits(first, ids.len()) {
            return false;
        }
        for (i, id) in ids.iter().enumerate() {
            // SAFETY: in bounds (checked above); a volatile aligned store,
            // which the datapath reads whole.
            unsafe {
                self.base
                    .as_ptr()
                    .add(first as usize + i)
                    .write_volatile(*id)
            };
        }
        true
    }

    /// The `count` ids at `first..` (none when out of bounds).
    pub fn read(&self, first: u32, count: usize) -> Vec<BackendId> {
        if !self.fits(first, count) {
            return Vec::new();
        }
        (0..count)
            // SAFETY: in bounds (checked above).
            .map(|i| unsafe { self.base.as_ptr().add(first as usize + i).read_volatile() })
            .collect()
    }

    /// Copies the slots `other` holds (as many as both arrays have).
    pub fn copy_from(&mut self, other: &SlotTable) {
        let n = self.slots.min(other.slots) as usize;
        // SAFETY: both mappings hold at least `n` slots, and are distinct.
        unsafe { std::ptr::copy_nonoverlapping(other.base.as_ptr(), self.base.as_ptr(), n) };
    }

    fn fits(&self, first: u32, count: usize) -> bool {
        (first as usize)
            .checked_add(count)
            .is_some_and(|end| end <= self.slots as usize)
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
