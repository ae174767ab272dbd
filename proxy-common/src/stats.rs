//! Per-CPU counters: every datapath outcome, drops by reason included.

pub const COUNTER_MAX: u32 = 16;

#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Packets the service program inspected.
    Packets = 0,
    /// New flows balanced to a backend.
    NewFlow = 1,
    /// Packets of known flows translated.
    Established = 2,
    /// Replies reverse-translated.
    ReplyNat = 3,
    /// Dropped: service has no endpoints.
    DropNoEndpoints = 4,
    /// Dropped: a backend slot or backend id is missing (agent mid-update).
    DropBackendMissing = 5,
    /// Dropped: truncated or malformed headers.
    DropMalformed = 6,
    /// Dropped: a checksum or store helper failed.
    DropRewriteFailed = 7,
    /// Dropped: the conntrack map refused an insert.
    DropConntrackFull = 8,
    /// Flows re-balanced because their backend disappeared.
    Rebalanced = 9,
}

impl Counter {
    pub const ALL: [Counter; 10] = [
        Counter::Packets,
        Counter::NewFlow,
        Counter::Established,
        Counter::ReplyNat,
        Counter::DropNoEndpoints,
        Counter::DropBackendMissing,
        Counter::DropMalformed,
        Counter::DropRewriteFailed,
        Counter::DropConntrackFull,
        Counter::Rebalanced,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Counter::Packets => "packets",
            Counter::NewFlow => "new_flow",
            Counter::Established => "established",
            Counter::ReplyNat => "reply_nat",
            Counter::DropNoEndpoints => "drop_no_endpoints",
            Counter::DropBackendMissing => "drop_backend_missing",
            Counter::DropMalformed => "drop_malformed",
            Counter::DropRewriteFailed => "drop_rewrite_failed",
            Counter::DropConntrackFull => "drop_conntrack_full",
            Counter::Rebalanced => "rebalanced",
        }
    }
}

const _: () = assert!((Counter::ALL.len() as u32) <= COUNTER_MAX);
