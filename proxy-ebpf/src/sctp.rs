//! SCTP (RFC 9260) as the service datapath sees it: an association is its
//! addresses and ports, like a TCP connection; the first chunk of a packet
//! says where it is in its life, given to conntrack as the TCP flags that
//! play the same part; and a port rewrite updates the CRC32c without
//! reading the packet (`proxy_common::crc32c`).

use proxy_common::crc32c;

use crate::packet::tcp_flags;

/// Bytes of the common header; the first chunk's type follows.
pub const COMMON_HLEN: usize = 12;
/// The checksum's offset in the common header.
pub const CSUM_OFF: usize = 8;

mod chunk {
    pub const INIT: u8 = 1;
    pub const INIT_ACK: u8 = 2;
    pub const ABORT: u8 = 6;
    pub const SHUTDOWN: u8 = 7;
    pub const SHUTDOWN_ACK: u8 = 8;
    pub const SHUTDOWN_COMPLETE: u8 = 14;
}

/// The TCP flags whose conntrack meaning a first chunk of `chunk_type` has:
/// INIT opens (SYN), INIT ACK answers (SYN ACK), ABORT resets (RST), the
/// SHUTDOWN exchange closes each direction (FIN); anything else (DATA,
/// SACK, HEARTBEAT, COOKIE ...) belongs to a live association (ACK).
#[inline(always)]
pub fn conntrack_flags(chunk_type: u8) -> u8 {
    // A table, not a match: a branch per chunk type would hand the verifier
    // a known flags value per branch, and it would check the rest of the
    // program once for each.
    CONNTRACK_FLAGS[chunk_type as usize]
}

static CONNTRACK_FLAGS: [u8; 256] = {
    let mut t = [tcp_flags::ACK; 256];
    t[chunk::INIT as usize] = tcp_flags::SYN;
    t[chunk::INIT_ACK as usize] = tcp_flags::SYN | tcp_flags::ACK;
    t[chunk::ABORT as usize] = tcp_flags::RST | tcp_flags::ACK;
    t[chunk::SHUTDOWN as usize] = tcp_flags::FIN | tcp_flags::ACK;
    t[chunk::SHUTDOWN_ACK as usize] = tcp_flags::FIN | tcp_flags::ACK;
    t[chunk::SHUTDOWN_COMPLETE as usize] = tcp_flags::FIN | tcp_flags::ACK;
    t
};

/// The checksum field (as stored: little-endian) of a packet of `len` bytes
/// whose ports change from `old` to `new` (network byte order).
#[inline(always)]
pub fn checksum_after(stored: [u8; 4], len: u32, old: [u16; 2], new: [u16; 2]) -> [u8; 4] {
    let word = |p: [u16; 2]| {
        let (a, b) = (p[0].to_ne_bytes(), p[1].to_ne_bytes());
        u32::from_ne_bytes([a[0], a[1], b[0], b[1]])
    };
    sctp_crc32c_after(u32::from_le_bytes(stored), len, word(old) ^ word(new)).to_le_bytes()
}

/// The CRC32c of a `len`-byte message whose first 4 bytes changed by
/// `delta` (as they sit in memory), from `crc`.
// A global function: the verifier checks it once, for any arguments,
// rather than again for every path of the program that reaches it.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sctp_crc32c_after(crc: u32, len: u32, delta: u32) -> u32 {
    crc32c::update_first4(crc, len, [0; 4], delta.to_ne_bytes())
}
