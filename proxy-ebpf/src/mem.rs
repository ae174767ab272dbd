//! Zeroing and copying of plain data without `memset`/`memmove` calls.
//!
//! LLVM's BPF backend lowers `memset` and `memmove` (a struct literal's zero
//! run, `write_bytes`, some struct copies) to calls of the byte loops
//! `compiler_builtins` provides, and the verifier walks such a loop byte by
//! byte on every path that reaches it: they were most of the instructions
//! it processed. Volatile word stores cannot be merged back into a `memset`.

use core::mem::{align_of, size_of};

/// Sets every byte of `dst` to zero, a word at a time.
#[inline(always)]
pub fn zero<T>(dst: &mut T) {
    let p = dst as *mut T;
    // SAFETY: every store is inside `*dst`, at an offset aligned for its width.
    unsafe {
        if align_of::<T>() >= 8 && size_of::<T>() % 8 == 0 {
            fill::<T, u64>(p);
        } else if align_of::<T>() >= 4 && size_of::<T>() % 4 == 0 {
            fill::<T, u32>(p);
        } else if align_of::<T>() >= 2 && size_of::<T>() % 2 == 0 {
            fill::<T, u16>(p);
        } else {
            fill::<T, u8>(p);
        }
    }
}

#[inline(always)]
unsafe fn fill<T, W: Default>(p: *mut T) {
    let words = p as *mut W;
    for i in 0..size_of::<T>() / size_of::<W>() {
        // SAFETY: the caller's.
        unsafe { core::ptr::write_volatile(words.add(i), W::default()) };
    }
}

/// `*dst = *src` as loads and stores (LLVM's BPF backend inlines `memcpy`,
/// never `memmove`).
#[inline(always)]
pub fn copy<T: Copy>(dst: &mut T, src: &T) {
    // SAFETY: `dst` is a unique reference, so the two cannot overlap.
    unsafe { core::ptr::copy_nonoverlapping(src as *const T, dst as *mut T, 1) };
}
