//! Turns a [`DesiredState`] into ordered writes to the service maps.
//!
//! Order matters because the datapath reads the maps while they change:
//! backends are written before the slots naming them, slots before the
//! frontend `count` that exposes them, and deletions run last in the reverse
//! order. The bookkeeping is updated after every successful write, so after a
//! failed sync it still mirrors the maps and the next sync repairs the rest.
//!
//! A partial sync looks only at the service ports that changed; backends are
//! reference-counted by the slots naming them, so nothing scans all services.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use proxy_common::{Backend, BackendId, CtDirection, ServiceKey, ServiceValue, proto};

use super::maps::{MapError, ServiceMaps};
use crate::model::{DesiredService, DesiredState, ServicePortName};

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
    owner: ServicePortName,
    service_id: u16,
    slots: Vec<BackendId>,
    /// The `count` currently in slot 0, `None` before slot 0 is written.
    written_count: Option<u16>,
}

/// Hands out small integer ids, reusing released ones; 0 is never used so a
/// zeroed map value never names anything.
#[derive(Debug)]
struct Ids {
    next: u32,
    max: u32,
    free: Vec<u32>,
}

impl Ids {
    fn new(max: u32) -> Self {
        Self {
            next: 1,
            max,
            free: Vec::new(),
        }
    }

    fn take(&mut self) -> Option<u32> {
        self.free.pop().or_else(|| {
            (self.next <= self.max).then(|| {
                self.next += 1;
                self.next - 1
            })
        })
    }

    fn give_back(&mut self, id: u32) {
        self.free.push(id);
    }
}

pub struct Programmer {
    frontends: HashMap<ServiceKey, Frontend>,
    by_service: HashMap<ServicePortName, BTreeSet<ServiceKey>>,
    backends: HashMap<Backend, BackendId>,
    backend_by_id: HashMap<BackendId, Backend>,
    /// How many slots name each backend.
    backend_refs: HashMap<BackendId, u32>,
    backend_ids: Ids,
    service_ids: HashMap<ServicePortName, u16>,
    service_id_pool: Ids,
}

impl Default for Programmer {
    fn default() -> Self {
        Self::new()
    }
}

impl Programmer {
    pub fn new() -> Self {
        Self {
            frontends: HashMap::new(),
            by_service: HashMap::new(),
            backends: HashMap::new(),
            backend_by_id: HashMap::new(),
            backend_refs: HashMap::new(),
            backend_ids: Ids::new(u32::MAX - 1),
            service_ids: HashMap::new(),
            service_id_pool: Ids::new(u32::from(u16::MAX)),
        }
    }

    /// Makes the maps hold exactly `state`.
    pub fn sync(
        &mut self,
        state: &DesiredState,
        maps: &mut impl ServiceMaps,
    ) -> Result<SyncStats, MapError> {
        let mut ports: BTreeSet<ServicePortName> = state.services.keys().cloned().collect();
        ports.extend(self.by_service.keys().cloned());
        self.sync_ports(state, &ports, maps)
    }

    /// Brings only the service ports in `changed` to what `state` says
    /// (a port absent from `state` is removed).
    pub fn sync_changed(
        &mut self,
        state: &DesiredState,
        changed: &BTreeSet<ServicePortName>,
        maps: &mut impl ServiceMaps,
    ) -> Result<SyncStats, MapError> {
        self.sync_ports(state, changed, maps)
    }

    fn sync_ports(
        &mut self,
        state: &DesiredState,
        ports: &BTreeSet<ServicePortName>,
        maps: &mut impl ServiceMaps,
    ) -> Result<SyncStats, MapError> {
        let mut stats = SyncStats::default();
        let mut released = BTreeSet::new();
        let mut wanted_keys: HashMap<&ServicePortName, BTreeSet<ServiceKey>> = HashMap::new();

        for spn in ports {
            let Some(svc) = state.services.get(spn) else {
                continue;
            };
            let service_id = self.service_id(spn)?;
            let backends = ipv4_backends(svc);
            let mut ids = Vec::with_capacity(backends.len());
            for backend in &backends {
                ids.push(self.ensure_backend(backend, maps, &mut stats)?);
            }
            let keys = ipv4_frontends(svc);
            for key in &keys {
                self.program_frontend(
                    *key,
                    spn,
                    service_id,
                    &ids,
                    maps,
                    &mut stats,
                    &mut released,
                )?;
            }
            wanted_keys.insert(spn, keys.into_iter().collect());
        }

        for spn in ports {
            let owned = self.by_service.get(spn).cloned().unwrap_or_default();
            let keep = wanted_keys.get(spn);
            for key in owned.iter().filter(|k| keep.is_none_or(|w| !w.contains(k))) {
                self.remove_frontend(*key, maps, &mut stats, &mut released)?;
            }
            if self.by_service.get(spn).is_none_or(BTreeSet::is_empty) {
                self.by_service.remove(spn);
                if let Some(id) = self.service_ids.remove(spn) {
                    self.service_id_pool.give_back(u32::from(id));
                }
            }
        }

        for id in released {
            if self.backend_refs.get(&id).copied().unwrap_or(0) == 0 {
                maps.delete_backend(id)?;
                stats.deletes += 1;
                self.backend_refs.remove(&id);
                if let Some(backend) = self.backend_by_id.remove(&id) {
                    self.backends.remove(&backend);
                }
                self.backend_ids.give_back(id);
            }
        }

        stats.frontends = self.frontends.len();
        stats.backends = self.backends.len();
        Ok(stats)
    }

