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

/// A scrape reuses the last count of the maps while it is younger than
/// `MAP_COUNT_MAX_AGE`: scrapes in a burst walk the maps once (a burst of
/// exact counts at 500,000 services kept the agent from finishing its
/// first sync).
#[test]
fn scrapes_in_a_burst_share_one_count_of_the_maps() {
    use proxy_agent::modes::ebpf::{
        self, KernelMaps, ServiceMaps,
        metrics::{DatapathMetrics, MAP_COUNT_MAX_AGE},
    };
    use proxy_common::{Backend, V4};

    let mut ebpf = ebpf::load().unwrap();
    let metrics = DatapathMetrics::of(&ebpf);
    let mut registry = prometheus_client::registry::Registry::with_prefix("kubeproxy");
    registry.register_collector(Box::new(metrics));
    let backends = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(r#"kubeproxy_ebpf_map_entries{map="BACKENDS"} "#))
            .map(|v| v.parse::<u64>().unwrap())
            .unwrap()
    };
    let (mut maps, _stats) = KernelMaps::take(&mut ebpf).unwrap();
    let put = |maps: &mut KernelMaps, id: u32| {
        let backend = Backend {
            addr_be: (0xc612_0001 + id).to_be(),
            port_be: 80u16.to_be(),
            proto: 6,
            flags: 0,
        };
        ServiceMaps::<V4>::put_backend(maps, id, &backend).unwrap()
    };
    put(&mut maps, 1);
    assert_eq!(backends(), 1);
    // The count is at most this old from here on.
    let started = Instant::now();
    put(&mut maps, 2);
    let second = backends();
    if started.elapsed() < MAP_COUNT_MAX_AGE {
        assert_eq!(second, 1, "a scrape right after another counted again");
    }
    std::thread::sleep(MAP_COUNT_MAX_AGE.saturating_sub(started.elapsed()));
    assert_eq!(backends(), 2, "an old count was served past its age");
}
