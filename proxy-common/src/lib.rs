//! Map ABI shared by the eBPF programs and the agent.
//!
//! Every type here is `#[repr(C)]` with explicit padding and no `bool`/`Option`,
//! so the kernel and user space agree byte for byte. Addresses and ports are kept
//! in network byte order (`*_be`), exactly as they appear in packets.
#![no_std]

pub mod action;
pub mod affinity;
pub mod backend;
pub mod collector;
pub mod config;
pub mod conntrack;
pub mod crc32c;
pub mod ct_table;
pub mod family;
pub mod filter;
pub mod fragment;
pub mod maglev;
pub mod maps;
pub mod monitor;
pub mod service;
pub mod slots;
pub mod sock;
pub mod stats;

#[cfg(feature = "user")]
mod pod;

pub use affinity::{AffinityKey, AffinityKey6, AffinityKeyOf, AffinityValue};
pub use backend::{Backend, Backend6, BackendId, BackendOf};
pub use config::{
    DatapathConfig, DatapathConfig6, IfaceInfo, Ipv4Prefix, Ipv6Prefix, PrefixOf, SourceRange,
    SourceRange6, SourceRangeOf,
};
pub use conntrack::{CtDirection, CtKey, CtKey6, CtKeyOf, CtValue, CtValue6, CtValueOf};
pub use family::{Family, V4, V6};
pub use monitor::{MonitorEvent, MonitorEvent6, MonitorEventOf, MonitorSlot};
pub use service::{FrontendKind, Scope, ServiceKey, ServiceKey6, ServiceKeyOf, ServiceValue};
pub use sock::{SockDirection, SockKey, SockKey6, SockKeyOf, SockValue, SockValue6, SockValueOf};
pub use stats::Counter;

/// Bumped whenever a map type changes layout, so an agent never reuses maps
/// pinned by an incompatible version.
pub const ABI_VERSION: u32 = 8;

/// IP protocol numbers as stored in keys.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const ICMPV6: u8 = 58;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SCTP: u8 = 132;
}

/// Compile-time layout checks: a failing one means both sides would disagree.
macro_rules! assert_layout {
    ($t:ty, size = $size:expr, align = $align:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        const _: () = assert!(core::mem::align_of::<$t>() == $align);
    };
}

assert_layout!(ServiceKey, size = 12, align = 4);
assert_layout!(ServiceValue, size = 16, align = 4);
assert_layout!(slots::SlotPair, size = 8, align = 4);
assert_layout!(Backend, size = 8, align = 4);
assert_layout!(CtKey, size = 16, align = 4);
assert_layout!(fragment::FragKey, size = 12, align = 4);
assert_layout!(fragment::FragPorts, size = 4, align = 2);
assert_layout!(fragment::FragKey6, size = 40, align = 4);
assert_layout!(CtValue, size = 64, align = 8);
assert_layout!(DatapathConfig, size = 80, align = 8);
assert_layout!(SockKey, size = 16, align = 8);
assert_layout!(SockValue, size = 16, align = 4);
assert_layout!(maglev::MaglevChunk, size = 8, align = 2);
assert_layout!(IfaceInfo, size = 4, align = 4);
assert_layout!(Ipv4Prefix, size = 4, align = 4);
assert_layout!(SourceRange, size = 8, align = 4);
// The IPv6 instances: the same fields with 16-byte addresses, no implicit padding.
assert_layout!(ServiceKey6, size = 24, align = 4);
assert_layout!(Backend6, size = 20, align = 4);
assert_layout!(CtKey6, size = 40, align = 4);
assert_layout!(CtValue6, size = 88, align = 8);
assert_layout!(SockKey6, size = 32, align = 8);
assert_layout!(SockValue6, size = 28, align = 4);
assert_layout!(Ipv6Prefix, size = 16, align = 4);
assert_layout!(SourceRange6, size = 20, align = 4);
assert_layout!(MonitorSlot, size = 24, align = 8);
assert_layout!(MonitorEvent, size = 56, align = 8);
assert_layout!(MonitorEvent6, size = 104, align = 8);
assert_layout!(DatapathConfig6, size = 16, align = 4);
assert_layout!(AffinityKey, size = 8, align = 4);
assert_layout!(AffinityKey6, size = 20, align = 4);
assert_layout!(AffinityValue, size = 16, align = 8);
assert_layout!(collector::CollectorValue, size = 80, align = 8);
assert_layout!(ct_table::CtSlot, size = 64, align = 64);
assert_layout!(ct_table::CtSlot6, size = 128, align = 64);
assert_layout!(ct_table::CtWideSlot, size = 128, align = 64);
assert_layout!(ct_table::CtWideSlot6, size = 192, align = 64);
