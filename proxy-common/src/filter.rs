//! The XDP program's first question (`FILTER`, `FILTER6`): may this packet
//! be one XDP finishes? XDP sends on only what goes straight back out of
//! its interface, and passes anything else to TC, which does the whole job
//! for every packet. So XDP needs to look a packet up only when it is to a
//! frontend, or a reply from a backend (or to a masquerade port, which the
//! program checks itself); everything else (most of what a node receives)
//! is passed on without a hash lookup.
//!
//! One bit per hash of a frontend's (address, port, protocol), and of a
//! backend's as the source of its replies, in an array of words the agent
//! writes. A bit set by another tuple costs a lookup, never a wrong answer;
//! a bit missing (before the agent's first sync, or for a flow whose
//! backend is gone) sends the packet to TC.

use crate::Family;

/// Words of the array (a power of two): 16 Mi bits, 2 MiB per family. The
/// agent maps it into its memory (`BPF_F_MMAPABLE`) and writes words with stores.
pub const FILTER_WORDS: u32 = 1 << 18;
const BITS_LOG2: u32 = 24;
const _: () = assert!(FILTER_WORDS as u64 * 64 == 1 << BITS_LOG2);

/// The bit of a frontend: packets to `addr`:`port_be` over `proto`.
#[inline(always)]
pub fn frontend_bit<F: Family>(addr_be: &F::Addr, port_be: u16, proto: u8) -> u32 {
    bit(F::addr_words(addr_be), port_be, proto, 0)
}

/// The bit of a backend: its replies, from `addr`:`port_be` over `proto`.
#[inline(always)]
pub fn backend_bit<F: Family>(addr_be: &F::Addr, port_be: u16, proto: u8) -> u32 {
    bit(F::addr_words(addr_be), port_be, proto, 1)
}

/// The word a bit is in, and its mask there.
#[inline(always)]
pub fn word_of(bit: u32) -> (u32, u64) {
    (bit >> 6, 1u64 << (bit & 63))
}

// A multiplicative hash: the tuple's fields in distinct bits of one 64-bit
// value (the address words folded in one at a time), multiplied by an odd
// constant, whose top bits are the bit index.
#[inline(always)]
fn bit(words: &[u32], port_be: u16, proto: u8, side: u64) -> u32 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = ((port_be as u64) << 48) | ((proto as u64) << 40) | (side << 32);
    for w in words {
        h = (h ^ *w as u64).wrapping_mul(K);
        h ^= h >> 32;
    }
    (h.wrapping_mul(K) >> (64 - BITS_LOG2)) as u32
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::{V4, V6};

    #[test]
    fn bits_are_in_range_and_differ_by_each_field() {
        let a = frontend_bit::<V4>(&0x0a00_0001, 80u16.to_be(), 6);
        assert!(a < FILTER_WORDS * 64);
        assert_ne!(a, frontend_bit::<V4>(&0x0a00_0002, 80u16.to_be(), 6));
        assert_ne!(a, frontend_bit::<V4>(&0x0a00_0001, 81u16.to_be(), 6));
        assert_ne!(a, frontend_bit::<V4>(&0x0a00_0001, 80u16.to_be(), 17));
        assert_ne!(a, backend_bit::<V4>(&0x0a00_0001, 80u16.to_be(), 6));
        let b = frontend_bit::<V6>(&[1, 2, 3, 4], 80u16.to_be(), 6);
        assert!(b < FILTER_WORDS * 64);
        assert_ne!(b, frontend_bit::<V6>(&[1, 2, 3, 5], 80u16.to_be(), 6));
        assert_ne!(b, frontend_bit::<V6>(&[2, 2, 3, 4], 80u16.to_be(), 6));
    }

    #[test]
    fn tuples_spread_over_the_bits() {
        // 100,000 frontends on consecutive addresses and one port: about as
        // many distinct bits as a uniform hash gives (16 Mi bits: 99.7%).
        let mut bits = std::vec![0u64; FILTER_WORDS as usize];
        let mut distinct = 0;
        for i in 0..100_000u32 {
            let (word, mask) = word_of(frontend_bit::<V4>(
                &(0xc613_0000 + i).to_be(),
                80u16.to_be(),
                6,
            ));
            if bits[word as usize] & mask == 0 {
                distinct += 1;
            }
            bits[word as usize] |= mask;
        }
        assert!(distinct > 99_500, "{distinct} distinct bits");
    }
}
