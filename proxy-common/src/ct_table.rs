//! The conntrack table proposed in docs/proposal-conntrack-slots.md: an
//! open-addressed array of slots that each start on a cache line, probed
//! linearly from the key's hash. Not the datapath's table yet: the
//! `ct_table` bench measures it (through proxy-ebpf's `ct_slots`) against
//! the kernel's hash map that `CONNTRACK` is today.
//!
//! A slot's `state` is claimed with a compare-and-swap (64 bits wide: the
//! generic BPF CPU has no narrower one). A lookup walks from the key's home
//! slot until it finds the key in a LIVE slot or reaches an EMPTY one, at
//! most [`PROBES`] slots; BUSY (being written) and TOMBSTONE (deleted) slots
//! do not end a chain, so a deletion never cuts off the keys after it.

use crate::{
    conntrack::{CtKeyOf, CtValueOf},
    family::{Family, V4, V6},
};

/// A slot's states.
pub mod state {
    /// Never used, or cleared by the collector: ends every chain through it.
    pub const EMPTY: u64 = 0;
    /// Claimed by an insert that is writing the key and value.
    pub const BUSY: u64 = 1;
    pub const LIVE: u64 = 2;
    /// Deleted: free for an insert, but chains go on through it.
    pub const TOMBSTONE: u64 = 3;
}

/// Slots a lookup or an insert probes, the home slot first. Linear probing
/// at 40% load made chains of up to about 20 (the tests below).
pub const PROBES: u32 = 32;

/// The bytes a family's slots need after their value to fill their cache
/// lines: explicit, as everywhere in the map ABI, so that no slot has
/// implicit padding.
pub trait SlotFamily: Family {
    type SlotPad: Copy + Eq + core::fmt::Debug;
    type WideSlotPad: Copy + Eq + core::fmt::Debug;
}

impl SlotFamily for V4 {
    type SlotPad = [u8; 0];
    type WideSlotPad = [u8; 40];
}

impl SlotFamily for V6 {
    type SlotPad = [u8; 16];
    type WideSlotPad = [u8; 56];
}

/// What a flow's entry remembers, cut to fit an IPv4 slot in one cache line:
/// `CtValueOf` without the cached next hop (established packets would take
/// it from the per-CPU next-hop cache), and its creation time in seconds.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CtSlotValueOf<F: Family> {
    pub nat_addr_be: F::Addr,
    pub nat_port_be: u16,
    /// `conntrack::flags`.
    pub flags: u16,
    pub snat_addr_be: F::Addr,
    pub snat_port_be: u16,
    pub _pad: u16,
    pub backend_id: u32,
    pub service_id: u32,
    pub last_seen_ns: u64,
    pub created_s: u32,
    pub _spare: u32,
}

/// One entry: 64 bytes for IPv4, 128 for IPv6, each starting on a cache
/// line when the array is created `BPF_F_MMAPABLE` (its values then start
/// on a page boundary).
#[repr(C, align(64))]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CtSlotOf<F: SlotFamily> {
    /// [`state`].
    pub state: u64,
    pub key: CtKeyOf<F>,
    pub value: CtSlotValueOf<F>,
    pub _pad: F::SlotPad,
}

pub type CtSlot = CtSlotOf<V4>;
pub type CtSlot6 = CtSlotOf<V6>;

/// An entry that keeps today's value whole (the cached next hop too): two
/// cache lines for IPv4, three for IPv6. The first step of the proposal:
/// the table changes, what an entry holds does not.
#[repr(C, align(64))]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CtWideSlotOf<F: SlotFamily> {
    /// [`state`].
    pub state: u64,
    pub key: CtKeyOf<F>,
    pub value: CtValueOf<F>,
    pub _pad: F::WideSlotPad,
}

pub type CtWideSlot = CtWideSlotOf<V4>;
pub type CtWideSlot6 = CtWideSlotOf<V6>;

const fn mix(h: u64, words: u64) -> u64 {
    let h = (h ^ words).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 31)
}

const fn pair(low: u32, high: u32) -> u64 {
    low as u64 | (high as u64) << 32
}

/// murmur3's 64-bit finaliser.
const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The key's hash, the same in the programs and the agent. The tuple's
/// words are mixed in two at a time (a chain of multiplies half as long:
/// an IPv6 key is ten words), then finalised: tuples that differ in one
/// port only (a client's connections) must still spread over the table.
#[inline(always)]
pub fn hash<F: Family>(key: &CtKeyOf<F>) -> u32 {
    let (s, d) = (F::addr_words(&key.saddr_be), F::addr_words(&key.daddr_be));
    let ports = (key.sport_be as u32) << 16 | key.dport_be as u32;
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    if s.len() == 1 {
        h = mix(h, pair(s[0], d[0]));
    } else {
        for addr in [s, d] {
            for i in 0..addr.len() / 2 {
                h = mix(h, pair(addr[2 * i], addr[2 * i + 1]));
            }
        }
    }
    fmix64(mix(h, pair(ports, key.proto as u32))) as u32
}

/// The `i`th slot of `key`'s chain in a table of `mask + 1` slots (a power
/// of two).
#[inline(always)]
pub fn probe_index(home_hash: u32, i: u32, mask: u32) -> u32 {
    home_hash.wrapping_add(i) & mask
}

