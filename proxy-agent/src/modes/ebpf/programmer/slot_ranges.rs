//! Which ranges of a family's slots array (`proxy_common::slots`) the
//! frontends hold: a first-fit allocator over free extents, merged when
//! neighbours are freed.
//!
//! A range a frontend leaves is reused only after [`QUARANTINE`]: a packet
//! that read the frontend's old `first_slot` just before the agent moved it
//! may still read the old range for a few microseconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a freed range stays unused.
pub const QUARANTINE: Duration = Duration::from_millis(100);

/// Slots a frontend of `count` backends is given: a little room to grow
/// in place (a range that no longer fits moves).
pub fn room_for(count: usize) -> u32 {
    (count.max(1).div_ceil(4) * 4) as u32
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub first: u32,
    pub len: u32,
}

impl SlotRange {
    fn end(&self) -> u32 {
        self.first + self.len
    }
}

#[derive(Debug)]
pub struct SlotRanges {
    capacity: u32,
    /// Free extents by first index.
    free: BTreeMap<u32, u32>,
    quarantined: Vec<(Instant, SlotRange)>,
    used: u64,
}

impl SlotRanges {
    pub fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        SlotRanges {
            capacity,
            free,
            quarantined: Vec::new(),
            used: 0,
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots held by frontends or quarantined.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// A range of `len` slots; `None` when no free extent is that long.
    /// Ranges out of quarantine are reused first; when nothing else is
    /// left, quarantined ones too.
    pub fn take(&mut self, len: u32) -> Option<SlotRange> {
        self.release_quarantined(false);
        if let Some(range) = self.first_fit(len) {
            return Some(range);
        }
        if self.quarantined.is_empty() {
            return None;
        }
        tracing::debug!("the slots array is full: reusing ranges freed less than 100 ms ago");
        self.release_quarantined(true);
        self.first_fit(len)
    }

    fn first_fit(&mut self, len: u32) -> Option<SlotRange> {
        let (&first, &have) = self.free.iter().find(|(_, have)| **have >= len)?;
        self.free.remove(&first);
        if have > len {
            self.free.insert(first + len, have - len);
        }
        self.used += u64::from(len);
        Some(SlotRange { first, len })
    }

    /// Frees `range` once its quarantine is over.
    pub fn give_back(&mut self, range: SlotRange) {
        self.quarantined.push((Instant::now(), range));
    }

    /// Marks `range` held (a frontend adopted from pinned maps); `false`
    /// when it is outside the array or overlaps a range already held.
    pub fn adopt(&mut self, range: SlotRange) -> bool {
        if range.len == 0 {
            return true;
        }
        let Some(end) = range.first.checked_add(range.len) else {
            return false;
        };
        let Some((&first, &have)) = self.free.range(..=range.first).next_back() else {
            return false;
        };
        if first + have < end {
            return false;
        }
        self.free.remove(&first);
        if range.first > first {
            self.free.insert(first, range.first - first);
        }
        if first + have > end {
            self.free.insert(end, first + have - end);
        }
        self.used += u64::from(range.len);
        true
    }

    fn release_quarantined(&mut self, all: bool) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.quarantined.len() {
            if all || now.duration_since(self.quarantined[i].0) >= QUARANTINE {
                let (_, range) = self.quarantined.swap_remove(i);
                self.free_now(range);
            } else {
                i += 1;
            }
        }
    }

    fn free_now(&mut self, range: SlotRange) {
        self.used -= u64::from(range.len);
        let mut first = range.first;
        let mut end = range.end();
        if let Some((&before, &len)) = self.free.range(..first).next_back()
            && before + len == first
        {
            self.free.remove(&before);
            first = before;
        }
        if let Some(len) = self.free.remove(&end) {
            end += len;
        }
        self.free.insert(first, end - first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_do_not_overlap_and_freed_neighbours_merge() {
        let mut r = SlotRanges::new(16);
        let a = r.take(4).unwrap();
        let b = r.take(8).unwrap();
        let c = r.take(4).unwrap();
        assert_eq!((a.first, b.first, c.first), (0, 4, 12));
        assert_eq!(r.take(1), None, "full, nothing quarantined");
        r.give_back(a);
        r.give_back(b);
        assert_eq!(r.used(), 16, "quarantined ranges still count");
        // Full and both quarantined: reused now rather than failing, merged into one.
        assert_eq!(r.take(12), Some(SlotRange { first: 0, len: 12 }));
    }

    #[test]
    fn a_freed_range_waits_out_its_quarantine_when_there_is_room_elsewhere() {
        let mut r = SlotRanges::new(32);
        let a = r.take(8).unwrap();
        r.give_back(a);
        assert_eq!(r.take(8).unwrap().first, 8, "not the quarantined one");
        std::thread::sleep(QUARANTINE);
        assert_eq!(r.take(8).unwrap().first, 0, "reused after the quarantine");
    }

    #[test]
    fn adopted_ranges_are_held_and_overlaps_refused() {
        let mut r = SlotRanges::new(20);
        assert!(r.adopt(SlotRange { first: 4, len: 4 }));
        assert!(!r.adopt(SlotRange { first: 6, len: 4 }), "overlaps");
        assert!(!r.adopt(SlotRange { first: 18, len: 4 }), "outside");
        assert_eq!(r.take(4).unwrap().first, 0);
        assert_eq!(r.take(5).unwrap().first, 8);
        assert_eq!(r.used(), 13);
    }

    #[test]
    fn room_leaves_space_to_grow() {
        assert_eq!(room_for(0), 4);
        assert_eq!(room_for(4), 4);
        assert_eq!(room_for(10), 12);
    }
}
