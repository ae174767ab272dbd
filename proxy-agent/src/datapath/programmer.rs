//! Turns a [`DesiredState`] into ordered writes to the service maps.
//!
//! Order matters because the datapath reads the maps while they change:
//! backends are written before the slots naming them, slots before the
//! frontend `count` that exposes them, and deletions run last in the reverse
//! order. The bookkeeping is updated after every successful write, so after a
//! failed sync it still mirrors the maps and the next sync repairs the rest.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use proxy_common::{Backend, BackendId, CtDirection, ServiceKey, ServiceValue, proto};

use super::maps::{MapError, ServiceMaps};
use crate::model::{DesiredState, ServicePortName};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncStats {
    pub frontends: usize,
    pub backends: usize,
    pub writes: usize,
    pub deletes: usize,
    pub flushed_flows: usize,
}

#[derive(Debug)]
struct Frontend {
    service_id: u16,
    slots: Vec<BackendId>,
    /// The `count` currently in slot 0, `None` before slot 0 is written.
    written_count: Option<u16>,
}

#[derive(Default)]
pub struct Programmer {
    frontends: BTreeMap<ServiceKey, Frontend>,
    backend_ids: HashMap<Backend, BackendId>,
    next_backend_id: BackendId,
    free_backend_ids: Vec<BackendId>,
    service_ids: HashMap<ServicePortName, u16>,
    next_service_id: u16,
}

/// What one frontend should look like after the sync.
struct Wanted {
    spn: ServicePortName,
    backends: Vec<Backend>,
}

impl Programmer {
    pub fn new() -> Self {
        // Id 0 stays unused so a zeroed value never names a real backend.
        Self {
            next_backend_id: 1,
            next_service_id: 1,
            ..Default::default()
        }
    }

    pub fn sync(
        &mut self,
        state: &DesiredState,
        maps: &mut impl ServiceMaps,
    ) -> Result<SyncStats, MapError> {
        let wanted = wanted_frontends(state);
        let mut stats = SyncStats::default();

        for (key, want) in &wanted {
            let service_id = self.service_id(&want.spn);
            let mut ids = Vec::with_capacity(want.backends.len());
            for backend in &want.backends {
                ids.push(self.ensure_backend(backend, maps, &mut stats)?);
            }
            self.program_frontend(*key, service_id, ids, maps, &mut stats)?;
        }

        let gone: Vec<ServiceKey> = self
            .frontends
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.remove_frontend(key, maps, &mut stats)?;
        }
        self.release_unused_backends(maps, &mut stats)?;
        self.service_ids
            .retain(|spn, _| wanted.values().any(|w| &w.spn == spn));

