//! Updating an SCTP packet's CRC32c (RFC 9260, appendix A; Castagnoli,
//! reflected polynomial 0x82F63B78) after a rewrite of bytes at its start
//! (the ports), without reading the rest of the packet.
//!
//! CRC is linear over GF(2): for two messages of the same length,
//! `crc(a) ^ crc(b)` is the raw CRC (no initial value, no final xor) of
//! `a ^ b`. A rewrite of the first bytes leaves `a ^ b` zero after them,
//! and appending `n` zero bytes to a raw CRC multiplies it by x^(8n)
//! modulo the polynomial. So the new checksum is the old one xor
//! `raw(delta) * x^(8 * (len - delta.len()))`, a few hundred bounded steps
//! whatever the packet's length (zlib's `crc32_combine` does the same).
//! No allocation, bounded loops: usable from the eBPF programs.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the polynomial, both in the reflected representation
/// (bit 31 is x^0).
pub fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut m = 1u32 << 31;
    for _ in 0..32 {
        if a & m != 0 {
            product ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// x^(8n) modulo the polynomial: the factor that appends `n` zero bytes,
/// for `n` below 2^16 (any IP packet).
pub fn zero_bytes_factor(n: u32) -> u32 {
    // x^8 (a byte), then squared per bit of `n`.
    let mut square = 1u32 << (31 - 8);
    let mut factor = 1u32 << 31; // x^0
    for bit in 0..16 {
        if n & (1 << bit) != 0 {
            factor = mul_mod(factor, square);
        }
        square = mul_mod(square, square);
    }
    factor
}

/// The raw CRC (initial value 0, no final xor) of 4 bytes.
pub fn raw4(bytes: [u8; 4]) -> u32 {
    let mut crc = 0u32;
    for byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// The CRC32c of a `len`-byte message whose first 4 bytes changed from
/// `old` to `new`, given its CRC32c before (`crc`, as a number: SCTP stores
/// it little-endian).
pub fn update_first4(crc: u32, len: u32, old: [u8; 4], new: [u8; 4]) -> u32 {
    let delta = [
        old[0] ^ new[0],
        old[1] ^ new[1],
        old[2] ^ new[2],
        old[3] ^ new[3],
    ];
    crc ^ mul_mod(raw4(delta), zero_bytes_factor(len.saturating_sub(4)))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    /// An SCTP-like message: the 12-byte common header (ports, tag,
    /// checksum field) and a chunk, `len` bytes in all.
    fn message(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn rfc_9260_check_value() {
        // RFC 3720 B.4 / the CRC32c "check" value of "123456789".
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn an_updated_checksum_equals_the_recomputed_one() {
        for len in [4usize, 5, 12, 16, 28, 64, 100, 1480, 9000, 65_000] {
            for seed in [0u8, 7, 200] {
                let mut m = message(len, seed);
                let before = crc32c::crc32c(&m);
                let old = [m[0], m[1], m[2], m[3]];
                let new = [0x1f, 0x90, old[2] ^ 0x5a, 0x00]; // new source port, new destination port
                m[..4].copy_from_slice(&new);
                let after = crc32c::crc32c(&m);
                assert_eq!(
                    update_first4(before, len as u32, old, new),
                    after,
                    "len {len} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn no_change_no_update() {
        let m = message(60, 3);
        let crc = crc32c::crc32c(&m);
        let first = [m[0], m[1], m[2], m[3]];
        assert_eq!(update_first4(crc, 60, first, first), crc);
    }

    #[test]
    fn zero_bytes_factor_appends_zero_bytes() {
        // raw(m ++ zeros(n)) == raw(m) * x^(8n), for a 4-byte m.
        let m = [0xde, 0xad, 0xbe, 0xef];
        for n in [0u32, 1, 3, 255, 4096] {
            let mut padded = m.to_vec();
            padded.resize(4 + n as usize, 0);
            // crc32c's value is !raw(!init...) — compare through the linear part:
            // raw(x) = crc(x) ^ crc(zeros of the same length).
            let zeros = vec![0u8; padded.len()];
            let raw = crc32c::crc32c(&padded) ^ crc32c::crc32c(&zeros);
            assert_eq!(mul_mod(raw4(m), zero_bytes_factor(n)), raw, "n {n}");
        }
    }
}