/// The slots `key`'s chain may use in a table of `mask + 1` slots, home
/// first: what the agent walks to find a key the programs inserted.
pub fn chain<F: Family>(key: &CtKeyOf<F>, mask: u32) -> impl Iterator<Item = u32> {
    let home = hash(key);
    (0..PROBES).map(move |i| probe_index(home, i, mask))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    #[test]
    fn slots_start_and_end_on_cache_lines() {
        assert_eq!(core::mem::size_of::<CtSlot>(), 64);
        assert_eq!(core::mem::size_of::<CtSlotValueOf<V4>>(), 40);
        assert_eq!(core::mem::size_of::<CtSlot6>(), 128);
        assert_eq!(core::mem::align_of::<CtSlot6>(), 64);
        assert_eq!(core::mem::offset_of!(CtSlot, value), 24);
        assert_eq!(core::mem::offset_of!(CtSlot6, value), 48);
        assert_eq!(core::mem::size_of::<CtWideSlot>(), 128);
        assert_eq!(core::mem::size_of::<CtWideSlot6>(), 192);
        assert_eq!(core::mem::offset_of!(CtWideSlot, value), 24);
        assert_eq!(core::mem::offset_of!(CtWideSlot6, value), 48);
    }

    #[test]
    fn slots_have_no_implicit_padding() {
        use core::mem::size_of;
        fn fields<F: SlotFamily>() -> (usize, usize) {
            let head = size_of::<u64>() + size_of::<CtKeyOf<F>>();
            (
                head + size_of::<CtSlotValueOf<F>>() + size_of::<F::SlotPad>(),
                head + size_of::<CtValueOf<F>>() + size_of::<F::WideSlotPad>(),
            )
        }
        assert_eq!(
            fields::<V4>(),
            (size_of::<CtSlot>(), size_of::<CtWideSlot>())
        );
        assert_eq!(
            fields::<V6>(),
            (size_of::<CtSlot6>(), size_of::<CtWideSlot6>())
        );
    }

    #[test]
    fn the_hash_is_pinned() {
        // The programs and the agent must agree, across versions too: a
        // changed hash needs a map ABI bump.
        let key = CtKeyOf::<V4>::new(
            u32::from_be_bytes([198, 18, 0, 1]).to_be(),
            u32::from_be_bytes([198, 19, 0, 1]).to_be(),
            40000u16.to_be(),
            80u16.to_be(),
            crate::proto::TCP,
        );
        assert_eq!(hash(&key), 0x4994_9f2d, "{:#x}", hash(&key));
    }

    /// Inserts `keys` as the datapath would (first free slot on the chain)
    /// into a table of `slots`, and returns the longest chain walked.
    fn longest_chain<F: Family>(keys: impl Iterator<Item = CtKeyOf<F>>, slots: u32) -> u32 {
        let mask = slots - 1;
        let mut used = vec![false; slots as usize];
        let mut longest = 0;
        for key in keys {
            let home = hash(&key);
            let i = (0..slots)
                .find(|i| !used[probe_index(home, *i, mask) as usize])
                .expect("a free slot");
            used[probe_index(home, i, mask) as usize] = true;
            longest = longest.max(i + 1);
        }
        longest
    }

    /// The bench's flows (clients that differ in their port, mostly): a
    /// forward and a reply entry each.
    fn flows<F: Family>(n: u32, addr: impl Fn(u32) -> F::Addr) -> Vec<CtKeyOf<F>> {
        let (vip, backend) = (addr(0xc613_0001), addr(0xc612_0101));
        (0..n)
            .flat_map(|i| {
                let client = addr(0xc612_8000 + i / 50_000);
                let port = (10_000 + i % 50_000) as u16;
                [
                    CtKeyOf::<F>::new(client, vip, port.to_be(), 80u16.to_be(), 6),
                    CtKeyOf::<F>::new(backend, client, 8080u16.to_be(), port.to_be(), 6),
                ]
            })
            .collect()
    }

    #[test]
    fn chains_stay_within_the_probe_limit_at_forty_percent() {
        // 200,000 entries in 2^19 slots, as the ct_table bench fills them.
        let v4 = flows::<V4>(100_000, |a| a.to_be());
        let longest = longest_chain(v4.into_iter(), 1 << 19);
        assert!(longest <= PROBES * 3 / 4, "IPv4: a chain of {longest}");
        let v6 = flows::<V6>(100_000, |a| [0x2001_0db8u32.to_be(), 0, 0, a.to_be()]);
        let longest = longest_chain(v6.into_iter(), 1 << 19);
        assert!(longest <= PROBES * 3 / 4, "IPv6: a chain of {longest}");
    }

    #[test]
    fn one_port_apart_spreads_over_the_table() {
        // 4,096 connections of one client to one frontend, in 2^16 slots:
        // no home slot may hold more than a few of them.
        let mut homes = vec![0u8; 1 << 16];
        for port in 0..4096u16 {
            let key =
                CtKeyOf::<V4>::new(1u32.to_be(), 2u32.to_be(), port.to_be(), 80u16.to_be(), 6);
            let h = &mut homes[(hash(&key) & 0xffff) as usize];
            *h += 1;
            assert!(*h <= 4, "port {port}: {h} keys share a home slot");
        }
    }
}