        stats.frontends = self.frontends.len();
        stats.backends = self.backend_ids.len();
        Ok(stats)
    }

    fn service_id(&mut self, spn: &ServicePortName) -> u16 {
        if let Some(id) = self.service_ids.get(spn) {
            return *id;
        }
        let used: BTreeSet<u16> = self.service_ids.values().copied().collect();
        let mut id = self.next_service_id;
        while id == 0 || used.contains(&id) {
            id = id.wrapping_add(1);
        }
        self.next_service_id = id.wrapping_add(1);
        self.service_ids.insert(spn.clone(), id);
        id
    }

    fn ensure_backend(
        &mut self,
        backend: &Backend,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
    ) -> Result<BackendId, MapError> {
        if let Some(id) = self.backend_ids.get(backend) {
            return Ok(*id);
        }
        let id = self.free_backend_ids.pop().unwrap_or_else(|| {
            self.next_backend_id += 1;
            self.next_backend_id - 1
        });
        if let Err(e) = maps.put_backend(id, backend) {
            self.free_backend_ids.push(id);
            return Err(e);
        }
        stats.writes += 1;
        self.backend_ids.insert(*backend, id);
        Ok(id)
    }

    fn program_frontend(
        &mut self,
        key: ServiceKey,
        service_id: u16,
        wanted: Vec<BackendId>,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        let frontend = self.frontends.entry(key).or_insert(Frontend {
            service_id,
            slots: Vec::new(),
            written_count: None,
        });
        let previous = frontend.slots.clone();
        let slots = stable_slots(&frontend.slots, &wanted);
        let new_count = u16::try_from(slots.len())
            .map_err(|_| MapError::TooManyBackends { count: slots.len() })?;

        for (i, id) in slots.iter().enumerate() {
            if frontend.slots.get(i) != Some(id) || frontend.service_id != service_id {
                maps.put_service(
                    &key.with_slot(i as u16 + 1),
                    &ServiceValue::slot(*id, service_id),
                )?;
                stats.writes += 1;
                if i < frontend.slots.len() {
                    frontend.slots[i] = *id;
                } else {
                    frontend.slots.push(*id);
                }
            }
        }
        if frontend.written_count != Some(new_count) || frontend.service_id != service_id {
            maps.put_service(&key, &ServiceValue::frontend(new_count, service_id, 0))?;
            stats.writes += 1;
            frontend.written_count = Some(new_count);
            frontend.service_id = service_id;
        }
        while frontend.slots.len() > slots.len() {
            maps.delete_service(&key.with_slot(frontend.slots.len() as u16))?;
            stats.deletes += 1;
            frontend.slots.pop();
        }
        if key.proto == proto::UDP {
            for gone in previous.iter().filter(|id| !slots.contains(id)) {
                stats.flushed_flows += self.flush_udp_flows(key, *gone, maps)?;
            }
        }
        Ok(())
    }

    fn remove_frontend(
        &mut self,
        key: ServiceKey,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        let Some(frontend) = self.frontends.get_mut(&key) else {
            return Ok(());
        };
        if frontend.written_count.is_some() {
            maps.delete_service(&key)?;
            stats.deletes += 1;
            frontend.written_count = None;
        }
        let mut removed = Vec::new();
        while let Some(id) = frontend.slots.last().copied() {
            maps.delete_service(&key.with_slot(frontend.slots.len() as u16))?;
            stats.deletes += 1;
            frontend.slots.pop();
            removed.push(id);
        }
        self.frontends.remove(&key);
        if key.proto == proto::UDP {
            for id in removed {
                stats.flushed_flows += self.flush_udp_flows(key, id, maps)?;
            }
        }
        Ok(())
    }

    /// Upstream deletes UDP conntrack entries of removed endpoints, since UDP
    /// flows never end on their own and would keep reaching a gone backend.
    fn flush_udp_flows(
        &self,
        key: ServiceKey,
        backend_id: BackendId,
        maps: &mut impl ServiceMaps,
    ) -> Result<usize, MapError> {
        let Some(backend) = self
            .backend_ids
            .iter()
            .find(|(_, id)| **id == backend_id)
            .map(|(b, _)| *b)
        else {
            return Ok(0);
        };
        maps.flush_flows(&|k, v| {
            if k.proto != key.proto {
                return false;
            }
            if k.direction == CtDirection::Forward as u8 {
                k.daddr_be == key.addr_be && k.dport_be == key.port_be && v.backend_id == backend_id
            } else {
                k.saddr_be == backend.addr_be
                    && k.sport_be == backend.port_be
                    && v.nat_addr_be == key.addr_be
                    && v.nat_port_be == key.port_be
            }
        })
    }

    fn release_unused_backends(
        &mut self,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        let used: BTreeSet<BackendId> = self
            .frontends
            .values()
            .flat_map(|f| f.slots.iter().copied())
            .collect();
        let unused: Vec<(Backend, BackendId)> = self
            .backend_ids
            .iter()
            .filter(|(_, id)| !used.contains(id))
            .map(|(b, id)| (*b, *id))
            .collect();
        for (backend, id) in unused {
            maps.delete_backend(id)?;
            stats.deletes += 1;
            self.backend_ids.remove(&backend);
            self.free_backend_ids.push(id);
        }
        Ok(())
    }
}

/// Keeps backends that stay in the slots they had, so slot rewrites (and,
/// with consistent hashing, flow moves) are as few as possible.
fn stable_slots(current: &[BackendId], wanted: &[BackendId]) -> Vec<BackendId> {
    let wanted_set: BTreeSet<BackendId> = wanted.iter().copied().collect();
    let mut slots: Vec<Option<BackendId>> = current
        .iter()
        .map(|id| wanted_set.contains(id).then_some(*id))
        .collect();
    let placed: BTreeSet<BackendId> = slots.iter().flatten().copied().collect();
    let mut newcomers = wanted.iter().copied().filter(|id| !placed.contains(id));
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = newcomers.next();
    }
    let mut out: Vec<BackendId> = slots.into_iter().flatten().collect();
    out.extend(newcomers);
    out
}

fn wanted_frontends(state: &DesiredState) -> BTreeMap<ServiceKey, Wanted> {
    let mut out = BTreeMap::new();
    for svc in state.services.values() {
        let proto = svc.protocol.ip_proto();
        let mut backends: Vec<Backend> = svc
            .internal_endpoints()
            .iter()
            .filter_map(|ep| match ep.ip {
                IpAddr::V4(ip) => Some(Backend {
                    addr_be: u32::from(ip).to_be(),
                    port_be: ep.port.to_be(),
                    proto,
                    _pad: 0,
                }),
                IpAddr::V6(_) => None,
            })
            .collect();
        backends.dedup();
        for ip in &svc.cluster_ips {
            let IpAddr::V4(vip) = ip else { continue };
            let key = ServiceKey::frontend(u32::from(*vip).to_be(), svc.port.to_be(), proto);
            out.insert(
                key,
                Wanted {
                    spn: svc.name.clone(),
                    backends: backends.clone(),
                },
            );
        }
    }
    out
}

#[cfg(test)]
#[path = "programmer/tests.rs"]
mod tests;
