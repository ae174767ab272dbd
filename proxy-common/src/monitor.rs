//! `proxy-agent monitor`'s channel: the programs report their decisions
//! (drops and rejects with the reason, new flows with the endpoint chosen)
//! into a ring buffer, but only while a monitor holds a lease in `MONITOR`.
//! Each running monitor has a slot of its own (a lease and a ring), so
//! monitors never take each other's events. Nobody listening costs a clock
//! read and one array lookup per slot on the slow paths (drops, rejects,
//! new flows) and nothing on established flows.

use crate::family::{Family, V4, V6};

/// Monitors that can run at once.
pub const MONITOR_SLOTS: usize = 4;

/// Entry `i` of `MONITOR` (an array of [`MONITOR_SLOTS`]); slot `i` reports
/// into `MONITOR_RINGS[i]`. Each monitor writes only its own entry.
///
/// One monitor's lease: until when (`bpf_ktime_get_ns`, i.e.
/// `CLOCK_MONOTONIC`) it wants each kind of event in its ring. Renewed while
/// the monitor runs; one that dies stops its events within a lease and
/// frees the slot.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MonitorSlot {
    pub drops_until_ns: u64,
    pub flows_until_ns: u64,
    /// The holder's process id (0: never held).
    pub owner: u32,
    pub _pad: u32,
}

/// How long one renewal of a lease lasts, and how often monitors renew it.
pub const LEASE_NS: u64 = 2_000_000_000;
pub const RENEW_NS: u64 = 500_000_000;

/// Bytes of each ring buffer (a power of two, a multiple of the page size).
pub const MONITOR_RING_BYTES: u32 = 256 * 1024;

/// What happened ([`MonitorEvent::kind`]).
pub mod kind {
    /// The packet was dropped; `reason` says why.
    pub const DROP: u8 = 1;
    /// Answered with a TCP RST / ICMP unreachable, or a connect refused.
    pub const REJECT: u8 = 2;
    /// A new flow was balanced to an endpoint.
    pub const FLOW: u8 = 3;
}

/// Which program saw it ([`MonitorEvent::hook`]).
pub mod hook {
    pub const FROM_POD: u8 = 1;
    pub const FROM_NETDEV: u8 = 2;
    pub const XDP: u8 = 3;
    pub const FROM_HOST: u8 = 4;
    /// The connect / sendmsg socket hook.
    pub const SOCKET: u8 = 5;
}

/// [`MonitorEvent::flags`].
pub mod event_flags {
    /// The new flow's source was rewritten (masquerade, or a port of its own).
    pub const SNAT: u32 = 1;
}

/// One decision, in either family. Addresses and ports in network byte
/// order; the `nat_*` fields are the tuple the packet left with (flows only).
/// A reader tells the families apart by the record's size (and `family`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MonitorEventOf<F: Family> {
    pub time_ns: u64,
    pub ifindex: u32,
    pub kind: u8,
    pub hook: u8,
    /// The `Counter` that counted it.
    pub reason: u8,
    pub proto: u8,
    pub saddr_be: F::Addr,
    pub daddr_be: F::Addr,
    pub sport_be: u16,
    pub dport_be: u16,
    pub service_id: u32,
    pub backend_id: u32,
    pub nat_saddr_be: F::Addr,
    pub nat_daddr_be: F::Addr,
    pub nat_sport_be: u16,
    pub nat_dport_be: u16,
    pub flags: u32,
    /// `AF_INET6` for an IPv6 event; 0 in IPv4 ones (the padding they always had).
    pub family: u8,
    pub _pad: [u8; 3],
}

/// An IPv4 decision (56 bytes).
pub type MonitorEvent = MonitorEventOf<V4>;
/// An IPv6 decision (104 bytes).
pub type MonitorEvent6 = MonitorEventOf<V6>;
