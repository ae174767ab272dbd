//! Updating an SCTP packet's CRC32c (RFC 9260, appendix A; Castagnoli,
//! reflected polynomial 0x82F63B78) after a rewrite of bytes at its start
//! (the ports), without reading the rest of the packet.
//!
//! CRC is linear over GF(2): for two messages of the same length,
//! `crc(a) ^ crc(b)` is the raw CRC (no initial value, no final xor) of
//! `a ^ b`. A rewrite of the first bytes leaves `a ^ b` zero after them,
//! and appending `n` zero bytes to a raw CRC multiplies it by x^(8n)
//! modulo the polynomial. So the new checksum is the old one xor
//! `raw(delta) * x^(8 * (len - delta.len()))`: two table lookups and about
//! a hundred branch-free steps whatever the packet's length (zlib's
//! `crc32_combine` does the same with squaring).
//! No allocation, bounded loops: usable from the eBPF programs.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// `value` when the low bit of `bit` is set, else zero. The arithmetic
/// below selects by multiplying, never by branching nor by masking with all
/// ones: the eBPF verifier then walks each loop once, whatever the values
/// (it splits its state at a branch, and at an AND with a value it knows is
/// -1 or 0). `black_box` keeps the compiler from turning the product back
/// into either.
const fn times(bit: u32, value: u32) -> u32 {
    core::hint::black_box(bit & 1).wrapping_mul(value)
}

/// `a * b` modulo the polynomial, both in the reflected representation
/// (bit 31 is x^0).
pub const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut i = 0;
    while i < 32 {
        product ^= times(a >> (31 - i), b);
        b = (b >> 1) ^ times(b, POLY);
        i += 1;
    }
    product
}

/// x^(8 * step * i) modulo the polynomial, i = 0..256.
const fn byte_powers(step: u32) -> [u32; 256] {
    // x^(8 * step) by squaring x^8 (a byte) once per bit of `step`.
    let mut base = 1u32 << 31;
    let mut square = 1u32 << (31 - 8);
    let mut bit = 0;
    while bit < 16 {
        if step & (1 << bit) != 0 {
            base = mul_mod(base, square);
        }
        square = mul_mod(square, square);
        bit += 1;
    }
    let mut powers = [0u32; 256];
    let mut power = 1u32 << 31;
    let mut i = 0;
    while i < 256 {
        powers[i] = power;
        power = mul_mod(power, base);
        i += 1;
    }
    powers
}

/// x^(8i) and x^(8 * 256i): two lookups and one product give any length
/// below 2^16 (computed at compile time; 2 KiB).
static LOW_BYTES: [u32; 256] = byte_powers(1);
static HIGH_BYTES: [u32; 256] = byte_powers(256);

/// x^(8n) modulo the polynomial: the factor that appends `n` zero bytes,
/// for `n` below 2^16 (any IP packet).
pub fn zero_bytes_factor(n: u32) -> u32 {
    mul_mod(
        LOW_BYTES[(n & 0xff) as usize],
        HIGH_BYTES[((n >> 8) & 0xff) as usize],
    )
}

/// The raw CRC (initial value 0, no final xor) of 4 bytes.
pub fn raw4(bytes: [u8; 4]) -> u32 {
    let mut crc = u32::from_le_bytes(bytes);
    let mut i = 0;
    while i < 32 {
        crc = (crc >> 1) ^ times(crc, POLY);
        i += 1;
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
