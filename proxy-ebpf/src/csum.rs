//! One's-complement checksum arithmetic (RFC 1071 / RFC 1624). Words are
//! taken in memory order, which gives the right result in either byte order.

#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Adds the 16-bit words of `bytes` (even length) to `sum`.
#[inline(always)]
pub fn add_bytes(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        sum += u16::from_ne_bytes([bytes[i], bytes[i + 1]]) as u32;
        i += 2;
    }
    sum
}

#[inline(always)]
pub fn add_u32(sum: u32, v: u32) -> u32 {
    sum + (v & 0xffff) + (v >> 16)
}

/// Updates checksum `check` for a 32-bit field changing from `old` to `new`.
#[inline(always)]
pub fn replace4(check: u16, old: u32, new: u32) -> u16 {
    let sum = (!check) as u32 + (!(old as u16)) as u32 + (!((old >> 16) as u16)) as u32;
    !fold(add_u32(sum, new))
}

/// Updates checksum `check` for a 16-bit field changing from `old` to `new`.
#[inline(always)]
pub fn replace2(check: u16, old: u16, new: u16) -> u16 {
    !fold((!check) as u32 + (!old) as u32 + new as u32)
}
