//! XDP's filter (`proxy_common::filter`) as a family's programmer keeps it:
//! how many frontends and backends set each bit, the words that follow, and
//! which of them the maps do not hold yet.

use foldhash::HashMap;
use proxy_common::filter::{FILTER_WORDS, word_of};

use crate::modes::ebpf::{
    family::AgentFamily,
    maps::{MapError, ServiceMaps},
};

pub struct FilterBits {
    /// Tuples per bit (none: the bit is clear).
    counts: HashMap<u32, u32>,
    words: Vec<u64>,
    /// Words to write, a bit each (a `BTreeSet` of them was a twentieth
    /// of a cold sync at 50,000 services).
    dirty: Vec<u64>,
    /// Every word is to be written.
    all_dirty: bool,
}

impl Default for FilterBits {
    fn default() -> Self {
        FilterBits {
            counts: HashMap::default(),
            words: vec![0; FILTER_WORDS as usize],
            dirty: vec![0; FILTER_WORDS.div_ceil(64) as usize],
            all_dirty: false,
        }
    }
}

impl FilterBits {
    /// One more tuple sets `bit`.
    pub fn add(&mut self, bit: u32) {
        let count = self.counts.entry(bit).or_default();
        *count += 1;
        if *count == 1 {
            let (word, mask) = word_of(bit);
            self.words[word as usize] |= mask;
            self.mark_dirty(word);
        }
    }

    /// One tuple less sets `bit`; the last one clears it.
    pub fn remove(&mut self, bit: u32) {
        let Some(count) = self.counts.get_mut(&bit) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.counts.remove(&bit);
            let (word, mask) = word_of(bit);
            self.words[word as usize] &= !mask;
            self.mark_dirty(word);
        }
    }

    fn mark_dirty(&mut self, word: u32) {
        self.dirty[(word / 64) as usize] |= 1 << (word % 64);
    }

    /// Every word is written by the next [`FilterBits::write`]: adopted maps
    /// hold the bits of the agent before, whatever this one keeps.
    pub fn rewrite_all(&mut self) {
        self.all_dirty = true;
    }

    /// Writes the words that changed; how many. A failed write keeps the
    /// rest for the next call.
    pub fn write<F: AgentFamily>(
        &mut self,
        maps: &mut impl ServiceMaps<F>,
    ) -> Result<usize, MapError> {
        let mut written = 0;
        if self.all_dirty {
            for (word, value) in (0..FILTER_WORDS).zip(&self.words) {
                maps.put_filter_word(word, *value)?;
            }
            self.all_dirty = false;
            self.dirty.fill(0);
            written += FILTER_WORDS as usize;
        }
        for chunk in 0..self.dirty.len() {
            while self.dirty[chunk] != 0 {
                let bit = self.dirty[chunk].trailing_zeros();
                let word = chunk as u32 * 64 + bit;
                maps.put_filter_word(word, self.words[word as usize])?;
                self.dirty[chunk] &= !(1 << bit);
                written += 1;
            }
        }
        Ok(written)
    }

    /// Whether `bit` is set.
    #[cfg(test)]
    pub fn has(&self, bit: u32) -> bool {
        let (word, mask) = word_of(bit);
        self.words[word as usize] & mask != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bit_stays_set_while_any_tuple_sets_it() {
        let mut bits = FilterBits::default();
        bits.add(70);
        bits.add(70);
        bits.add(71);
        assert_eq!(bits.words[1], 0b11 << 6);
        bits.remove(70);
        assert!(bits.has(70));
        bits.remove(70);
        assert!(!bits.has(70) && bits.has(71));
        bits.remove(70);
        assert!(bits.has(71), "removing a clear bit changes nothing");
        let dirty: Vec<u32> = (0..FILTER_WORDS)
            .filter(|w| bits.dirty[(w / 64) as usize] & (1 << (w % 64)) != 0)
            .collect();
        assert_eq!(dirty, [1]);
    }
}
