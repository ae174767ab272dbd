use proxy_common::Counter;

use crate::maps::STATS;

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = STATS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}
