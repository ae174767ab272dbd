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
    match chunk_type {
        chunk::INIT => tcp_flags::SYN,
        chunk::INIT_ACK => tcp_flags::SYN | tcp_flags::ACK,
        chunk::ABORT => tcp_flags::RST | tcp_flags::ACK,
        chunk::SHUTDOWN | chunk::SHUTDOWN_ACK | chunk::SHUTDOWN_COMPLETE => {
            tcp_flags::FIN | tcp_flags::ACK
        }
        _ => tcp_flags::ACK,
    }
}

/// The checksum field (as stored: little-endian) of a packet of `len` bytes
/// whose ports change from `old` to `new` (network byte order).
#[inline(always)]
pub fn checksum_after(stored: [u8; 4], len: u32, old: [u16; 2], new: [u16; 2]) -> [u8; 4] {
    let bytes = |p: [u16; 2]| {
        let (a, b) = (p[0].to_ne_bytes(), p[1].to_ne_bytes());
        [a[0], a[1], b[0], b[1]]
    };
    crc32c::update_first4(u32::from_le_bytes(stored), len, bytes(old), bytes(new)).to_le_bytes()
}
