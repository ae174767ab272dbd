use crate::{
    hops::{self, HopSlot},
    ip::Scratch,
};
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use proxy_common::{
    AffinityKey, AffinityKey6, AffinityValue, Backend, Backend6, BackendId, CtKey, CtKey6, CtValue,
    CtValue6, DatapathConfig, DatapathConfig6, IfaceInfo, Ipv4Prefix, Ipv6Prefix, MonitorSlot,
    ServiceKey, ServiceKey6, ServiceValue, SockKey, SockKey6, SockValue, SockValue6, SourceRange,
    SourceRange6, V4, V6,
    filter::FILTER_WORDS,
    fragment::{FragKey, FragKey6, FragPorts},
    maglev::MaglevChunk,
    maps::{
        MAX_AFFINITY, MAX_BACKENDS, MAX_CONNTRACK, MAX_CONNTRACK6, MAX_FRAGMENTS, MAX_IFACES,
        MAX_LOCAL_POD_CIDRS, MAX_MAGLEV_CHUNKS, MAX_SERVICE_CIDRS, MAX_SERVICE_ENTRIES,
        MAX_SLOT_ELEMENTS, MAX_SOCKETS, MAX_SOURCE_RANGES,
    },
    monitor::{MONITOR_RING_BYTES, MONITOR_SLOTS},
    slots::{BPF_F_MMAPABLE, SlotPair},
    stats::COUNTER_MAX,
};

// The static names must equal the constants in `proxy_common::maps`.
#[map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> =
    HashMap::with_max_entries(MAX_SERVICE_ENTRIES, 0);

#[map]
pub static BACKENDS: HashMap<BackendId, Backend> = HashMap::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static CONNTRACK: HashMap<CtKey, CtValue> = HashMap::with_max_entries(MAX_CONNTRACK, 0);

#[map]
pub static FRAGMENTS: LruHashMap<FragKey, FragPorts> =
    LruHashMap::with_max_entries(MAX_FRAGMENTS, 0);

#[map]
pub static FRAGMENTS6: LruHashMap<FragKey6, FragPorts> =
    LruHashMap::with_max_entries(MAX_FRAGMENTS, 0);

#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_MAX, 0);

#[map]
pub static CONFIG: Array<DatapathConfig> = Array::with_max_entries(1, 0);

#[map]
pub static IFACES: HashMap<u32, IfaceInfo> = HashMap::with_max_entries(MAX_IFACES, 0);

#[map]
pub static LOCAL_POD_CIDRS: LpmTrie<Ipv4Prefix, u8> =
    LpmTrie::with_max_entries(MAX_LOCAL_POD_CIDRS, 0);

#[map]
pub static SERVICE_CIDRS: LpmTrie<Ipv4Prefix, u8> = LpmTrie::with_max_entries(MAX_SERVICE_CIDRS, 0);

#[map]
pub static SOURCE_RANGES: LpmTrie<SourceRange, u8> =
    LpmTrie::with_max_entries(MAX_SOURCE_RANGES, 0);

#[map]
pub static SOCKETS: LruHashMap<SockKey, SockValue> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);

#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
    LruHashMap::with_max_entries(MAX_AFFINITY, 0);

#[map]
pub static MAGLEV: Array<MaglevChunk> = Array::with_max_entries(MAX_MAGLEV_CHUNKS, 0);

#[map]
pub static SLOTS: Array<SlotPair> = Array::with_max_entries(MAX_SLOT_ELEMENTS, BPF_F_MMAPABLE);

#[map]
pub static FILTER: Array<u64> = Array::with_max_entries(FILTER_WORDS, BPF_F_MMAPABLE);

// The IPv6 maps: the IPv4 ones' names with a `6` (docs/dual-stack.md).
#[map]
pub static SERVICES6: HashMap<ServiceKey6, ServiceValue> =
    HashMap::with_max_entries(MAX_SERVICE_ENTRIES, 0);

#[map]
pub static BACKENDS6: HashMap<BackendId, Backend6> = HashMap::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static CONNTRACK6: HashMap<CtKey6, CtValue6> = HashMap::with_max_entries(MAX_CONNTRACK6, 0);

#[map]
pub static CONFIG6: Array<DatapathConfig6> = Array::with_max_entries(1, 0);

#[map]
pub static LOCAL_POD_CIDRS6: LpmTrie<Ipv6Prefix, u8> =
    LpmTrie::with_max_entries(MAX_LOCAL_POD_CIDRS, 0);

#[map]
pub static SERVICE_CIDRS6: LpmTrie<Ipv6Prefix, u8> =
    LpmTrie::with_max_entries(MAX_SERVICE_CIDRS, 0);

#[map]
pub static SOURCE_RANGES6: LpmTrie<SourceRange6, u8> =
    LpmTrie::with_max_entries(MAX_SOURCE_RANGES, 0);

#[map]
pub static AFFINITY6: LruHashMap<AffinityKey6, AffinityValue> =
    LruHashMap::with_max_entries(MAX_AFFINITY, 0);

#[map]
pub static MAGLEV6: Array<MaglevChunk> = Array::with_max_entries(MAX_MAGLEV_CHUNKS, 0);

#[map]
pub static SLOTS6: Array<SlotPair> = Array::with_max_entries(MAX_SLOT_ELEMENTS, BPF_F_MMAPABLE);

#[map]
pub static FILTER6: Array<u64> = Array::with_max_entries(FILTER_WORDS, BPF_F_MMAPABLE);

#[map]
pub static SOCKETS6: LruHashMap<SockKey6, SockValue6> =
    LruHashMap::with_max_entries(MAX_SOCKETS, 0);

// Per-CPU caches (`hops`), never pinned.
#[map]
pub static HOPS: PerCpuArray<HopSlot<V4>> = PerCpuArray::with_max_entries(hops::SLOTS, 0);
#[map]
pub static HOPS6: PerCpuArray<HopSlot<V6>> = PerCpuArray::with_max_entries(hops::SLOTS, 0);

// Per-CPU working memory (`ip::Scratch`), not state: nobody reads it across runs.
#[map]
pub static SCRATCH: PerCpuArray<Scratch<V4>> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub static SCRATCH6: PerCpuArray<Scratch<V6>> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static MONITOR: Array<MonitorSlot> = Array::with_max_entries(MONITOR_SLOTS as u32, 0);

// One ring per monitor slot; the names must equal `proxy_common::maps::MONITOR_RINGS`.
#[map]
pub static MONITOR_RING_0: RingBuf = RingBuf::with_byte_size(MONITOR_RING_BYTES, 0);
#[map]
pub static MONITOR_RING_1: RingBuf = RingBuf::with_byte_size(MONITOR_RING_BYTES, 0);
#[map]
pub static MONITOR_RING_2: RingBuf = RingBuf::with_byte_size(MONITOR_RING_BYTES, 0);
#[map]
pub static MONITOR_RING_3: RingBuf = RingBuf::with_byte_size(MONITOR_RING_BYTES, 0);
