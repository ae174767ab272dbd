//! Map names and capacities, used by both the programs and the agent.

pub const SERVICES: &str = "SERVICES";
pub const BACKENDS: &str = "BACKENDS";
/// Plain hashes since ABI 8 (LRU before), swept by `CT_COLLECTOR`.
pub const CONNTRACK: &str = "CONNTRACK";
/// IPv4 datagrams in fragments: the first fragment's ports (`fragment`).
pub const FRAGMENTS: &str = "FRAGMENTS";
pub const STATS: &str = "STATS";
pub const CONFIG: &str = "CONFIG";
pub const IFACES: &str = "IFACES";
pub const LOCAL_POD_CIDRS: &str = "LOCAL_POD_CIDRS";
pub const SOURCE_RANGES: &str = "SOURCE_RANGES";
pub const SOCKETS: &str = "SOCKETS";
/// The IPv6 maps (docs/dual-stack.md), added without an ABI bump: a
/// missing pin is created at load.
pub const SERVICES6: &str = "SERVICES6";
pub const BACKENDS6: &str = "BACKENDS6";
pub const CONNTRACK6: &str = "CONNTRACK6";
/// IPv6 datagrams in fragments: the first fragment's ports (`fragment`).
pub const FRAGMENTS6: &str = "FRAGMENTS6";
pub const CONFIG6: &str = "CONFIG6";
pub const LOCAL_POD_CIDRS6: &str = "LOCAL_POD_CIDRS6";
pub const SOURCE_RANGES6: &str = "SOURCE_RANGES6";
pub const SOCKETS6: &str = "SOCKETS6";
/// The service CIDRs of each family (ServiceCIDR objects, else the
/// configuration): traffic to an address inside one that no service holds
/// is dropped, as upstream's nftables mode does. Added without an ABI bump.
pub const SERVICE_CIDRS: &str = "SERVICE_CIDRS";
pub const SERVICE_CIDRS6: &str = "SERVICE_CIDRS6";
/// Session affinity per family (`proxy_common::affinity`). Added without an ABI bump.
pub const AFFINITY: &str = "AFFINITY";
pub const AFFINITY6: &str = "AFFINITY6";
/// Maglev lookup tables per family (`proxy_common::maglev`); their size is
/// set at load from the configuration. Added without an ABI bump.
pub const MAGLEV: &str = "MAGLEV";
pub const MAGLEV6: &str = "MAGLEV6";
/// Every frontend's backend slots, per family (`proxy_common::slots`); sized
/// at load from the configuration. ABI 7.
pub const SLOTS: &str = "SLOTS";
pub const SLOTS6: &str = "SLOTS6";
/// The XDP filter (`crate::filter`), per family; added without an ABI bump
/// (a missing pin is created at load, and the agent fills it).
pub const FILTER: &str = "FILTER";
pub const FILTER6: &str = "FILTER6";
/// The per-CPU next-hop caches by destination (proxy-ebpf's `hops`): only
/// the datapath reads and writes them, and they are never pinned (a cache,
/// whose layout may change from one version to the next).
pub const HOPS: &str = "HOPS";
pub const HOPS6: &str = "HOPS6";
/// Added without an ABI bump (a missing pin is created at load): only
/// `proxy-agent monitor` reads them.
pub const MONITOR: &str = "MONITOR";
/// One ring per monitor slot.
pub const MONITOR_RINGS: [&str; crate::monitor::MONITOR_SLOTS] = [
    "MONITOR_RING_0",
    "MONITOR_RING_1",
    "MONITOR_RING_2",
    "MONITOR_RING_3",
];

/// The conntrack collector's timer and stats (`crate::collector`). ABI 8.
pub const CT_COLLECTOR: &str = "CT_COLLECTOR";

/// Frontends (slot 0, Maglev references) and cluster-IP markers.
pub const MAX_SERVICE_ENTRIES: u32 = 262_144;
/// `SLOTS` elements in the object (two slots each: the agent's default of
/// 1,048,576 slots); the agent sizes the map at load.
pub const MAX_SLOT_ELEMENTS: u32 = 524_288;
pub const MAX_BACKENDS: u32 = 131_072;
pub const MAX_CONNTRACK: u32 = 262_144;
/// Datagrams in fragments at once (an LRU: the oldest make room).
pub const MAX_FRAGMENTS: u32 = 8_192;
/// IPv6 flows: half the IPv4 table, whose entries are 2.3 times larger.
pub const MAX_CONNTRACK6: u32 = 131_072;
pub const MAX_IFACES: u32 = 4_096;
pub const MAX_LOCAL_POD_CIDRS: u32 = 64;
pub const MAX_SERVICE_CIDRS: u32 = 64;
/// Clients pinned to a backend, across services; least recently used first out.
pub const MAX_AFFINITY: u32 = 65_536;
/// `MAGLEV` elements in the object; the agent sizes the map at load
/// (tables x elements per table).
pub const MAX_MAGLEV_CHUNKS: u32 = 4_096;
pub const MAX_SOURCE_RANGES: u32 = 16_384;
/// Sockets the socket hooks pointed at a backend; least recently used first out.
pub const MAX_SOCKETS: u32 = 262_144;
