use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use proxy_common::{
    Backend, BackendId, CtKey, CtValue, ServiceKey, ServiceValue,
    maps::{MAX_BACKENDS, MAX_CONNTRACK, MAX_SERVICE_ENTRIES},
    stats::COUNTER_MAX,
};

// The static names must equal the constants in `proxy_common::maps`.
#[map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> =
    HashMap::with_max_entries(MAX_SERVICE_ENTRIES, 0);

#[map]
pub static BACKENDS: HashMap<BackendId, Backend> = HashMap::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static CONNTRACK: LruHashMap<CtKey, CtValue> = LruHashMap::with_max_entries(MAX_CONNTRACK, 0);

#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_MAX, 0);
