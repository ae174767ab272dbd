//! Every map a datapath pinned in one directory, opened once and read as
//! often as needed (a metrics scrape, an `inspect` run).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use aya::maps::{Map, MapData, PerCpuArray};
use proxy_common::maps as names;

use super::{IntrospectError, MapUsage, map_usage};
use crate::modes::ebpf::stats;

/// The pinned maps of `v<ABI>/maps`, by name. Whatever maps the directory
/// holds are listed, so maps added later need nothing here.
pub struct PinnedMapSet {
    dir: PathBuf,
    maps: Vec<(String, MapData)>,
}

impl PinnedMapSet {
    /// Opens every pin in `dir` (the agent's `PinLayout::maps_dir()`).
    pub fn open(dir: &Path) -> Result<Self, IntrospectError> {
        let entries = std::fs::read_dir(dir).map_err(|source| IntrospectError::Dir {
            dir: dir.to_owned(),
            source,
        })?;
        let mut maps = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| IntrospectError::Dir {
                dir: dir.to_owned(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let data = MapData::from_pin(entry.path())
                .map_err(|source| IntrospectError::map(&name, source))?;
            maps.push((name, data));
        }
        maps.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(PinnedMapSet {
            dir: dir.to_owned(),
            maps,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.maps.iter().map(|(n, _)| n.as_str())
    }

    /// The kernel ids of the maps: a program using one of them is ours.
    pub fn ids(&self) -> BTreeSet<u32> {
        self.maps
            .iter()
            .filter_map(|(_, m)| m.info().ok())
            .map(|i| i.id())
            .collect()
    }

    /// The fill of every map, by name.
    pub fn usage(&self) -> Result<Vec<MapUsage>, IntrospectError> {
        self.maps
            .iter()
            .map(|(name, map)| map_usage(name, map))
            .collect()
    }

    /// The fill of one map.
    pub fn usage_of(&self, name: &str) -> Result<MapUsage, IntrospectError> {
        let (name, map) =
            self.maps
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| IntrospectError::Missing {
                    dir: self.dir.clone(),
                    map: name.to_owned(),
                })?;
        map_usage(name, map)
    }

    /// Every datapath counter by name, summed over the CPUs.
    pub fn counters(&self) -> Result<Vec<(&'static str, u64)>, IntrospectError> {
        let path = self.dir.join(names::STATS);
        let data = MapData::from_pin(&path)
            .map_err(|source| IntrospectError::map(names::STATS, source))?;
        let counters: PerCpuArray<MapData, u64> = Map::from_map_data(data)
            .and_then(PerCpuArray::try_from)
            .map_err(|source| IntrospectError::map(names::STATS, source))?;
        Ok(stats::read(&counters))
    }
}