    fn service_id(&mut self, spn: &ServicePortName) -> Result<u16, MapError> {
        if let Some(id) = self.service_ids.get(spn) {
            return Ok(*id);
        }
        let id = self
            .service_id_pool
            .take()
            .ok_or(MapError::TooManyServices)? as u16;
        self.service_ids.insert(spn.clone(), id);
        Ok(id)
    }

    fn ensure_backend(
        &mut self,
        backend: &Backend,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
    ) -> Result<BackendId, MapError> {
        if let Some(id) = self.backends.get(backend) {
            return Ok(*id);
        }
        let id = self.backend_ids.take().ok_or(MapError::TooManyBackends {
            count: self.backends.len(),
        })?;
        if let Err(e) = maps.put_backend(id, backend) {
            self.backend_ids.give_back(id);
            return Err(e);
        }
        stats.writes += 1;
        self.backends.insert(*backend, id);
        self.backend_by_id.insert(id, *backend);
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)]
    fn program_frontend(
        &mut self,
        key: ServiceKey,
        owner: &ServicePortName,
        service_id: u16,
        wanted: &[BackendId],
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
        released: &mut BTreeSet<BackendId>,
    ) -> Result<(), MapError> {
        let frontend = self.frontends.entry(key).or_insert_with(|| Frontend {
            owner: owner.clone(),
            service_id,
            slots: Vec::new(),
            written_count: None,
        });
        if &frontend.owner != owner {
            // Two service ports claim one address:port (e.g. the same external IP):
            // the last one programmed wins, as with upstream's rules.
            tracing::warn!(frontend = ?key, previous = %frontend.owner, now = %owner, "frontend claimed by two service ports");
            if let Some(keys) = self.by_service.get_mut(&frontend.owner) {
                keys.remove(&key);
            }
            frontend.owner = owner.clone();
        }
        self.by_service
            .entry(owner.clone())
            .or_default()
            .insert(key);

        let previous = frontend.slots.clone();
        let slots = stable_slots(&frontend.slots, wanted);
        let new_count = u16::try_from(slots.len())
            .map_err(|_| MapError::TooManyBackends { count: slots.len() })?;
        let refs = &mut self.backend_refs;

        for (i, id) in slots.iter().enumerate() {
            if frontend.slots.get(i) != Some(id) || frontend.service_id != service_id {
                maps.put_service(
                    &key.with_slot(i as u16 + 1),
                    &ServiceValue::slot(*id, service_id),
                )?;
                stats.writes += 1;
                *refs.entry(*id).or_default() += 1;
                match frontend.slots.get_mut(i) {
                    Some(old) => {
                        unref(refs, *old, released);
                        *old = *id;
                    }
                    None => frontend.slots.push(*id),
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
            let old = frontend.slots.pop().expect("longer than slots");
            unref(refs, old, released);
        }
        if key.proto == proto::UDP {
            for gone in previous.iter().filter(|id| !slots.contains(id)) {
                stats.flushed_flows += flush_udp_flows(&self.backend_by_id, key, *gone, maps)?;
            }
        }
        Ok(())
    }

    fn remove_frontend(
        &mut self,
        key: ServiceKey,
        maps: &mut impl ServiceMaps,
        stats: &mut SyncStats,
        released: &mut BTreeSet<BackendId>,
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
            unref(&mut self.backend_refs, id, released);
            removed.push(id);
        }
        let owner = frontend.owner.clone();
        self.frontends.remove(&key);
        if let Some(keys) = self.by_service.get_mut(&owner) {
            keys.remove(&key);
        }
        if key.proto == proto::UDP {
            for id in removed {
                stats.flushed_flows += flush_udp_flows(&self.backend_by_id, key, id, maps)?;
            }
        }
        Ok(())
    }
}

fn unref(refs: &mut HashMap<BackendId, u32>, id: BackendId, released: &mut BTreeSet<BackendId>) {
    if let Some(n) = refs.get_mut(&id) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            released.insert(id);
        }
    }
}

/// Upstream deletes UDP conntrack entries of removed endpoints, since UDP
/// flows never end on their own and would keep reaching a gone backend.
fn flush_udp_flows(
    backend_by_id: &HashMap<BackendId, Backend>,
    key: ServiceKey,
    backend_id: BackendId,
    maps: &mut impl ServiceMaps,
) -> Result<usize, MapError> {
    let Some(backend) = backend_by_id.get(&backend_id).copied() else {
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

/// The IPv4 endpoints ClusterIP traffic uses (internalTrafficPolicy applied), deduplicated.
fn ipv4_backends(svc: &DesiredService) -> Vec<Backend> {
    let proto = svc.protocol.ip_proto();
    let mut seen = BTreeSet::new();
    svc.internal_endpoints()
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
        .filter(|b| seen.insert((b.addr_be, b.port_be)))
        .collect()
}

fn ipv4_frontends(svc: &DesiredService) -> Vec<ServiceKey> {
    let proto = svc.protocol.ip_proto();
    svc.cluster_ips
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(vip) => Some(ServiceKey::frontend(
                u32::from(*vip).to_be(),
                svc.port.to_be(),
                proto,
            )),
            IpAddr::V6(_) => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "programmer/tests.rs"]
mod tests;
