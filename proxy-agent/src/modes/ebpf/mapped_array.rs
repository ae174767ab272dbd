//! A `BPF_F_MMAPABLE` array mapped into the agent's memory: writing an
//! element is a store, not a `bpf()` call.

use std::os::fd::{AsFd as _, AsRawFd as _};
use std::ptr::NonNull;

use anyhow::Context as _;
use aya::{
    Pod,
    maps::{Array, IterableMap as _, MapData},
};

pub struct MappedArray<T: Pod> {
    array: Array<MapData, T>,
    base: NonNull<T>,
    len: u32,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and only written through
// `&mut self`; the kernel side reads it concurrently by design (elements
// are aligned words, each written whole).
unsafe impl<T: Pod> Send for MappedArray<T> {}
// SAFETY: as above; `&self` only reads.
unsafe impl<T: Pod> Sync for MappedArray<T> {}

impl<T: Pod> MappedArray<T> {
    /// Maps `array` (created `BPF_F_MMAPABLE`, named `name` in errors) into memory.
    pub fn new(array: Array<MapData, T>, name: &str) -> anyhow::Result<Self> {
        let len = array.len();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let bytes = (len as usize * size_of::<T>()).div_ceil(page) * page;
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
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!("mapping the {name} array into memory (is it BPF_F_MMAPABLE?)")
            });
        }
        Ok(MappedArray {
            array,
            base: NonNull::new(at.cast()).context("mmap returned null")?,
            len,
            bytes,
        })
    }

    /// Elements of the array.
    pub fn elements(&self) -> u32 {
        self.len
    }

    pub fn array(&self) -> &Array<MapData, T> {
        &self.array
    }

    /// Writes element `index`; `false` when it is out of bounds.
    pub fn write(&mut self, index: u32, value: T) -> bool {
        if index >= self.len {
            return false;
        }
        // SAFETY: in bounds; a volatile aligned store, which the datapath reads whole.
        unsafe { self.base.as_ptr().add(index as usize).write_volatile(value) };
        true
    }

    /// Copies the elements `other` holds (as many as both arrays have).
    pub fn copy_from(&mut self, other: &MappedArray<T>) {
        let n = self.len.min(other.len) as usize;
        // SAFETY: both mappings hold at least `n` elements, and are distinct.
        unsafe { std::ptr::copy_nonoverlapping(other.as_ptr(), self.as_mut_ptr(), n) };
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) {
        for index in 0..self.len {
            self.write(index, value);
        }
    }

    /// The mapped elements, for bulk access.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.base.as_ptr()
    }

    pub fn as_ptr(&self) -> *const T {
        self.base.as_ptr()
    }
}

impl<T: Pod> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
