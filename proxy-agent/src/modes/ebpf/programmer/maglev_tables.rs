//! The Maglev tables of one family (`proxy_common::maglev`): one per
//! endpoint set of a service port that asks for Maglev, each written by
//! rewriting only the array elements whose buckets changed.

use foldhash::{HashMap, HashMapExt as _};
use std::collections::BTreeSet;

use proxy_common::{
    ServiceValue,
    maglev::{MaglevChunk, SLOTS_PER_CHUNK, chunks_per_table},
};

use super::{frontends::EndpointSet, ids::Ids};
use crate::model::{Balancing, ServicePortName};
use crate::modes::ebpf::{
    family::AgentFamily,
    maglev,
    maps::{MapError, ServiceMaps},
};

/// How Maglev is configured: the table size, and whether services without
/// the annotation use it (`loadBalancing.algorithm: maglev`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevSettings {
    pub table_size: u32,
    pub by_default: bool,
}

impl Default for MaglevSettings {
    fn default() -> Self {
        MaglevSettings {
            table_size: crate::options::ebpf::DEFAULT_MAGLEV_TABLE,
            by_default: false,
        }
    }
}

impl MaglevSettings {
    pub fn wanted(&self, balancing: Balancing) -> bool {
        match balancing {
            Balancing::Configured => self.by_default,
            Balancing::Random => false,
            Balancing::Maglev => true,
        }
    }
}

type SetName = (ServicePortName, EndpointSet);

struct Table {
    id: u32,
    /// Each bucket's slot, as written; empty before the first write.
    written: Vec<u16>,
}

pub(super) struct MaglevTables {
    settings: MaglevSettings,
    ids: Ids,
    tables: HashMap<SetName, Table>,
    /// Service ports balanced at random because no table was left: given
    /// one once a table is freed.
    starved: BTreeSet<ServicePortName>,
}

/// What one table update wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableWrites {
    pub elements: usize,
}

impl MaglevTables {
    /// Tables for an array of `chunks` elements.
    pub(super) fn new(settings: MaglevSettings, chunks: u32) -> Self {
        let per_table = chunks_per_table(settings.table_size).max(1);
        MaglevTables {
            settings,
            ids: Ids::range(1, chunks / per_table),
            tables: HashMap::new(),
            starved: BTreeSet::new(),
        }
    }

    pub(super) fn settings(&self) -> MaglevSettings {
        self.settings
    }

    /// Takes over the table an adopted frontend of `set` names (its
    /// contents are rewritten at the first sync, to the same values when
    /// nothing changed). A table of another size is not taken over.
    pub(super) fn adopt(&mut self, set: SetName, table: ServiceValue) {
        let per_table = chunks_per_table(self.settings.table_size).max(1);
        let (first, m) = table.maglev_table();
        if m != self.settings.table_size || first % per_table != 0 || self.tables.contains_key(&set)
        {
            return;
        }
        let id = first / per_table + 1;
        if self.tables.values().any(|t| t.id == id) {
            return;
        }
        self.tables.insert(
            set,
            Table {
                id,
                written: Vec::new(),
            },
        );
        self.ids.adopt(self.tables.values().map(|t| t.id));
    }

    /// Brings the table of `set` to `slots` (the set's backends by slot,
    /// named by `name`) and returns the reference its frontends carry;
    /// `None` when no table is left (the set is balanced at random).
    pub(super) fn update<F: AgentFamily>(
        &mut self,
        set: SetName,
        names: &[String],
        maps: &mut impl ServiceMaps<F>,
        writes: &mut TableWrites,
    ) -> Result<Option<ServiceValue>, MapError> {
        let m = self.settings.table_size;
        let per_table = chunks_per_table(m);
        let table = match self.tables.get_mut(&set) {
            Some(t) => t,
            None => {
                let Some(id) = self.ids.take() else {
                    if self.starved.insert(set.0.clone()) {
                        tracing::warn!(
                            service = %set.0,
                            "no Maglev table left: the service is balanced at random \
                             until one is freed; raise maps.maglevTables \
                             (--ebpf-map-size-maglev-tables)"
                        );
                    }
                    return Ok(None);
                };
                self.tables.entry(set).or_insert(Table {
                    id,
                    written: Vec::new(),
                })
            }
        };
        let first = (table.id - 1) * per_table;
        let wanted: Vec<u16> = maglev::table(names, m)
            .into_iter()
            .map(|i| i as u16 + 1)
            .collect();
        if wanted.is_empty() {
            // No backend: the frontends' count of 0 decides, the table is unused.
            return Ok(Some(ServiceValue::maglev_ref(first, m)));
        }
        let changed = maglev::changed(
            &table
                .written
                .iter()
                .map(|s| u32::from(*s))
                .collect::<Vec<_>>(),
            &wanted.iter().map(|s| u32::from(*s)).collect::<Vec<_>>(),
        );
        let mut last_chunk = None;
        for bucket in changed {
            let chunk = bucket as u32 / SLOTS_PER_CHUNK;
            if last_chunk == Some(chunk) {
                continue;
            }
            last_chunk = Some(chunk);
            let start = (chunk * SLOTS_PER_CHUNK) as usize;
            let mut element = MaglevChunk::default();
            for (i, slot) in element.slots.iter_mut().enumerate() {
                *slot = wanted.get(start + i).copied().unwrap_or(0);
            }
            maps.put_maglev(first + chunk, &element)?;
            writes.elements += 1;
            if table.written.len() != wanted.len() {
                table.written = vec![0; wanted.len()];
            }
            let end = (start + SLOTS_PER_CHUNK as usize).min(wanted.len());
            table.written[start..end].copy_from_slice(&wanted[start..end]);
        }
        Ok(Some(ServiceValue::maglev_ref(first, m)))
    }

    /// Frees the tables of `spn` whose set is not in `keep`; their
    /// frontends no longer name them.
    pub(super) fn release_unused(&mut self, spn: &ServicePortName, keep: &[EndpointSet]) {
        if self.tables.is_empty() {
            return;
        }
        for set in EndpointSet::ALL {
            if keep.contains(&set) {
                continue;
            }
            if let Some(table) = self.tables.remove(&(spn.clone(), set)) {
                self.ids.give_back(table.id);
            }
        }
    }

    /// The service ports that found no table, when a table is free now.
    pub(super) fn take_starved(&mut self) -> BTreeSet<ServicePortName> {
        if self.ids.has_free() {
            std::mem::take(&mut self.starved)
        } else {
            BTreeSet::new()
        }
    }
}
