#![allow(dead_code)] // each test binary uses its own subset
//! Pinned conntrack maps turned back into map ABI 5's layout, to test the
//! migration from it with the flows a current datapath tracked.

use std::path::Path;

use aya::{
    Pod,
    maps::{HashMap, Map, MapData},
};
use proxy_agent::modes::ebpf::migrate::v5;
use proxy_common::{CtKeyOf, CtValueOf, Family, conntrack::flags};

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
        size(size_of::<v5::CtKeyOf<F>>()),
        size(size_of::<v5::CtValueOf<F>>()),
        capacity,
    );
    let mut old: HashMap<MapData, v5::CtKeyOf<F>, v5::CtValueOf<F>> =
        Map::from_map_data(MapData::from_pin(path).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
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
