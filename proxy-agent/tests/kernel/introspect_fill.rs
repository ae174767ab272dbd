//! The introspection library's map fill at the scale a metrics scrape must
//! handle: a conntrack-shaped LRU map with a million entries, counted
//! exactly and within a scrape's budget. Needs root.

use std::time::{Duration, Instant};

use aya::maps::{HashMap, IterableMap as _, Map, MapData};
use proxy_agent::modes::ebpf::introspect::{PinnedMapSet, map_usage};
use proxy_common::{CtKey, CtValue};

use crate::bpffs::BpfFs;

const ENTRIES: u32 = 1_000_000;
/// A scrape every 15 s may spend a small share of it on the walk.
const BUDGET: Duration = Duration::from_secs(2);

#[test]
fn a_million_conntrack_entries_are_counted_exactly_within_a_scrapes_budget() {
    let bpffs = BpfFs::new();
    let dir = bpffs.dir.join("maps");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("CONNTRACK");
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
    let usage = set.usage_of("CONNTRACK").unwrap();
    let elapsed = start.elapsed();
    eprintln!("counted {walked} conntrack entries in {elapsed:?}");
    assert_eq!(usage.entries, Some(walked));
    assert_eq!(usage.capacity, ENTRIES + ENTRIES / 8);
    assert_eq!(usage.map_type, "LruHash");
    assert!(elapsed < BUDGET, "{elapsed:?} for {walked} entries");

    let again = map_usage("CONNTRACK", map.map()).unwrap();
    assert_eq!(again.entries, Some(walked), "reading changed nothing");
}
