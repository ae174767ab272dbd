//! The conntrack map (LRU hash).
//!
//! A new flow to a service writes two entries: the original direction keyed by
//! the client's tuple towards the frontend (`Forward`, remembers the backend),
//! and the reply direction keyed by the backend's tuple towards the client
//! (`Reply`, remembers the frontend address to restore as the source).

#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CtDirection {
    Forward = 0,
    Reply = 1,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// A [`CtDirection`] as `u8`.
    pub direction: u8,
    pub _pad: [u8; 2],
}

impl CtKey {
    pub const fn new(
        saddr_be: u32,
        daddr_be: u32,
        sport_be: u16,
        dport_be: u16,
        proto: u8,
        direction: CtDirection,
    ) -> Self {
        Self {
            saddr_be,
            daddr_be,
            sport_be,
            dport_be,
            proto,
            direction: direction as u8,
            _pad: [0; 2],
        }
    }
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CtValue {
    /// Forward: the translated destination. Reply: the frontend to restore as source.
    pub nat_addr_be: u32,
    pub nat_port_be: u16,
    pub service_id: u16,
    /// Forward: the chosen backend, re-checked on every packet.
    pub backend_id: u32,
    pub flags: u32,
    /// `bpf_ktime_get_ns()` of the last packet in either direction.
    pub last_seen_ns: u64,
    pub created_ns: u64,
}

/// Idle lifetimes after which an entry is treated as gone. They follow the
/// kernel's and kube-proxy's defaults (established TCP 24h, UDP 30s/120s).
pub const TCP_IDLE_TIMEOUT_NS: u64 = 24 * 3600 * 1_000_000_000;
pub const UDP_IDLE_TIMEOUT_NS: u64 = 120 * 1_000_000_000;
/// `last_seen_ns` is refreshed at most this often, to keep writes off the hot path.
pub const REFRESH_INTERVAL_NS: u64 = 1_000_000_000;
