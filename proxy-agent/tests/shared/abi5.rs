#![allow(dead_code)] // each test binary uses its own subset
//! Pinned maps turned back into older ABIs' layouts (the conntrack maps
//! into ABI 5's, the service maps into ABI 6's), to test the migration from
//! them with the state a current datapath holds.

use std::path::Path;

use aya::{
    Pod,
    maps::{HashMap, Map, MapData},
};
use proxy_agent::modes::ebpf::migrate::{v5, v6};
use proxy_common::{
    CtKeyOf, CtValueOf, Family, ServiceKeyOf, ServiceValue, conntrack::flags, slots::SlotPair,
};

use crate::bpffs::BpfFs;

/// Replaces the conntrack map pinned at `path` with one in ABI 5's layout
/// (the half of the flow in the key) holding the same entries, and returns
/// how many it holds, with the same capacity. Programs still attached keep
/// the map they hold.
pub fn conntrack_to_abi_5<F: Family>(fs: &BpfFs, path: &Path) -> usize
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
    v5::CtKeyOf<F>: Pod,
    v5::CtValueOf<F>: Pod,
{
    let (entries, mut old) = repin_as_lru::<F, v5::CtKeyOf<F>, v5::CtValueOf<F>>(fs, path);
    for (k, v) in entries.iter().copied() {
        let key = v5::CtKeyOf::<F> {
            saddr_be: k.saddr_be,
            daddr_be: k.daddr_be,
            sport_be: k.sport_be,
            dport_be: k.dport_be,
            proto: k.proto,
            direction: u8::from(v.flags & flags::REPLY != 0),
            _pad: [0; 2],
        };
        let value = v5::CtValueOf::<F> {
            nat_addr_be: v.nat_addr_be,
            nat_port_be: v.nat_port_be,
            flags: v.flags & !flags::REPLY,
            service_id: v.service_id,
            backend_id: v.backend_id,
            snat_addr_be: v.snat_addr_be,
            snat_port_be: v.snat_port_be,
            _pad: 0,
            last_seen_ns: v.last_seen_ns,
            created_ns: v.created_ns,
        };
        old.insert(key, value, 0).unwrap();
    }
    entries.len()
}

/// Replaces the service map pinned at `dir/services` with one in ABI 6's
/// layout (each backend slot an entry of its own, in place of the slots
/// array pinned at `dir/slots`, which is removed), holding the same
/// frontends and backends; returns how many entries it holds.
pub fn services_to_abi_6<F: Family>(fs: &BpfFs, dir: &Path, services: &str, slots: &str) -> usize
where
    ServiceKeyOf<F>: Pod,
{
    let path = dir.join(services);
    let pinned = MapData::from_pin(&path).unwrap();
    let capacity = pinned.info().unwrap().max_entries();
    let now: HashMap<MapData, ServiceKeyOf<F>, ServiceValue> =
        Map::from_map_data(pinned).unwrap().try_into().unwrap();
    let entries: Vec<(ServiceKeyOf<F>, ServiceValue)> = now.iter().map(Result::unwrap).collect();
    drop(now);
    let array: aya::maps::Array<MapData, SlotPair> =
        Map::from_map_data(MapData::from_pin(dir.join(slots)).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    let slot = |index: u32| {
        let (element, at) = proxy_common::slots::locate(index);
        array.get(&element, 0).unwrap().ids[at]
    };
    let mut old_entries = Vec::new();
    for (key, value) in &entries {
        let old = v6::ServiceValue {
            backend_id: value.backend_id,
            service_id: value.service_id,
            count: value.count,
            flags: value.flags,
        };
        old_entries.push((*key, old));
        if key.slot != 0 || value.has(proxy_common::service::flags::CLUSTER_IP_MARKER) {
            continue;
        }
        for s in 1..=value.count {
            let backend_id = slot(value.slot_index(s));
            old_entries.push((
                key.with_slot(s),
                v6::ServiceValue {
                    backend_id,
                    service_id: value.service_id,
                    count: 0,
                    flags: 0,
                },
            ));
        }
    }
    drop(array);
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(dir.join(slots)).unwrap();
    let size = |n: usize| u32::try_from(n).unwrap();
    fs.pin_map_of(
        &path,
        "hash",
        size(size_of::<ServiceKeyOf<F>>()),
        size(size_of::<v6::ServiceValue>()),
        capacity,
    );
    let mut old: HashMap<MapData, ServiceKeyOf<F>, v6::ServiceValue> =
        Map::from_map_data(MapData::from_pin(&path).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    for (k, v) in &old_entries {
        old.insert(k, v, 0).unwrap();
    }
    old_entries.len()
}

/// Replaces the conntrack table pinned at `path` with an LRU hash, as ABI 7
/// and older had, holding the same entries with the same capacity.
pub fn conntrack_to_lru<F: Family>(fs: &BpfFs, path: &Path)
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let (entries, mut old) = repin_as_lru::<F, CtKeyOf<F>, CtValueOf<F>>(fs, path);
    for (k, v) in entries {
        old.insert(k, v, 0).unwrap();
    }
}

/// A conntrack table's entries.
type Entries<F> = Vec<(CtKeyOf<F>, CtValueOf<F>)>;

/// The entries of the conntrack table pinned at `path`, and an empty LRU
/// hash of keys `K` and values `V` pinned in its place, of its capacity.
fn repin_as_lru<F: Family, K: Pod, V: Pod>(
    fs: &BpfFs,
    path: &Path,
) -> (Entries<F>, HashMap<MapData, K, V>)
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let pinned = MapData::from_pin(path).unwrap();
    let capacity = pinned.info().unwrap().max_entries();
    let now: HashMap<MapData, CtKeyOf<F>, CtValueOf<F>> =
        Map::from_map_data(pinned).unwrap().try_into().unwrap();
    let entries: Vec<(CtKeyOf<F>, CtValueOf<F>)> = now.iter().map(Result::unwrap).collect();
    drop(now);
    std::fs::remove_file(path).unwrap();
    let size = |n: usize| u32::try_from(n).unwrap();
    fs.pin_map_of(
        path,
        "lru_hash",
        size(size_of::<K>()),
        size(size_of::<V>()),
        capacity,
    );
    let lru = Map::from_map_data(MapData::from_pin(path).unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    (entries, lru)
}
