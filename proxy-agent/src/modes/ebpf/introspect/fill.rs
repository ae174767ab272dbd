//! How full each map is: its exact number of entries, counted by walking
//! the map in the kernel (never estimated), and its capacity.

use std::os::fd::AsFd as _;

use aya::maps::{MapData, MapType};
use serde::Serialize;

use super::IntrospectError;
use crate::modes::ebpf::sys;

/// One map's fill.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapUsage {
    /// The pin's file name (`CONNTRACK`), the map's name in the object.
    pub name: String,
    /// The kernel's map type, as aya names it (`LruHash`).
    pub map_type: String,
    /// The kernel's map id.
    pub id: u32,
    /// `max_entries`: entries for hash maps and tries, slots for arrays,
    /// bytes for a ring buffer.
    pub capacity: u32,
    /// The entries the map holds now; for arrays, every slot exists. `None`
    /// for maps without entries to count (ring buffers).
    pub entries: Option<u64>,
}

impl MapUsage {
    /// `entries / capacity`, when entries can be counted.
    pub fn fill(&self) -> Option<f64> {
        self.entries
            .map(|e| e as f64 / f64::from(self.capacity.max(1)))
    }
}

/// The fill of one map. `name` is what reports call it.
///
/// Hash maps (the conntrack and socket tables included) are read in batches
/// of 4096 entries; tries are walked key by key. Cost: about a millisecond
/// per 10k hash entries (see docs/inspect.md), and nothing is changed: an
/// LRU map's order is not touched by reading.
pub fn map_usage(name: &str, map: &MapData) -> Result<MapUsage, IntrospectError> {
    let info = map
        .info()
        .map_err(|source| IntrospectError::map(name, source))?;
    let map_type = info.map_type();
    let capacity = info.max_entries();
    let fd = map.fd().as_fd();
    let key_size = info.key_size() as usize;
    let walk = |result: std::io::Result<u64>| {
        result.map(Some).map_err(|source| IntrospectError::Walk {
            map: name.to_owned(),
            source,
        })
    };
    let entries = match map_type {
        Ok(MapType::Array | MapType::PerCpuArray) => Some(u64::from(capacity)),
        Ok(MapType::RingBuf | MapType::PerfEventArray) => None,
        Ok(
            t @ (MapType::Hash | MapType::LruHash | MapType::PerCpuHash | MapType::LruPerCpuHash),
        ) => {
            let value_size = per_entry_value_size(t, info.value_size() as usize);
            match sys::count_by_batches(fd, key_size, value_size) {
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                    walk(sys::count_by_keys(fd, key_size))?
                }
                other => walk(other)?,
            }
        }
        _ => walk(sys::count_by_keys(fd, key_size))?,
    };
    Ok(MapUsage {
        name: name.to_owned(),
        map_type: map_type.map_or_else(|_| "unknown".to_owned(), |t| format!("{t:?}")),
        id: info.id(),
        capacity,
        entries,
    })
}

/// What the kernel copies out per entry: per-CPU maps give one value,
/// rounded up to 8 bytes, per possible CPU.
fn per_entry_value_size(map_type: MapType, value_size: usize) -> usize {
    match map_type {
        MapType::PerCpuHash | MapType::LruPerCpuHash => {
            let cpus = aya::util::nr_cpus().unwrap_or(1);
            value_size.next_multiple_of(8) * cpus
        }
        _ => value_size,
    }
}
