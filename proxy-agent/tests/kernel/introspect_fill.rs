//! The introspection library's map fill at the scale a metrics scrape must
//! handle: a conntrack table of a million flows, and an LRU hash of a
//! million entries (the socket and affinity tables' kind), each counted
//! exactly and within a scrape's budget. Needs root.

use std::time::{Duration, Instant};

use aya::maps::{HashMap, IterableMap as _, Map, MapData};
use proxy_agent::modes::ebpf::{
    ct_table::CtTable,
    introspect::{PinnedMapSet, map_usage},
};
use proxy_common::{
    CtKey, CtValue, V4,
    ct_table::{CtWideSlot, slots_for},
    slots::BPF_F_MMAPABLE,
};

use crate::bpffs::BpfFs;

const ENTRIES: u32 = 1_000_000;
/// A scrape every 15 s may spend a small share of it on the walk.
const BUDGET: Duration = Duration::from_secs(2);

#[test]
fn a_million_conntrack_flows_are_counted_exactly_within_a_scrapes_budget() {
    let bpffs = BpfFs::new();
    let dir = bpffs.dir.join("maps");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("CONNTRACK");
    let capacity = 1 << 20;
    let slot = std::mem::size_of::<CtWideSlot>() as u32;
    bpffs.pin_map_with_flags(&path, "array", 4, slot, slots_for(capacity), BPF_F_MMAPABLE);
    let data = MapData::from_pin(&path).unwrap();
    let mut table = CtTable::<V4>::new(
        Map::from_map_data(data).unwrap().try_into().unwrap(),
        "CONNTRACK",
    )
    .unwrap();
    for i in 0..ENTRIES {
        let key = CtKey::new(i.to_be(), 0x0a00_0001, 1234, 80, 6);
        table.insert(&key, &CtValue::default()).unwrap();
    }
    // A deleted flow is no entry.
    assert!(table.remove(&CtKey::new(7u32.to_be(), 0x0a00_0001, 1234, 80, 6)));
    let live = u64::from(ENTRIES - 1);

    let set = PinnedMapSet::open(&dir).unwrap();
    let start = Instant::now();
    let usage = set.usage_of("CONNTRACK").unwrap();
    let elapsed = start.elapsed();
    eprintln!("counted {live} conntrack flows in {elapsed:?}");
    assert_eq!(usage.entries, Some(live));
    assert_eq!(usage.capacity, capacity, "the flows the table is sized for");
    assert_eq!(usage.map_type, "ConntrackSlots");
    assert!(elapsed < BUDGET, "{elapsed:?} for {live} flows");
    assert_eq!(table.len() as u64, live, "the agent's own count agrees");
}

#[test]
fn a_million_hash_entries_are_counted_exactly_within_a_scrapes_budget() {
    let bpffs = BpfFs::new();
    let dir = bpffs.dir.join("maps");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("SOCKETS");
    let key = std::mem::size_of::<CtKey>() as u32;
    let value = std::mem::size_of::<CtValue>() as u32;
    bpffs.pin_map_of(&path, "lru_hash", key, value, ENTRIES + ENTRIES / 8);
    let data = MapData::from_pin(&path).unwrap();
    let mut map: HashMap<MapData, CtKey, CtValue> =
        Map::from_map_data(data).unwrap().try_into().unwrap();
    for i in 0..ENTRIES {
        let k = CtKey::new(i.to_be(), 0x0a00_0001, 1234, 80, 6);
        map.insert(k, CtValue::default(), 0).unwrap();
    }
    // Counted independently, key by key.
    let walked = map.keys().filter_map(Result::ok).count() as u64;
    assert!(walked > u64::from(ENTRIES) * 9 / 10, "{walked}");

    let set = PinnedMapSet::open(&dir).unwrap();
    let start = Instant::now();
    let usage = set.usage_of("SOCKETS").unwrap();
    let elapsed = start.elapsed();
    eprintln!("counted {walked} hash entries in {elapsed:?}");
    assert_eq!(usage.entries, Some(walked));
    assert_eq!(usage.capacity, ENTRIES + ENTRIES / 8);
    assert_eq!(usage.map_type, "LruHash");
    assert!(elapsed < BUDGET, "{elapsed:?} for {walked} entries");

    let again = map_usage("SOCKETS", map.map()).unwrap();
    assert_eq!(again.entries, Some(walked), "reading changed nothing");
}
