//! Maglev consistent hashing in the maps (`MAGLEV`, `MAGLEV6`).
//!
//! A frontend whose slot 0 carries [`crate::service::flags::MAGLEV`] has one
//! more entry in the service map, at slot [`MAGLEV_SLOT`]: a
//! [`ServiceValue::maglev_ref`](crate::ServiceValue::maglev_ref) naming its
//! lookup table (the first chunk of the table in the array and the table's
//! prime size M). A table holds, per hash bucket, a backend *slot* number of
//! the frontend's set; every frontend of one endpoint set of a service port
//! numbers its slots alike, so they share one table. Slots are packed
//! [`SLOTS_PER_CHUNK`] to an array element, as an array map rounds every
//! element up to 8 bytes.
//!
//! A new flow's bucket is [`flow_hash`] of the client's address and port and
//! the frontend's port and protocol, modulo M: it leaves the frontend's
//! address out, so the same client tuple reaches the same backend through
//! every node's NodePort, and every node builds the same table from the same
//! backends.

use crate::family::{Family, V4, V6};

/// The service-map slot of a frontend's table reference.
pub const MAGLEV_SLOT: u16 = u16::MAX;

/// Backend slots per array element.
pub const SLOTS_PER_CHUNK: u32 = 4;

/// One element of `MAGLEV`: the slots of [`SLOTS_PER_CHUNK`] consecutive buckets.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MaglevChunk {
    pub slots: [u16; SLOTS_PER_CHUNK as usize],
}

/// Array elements a table of `m` buckets takes.
pub const fn chunks_per_table(m: u32) -> u32 {
    m.div_ceil(SLOTS_PER_CHUNK)
}

/// Where bucket `bucket` of the table starting at `first_chunk` lives:
/// (element, position in it).
pub const fn locate(first_chunk: u32, bucket: u32) -> (u32, usize) {
    (
        first_chunk + bucket / SLOTS_PER_CHUNK,
        (bucket % SLOTS_PER_CHUNK) as usize,
    )
}

/// An address's words, as they sit in keys (network byte order read natively).
pub trait AddrWords: Family {
    fn mix_addr(h: u32, addr: &Self::Addr) -> u32;
}

impl AddrWords for V4 {
    #[inline(always)]
    fn mix_addr(h: u32, addr: &u32) -> u32 {
        mix(h, *addr)
    }
}

impl AddrWords for V6 {
    #[inline(always)]
    fn mix_addr(h: u32, addr: &[u32; 4]) -> u32 {
        mix(mix(mix(mix(h, addr[0]), addr[1]), addr[2]), addr[3])
    }
}

const SEED: u32 = 0x6b65_6270;

/// MurmurHash3's block step and finaliser (x86_32): fixed, so every node and
/// version hashes a tuple alike, and cheap enough for a new flow.
#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn finish(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The hash a new flow from `client_be:client_port_be` to a frontend's
/// `port_be`/`proto` is balanced by.
#[inline(always)]
pub fn flow_hash<F: AddrWords>(
    client_be: &F::Addr,
    client_port_be: u16,
    port_be: u16,
    proto: u8,
) -> u32 {
    let h = F::mix_addr(SEED, client_be);
    let h = mix(h, (u32::from(client_port_be) << 16) | u32::from(port_be));
    finish(mix(h, u32::from(proto)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_pack_four_to_an_element() {
        assert_eq!(chunks_per_table(16_381), 4_096);
        assert_eq!(locate(100, 0), (100, 0));
        assert_eq!(locate(100, 7), (101, 3));
        assert_eq!(locate(100, 16_380), (100 + 4_095, 0));
    }

    #[test]
    fn the_hash_is_fixed_and_uses_every_field() {
        let base = flow_hash::<V4>(&0x0100_12c6, 0x3930, 0x5000, 6);
        // Pinned (and computed independently of this code, from MurmurHash3's
        // published constants): a change would make nodes of two versions disagree.
        assert_eq!(base, 0x007d_e4d7);
        assert_ne!(base, flow_hash::<V4>(&0x0200_12c6, 0x3930, 0x5000, 6));
        assert_ne!(base, flow_hash::<V4>(&0x0100_12c6, 0x3931, 0x5000, 6));
        assert_ne!(base, flow_hash::<V4>(&0x0100_12c6, 0x3930, 0x5001, 6));
        assert_ne!(base, flow_hash::<V4>(&0x0100_12c6, 0x3930, 0x5000, 17));
        let six = flow_hash::<V6>(&[0xb80d_0120, 0, 0, 0x0100_0000], 0x3930, 0x5000, 6);
        assert_ne!(
            six,
            flow_hash::<V6>(&[0xb80d_0120, 0, 0, 0x0200_0000], 0x3930, 0x5000, 6)
        );
    }
}
