//! Turns a [`DesiredState`] into ordered writes to the service maps.
//!
//! Order matters because the datapath reads the maps while they change:
//! backends and source ranges are written before the frontends using them,
//! slots before the frontend `count` that exposes them, cluster-IP markers
//! after their frontends, and deletions run last in the reverse order. The
//! bookkeeping is updated after every successful write, so after a failed
//! sync it still mirrors the maps and the next sync repairs the rest.
//!
//! A partial sync looks only at the service ports that changed; backends are
//! reference-counted by the slots naming them, so nothing scans all services.

mod adopt;
mod filter_bits;
mod frontends;
mod ids;
mod maglev_tables;
mod markers;
mod slot_ranges;
mod small_set;

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use proxy_common::{
    BackendId, BackendOf, FrontendKind, Scope, ServiceKeyOf, ServiceValue, V4, V6,
    filter::{backend_bit, frontend_bit},
    maglev::MAGLEV_SLOT,
    proto,
    service::flags,
};

use self::{
    filter_bits::FilterBits,
    frontends::{
        EndpointSet, PerSet, WantedFrontend, has_endpoint_on, wanted_frontends,
        wanted_source_ranges,
    },
    ids::Ids,
    maglev_tables::MaglevTables,
    markers::ClusterIpMarkers,
    slot_ranges::{SlotRange, SlotRanges, room_for},
    small_set::SmallSet,
};
use super::family::AgentFamily;
use super::flow_flush::GoneFlows;
use super::maps::{Flushed, MapError, ServiceMaps};
use super::node::{NodeAddresses, NodeAddressesOf};
use super::stale_sockets::GoneUdp;
use crate::model::{DesiredService, DesiredState, Protocol, ServicePortName};

pub use adopt::{AdoptStats, ServiceSnapshot, ServiceSnapshotOf};
pub use maglev_tables::MaglevSettings;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncStats {
    pub frontends: usize,
    pub backends: usize,
    pub writes: usize,
    pub deletes: usize,
    /// UDP frontends whose flows were judged again: an endpoint address
    /// they were kept for no longer serves, or the frontend is gone.
    pub udp_frontends_judged: usize,
    /// Of their flows, those this sync deleted (none when a thread of its
    /// own does it: [`super::maps::KernelMaps::flush_in_background`]).
    pub flushed_flows: usize,
    /// `MAGLEV` array elements written (each holds 4 buckets).
    pub maglev_elements: usize,
}

#[derive(Debug)]
struct Frontend {
    owner: ServicePortName,
    service_id: u32,
    /// Its backends by slot, as written to its range of the slots array.
    slots: Vec<BackendId>,
    /// Where its slots are in the slots array (`None` before it has any).
    range: Option<SlotRange>,
    /// Slot 0 as written, `None` before it is.
    written: Option<ServiceValue>,
    /// The Maglev table reference as written (slot [`MAGLEV_SLOT`]).
    maglev: Option<ServiceValue>,
}

/// An endpoint set's backends by slot, and its Maglev table when it has one.
type SetSlots = (Vec<BackendId>, Option<ServiceValue>);

/// What the programmer keeps per service port, in one table: three tables
/// keyed by the same names held about 10 MB more at 50,000 services.
#[derive(Debug)]
struct PortState<F: AgentFamily> {
    /// Its service id, once it has one.
    id: Option<u32>,
    frontends: SmallSet<ServiceKeyOf<F>>,
    /// Each endpoint set's backends by slot: every frontend of the set
    /// numbers its slots alike, so they can share a Maglev table. Kept
    /// while the port is in the desired state, frontends or not.
    set_slots: PerSet<Vec<BackendId>>,
    /// A UDP port's: the endpoint addresses its flows are kept for (sorted).
    /// `None`: not known, and its flows are judged at its next sync: an
    /// adopted port's (a previous agent kept them), or one that had none.
    /// A new port's is empty: no flow went through it yet.
    udp_keepers: Option<Vec<F::Addr>>,
}

impl<F: AgentFamily> Default for PortState<F> {
    fn default() -> Self {
        PortState {
            id: None,
            frontends: SmallSet::default(),
            set_slots: PerSet::default(),
            udp_keepers: Some(Vec::new()),
        }
    }
}

impl<F: AgentFamily> PortState<F> {
    fn is_empty(&self) -> bool {
        self.id.is_none() && self.frontends.is_empty() && self.set_slots.is_empty()
    }
}

/// A UDP frontend whose flows to any endpoint address but `keep` go.
struct UdpRule<F: AgentFamily> {
    frontend: ServiceKeyOf<F>,
    keep: Vec<F::Addr>,
}

/// What one sync collects on its way: counters, and the work left for the end.
struct SyncRun<F: AgentFamily> {
    stats: SyncStats,
    cluster_ip_frontends: Vec<ServiceKeyOf<F>>,
    /// The endpoint sets balanced by a Maglev table, per service port synced.
    maglev_sets: HashMap<ServicePortName, Vec<EndpointSet>>,
}

impl<F: AgentFamily> Default for SyncRun<F> {
    fn default() -> Self {
        SyncRun {
            stats: SyncStats::default(),
            cluster_ip_frontends: Vec::new(),
            maglev_sets: HashMap::new(),
        }
    }
}

/// One family's programmer: it writes that family's maps from the model's
/// addresses and endpoints of that family, as upstream runs one proxier per
/// family. [`Programmer`] holds one per family.
pub struct FamilyProgrammer<F: AgentFamily> {
    node: NodeAddressesOf<F>,
    /// UDP frontends whose sockets to endpoints that no longer serve are to
    /// end, since [`Programmer::take_gone_udp`].
    gone_udp: Vec<GoneUdp>,
    /// UDP frontends whose flows are to be judged, kept until a flush took
    /// them: a sync that fails after judging a port must not lose them.
    udp_rules: Vec<UdpRule<F>>,
    /// UDP frontends removed: their flows go, unless the frontend stays in
    /// its other scope. Kept as `udp_rules` are.
    removed_udp: Vec<ServiceKeyOf<F>>,
    frontends: HashMap<ServiceKeyOf<F>, Frontend>,
    ports: HashMap<ServicePortName, PortState<F>>,
    backends: HashMap<BackendOf<F>, BackendId>,
    backend_by_id: HashMap<BackendId, BackendOf<F>>,
    /// Ids given or taken back since [`FamilyProgrammer::take_touched`]:
    /// what the names publication must update (adopted ids are not).
    touched: Touched,
    /// How many slots name each backend.
    backend_refs: HashMap<BackendId, u32>,
    /// Backends that may have no slot left: deleted at the end of a sync
    /// (kept across a failed one, so none leaks).
    unreferenced: BTreeSet<BackendId>,
    backend_ids: Ids,
    service_id_pool: Ids,
    /// Source ranges written, by service id.
    source_ranges: HashMap<u32, BTreeSet<F::Net>>,
    markers: ClusterIpMarkers<F>,
    /// What `SERVICES` and `BACKENDS` hold; a sync that would not fit is refused.
    capacity: Option<Capacity>,
    maglev: MaglevTables,
    /// Frontends with a Maglev table reference (`Frontend::maglev`).
    maglev_refs: usize,
    slot_ranges: SlotRanges,
    /// XDP's filter: every frontend's bit and every backend's.
    filter: FilterBits,
}

/// Service ports and backends whose ids were given or taken back, in that
/// order (one may come more than once).
#[derive(Debug, Default)]
pub struct Touched {
    pub ports: Vec<ServicePortName>,
    pub backends: Vec<BackendId>,
}

/// The sizes of the maps a sync must fit in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub services: u32,
    pub backends: u32,
    /// Elements of the `MAGLEV` array (tables x elements per table).
    pub maglev_chunks: u32,
    /// Slot indexes of the `SLOTS` array.
    pub slots: u32,
}

impl<F: AgentFamily> Default for FamilyProgrammer<F> {
    fn default() -> Self {
        Self::new()
    }
}

/// Ids of each family in a range of its own: an id alone says which family
/// it is in (docs/dual-stack.md), and 0 is never used.
fn id_range<F: AgentFamily>() -> (u32, u32) {
    match F::FAMILY {
        crate::model::IpFamily::V4 => (1, (1 << 31) - 1),
        crate::model::IpFamily::V6 => (1 << 31, u32::MAX - 1),
    }
}

impl<F: AgentFamily> FamilyProgrammer<F> {
    /// A programmer with no node addresses yet: NodePorts are programmed
    /// once [`FamilyProgrammer::set_node_addresses`] names some.
    pub fn new() -> Self {
        let (first, last) = id_range::<F>();
        Self {
            node: NodeAddressesOf::default(),
            gone_udp: Vec::new(),
            udp_rules: Vec::new(),
            removed_udp: Vec::new(),
            frontends: HashMap::new(),
            ports: HashMap::new(),
            backends: HashMap::new(),
            backend_by_id: HashMap::new(),
            touched: Touched::default(),
            backend_refs: HashMap::new(),
            unreferenced: BTreeSet::new(),
            backend_ids: Ids::range(first, last),
            service_id_pool: Ids::range(first, last),
            source_ranges: HashMap::new(),
            markers: ClusterIpMarkers::default(),
            capacity: None,
            maglev: MaglevTables::new(MaglevSettings::default(), u32::MAX),
            maglev_refs: 0,
            slot_ranges: SlotRanges::new(u32::MAX),
            filter: FilterBits::default(),
        }
    }

    /// Refuse syncs that would not fit in maps of these sizes. Before the
    /// first sync or adoption.
    pub fn set_capacity(&mut self, capacity: Capacity) {
        self.capacity = Some(capacity);
        self.maglev = MaglevTables::new(self.maglev.settings(), capacity.maglev_chunks);
        self.slot_ranges = SlotRanges::new(capacity.slots);
    }

    /// How Maglev tables are sized and which services use them. Before the
    /// first sync or adoption.
    pub fn set_maglev(&mut self, settings: MaglevSettings) {
        let chunks = self.capacity.map_or(u32::MAX, |c| c.maglev_chunks);
        self.maglev = MaglevTables::new(settings, chunks);
    }

    /// The id of every service port programmed (or being programmed).
    pub fn service_ids(&self) -> impl Iterator<Item = (&ServicePortName, u32)> {
        self.ports
            .iter()
            .filter_map(|(name, port)| port.id.map(|id| (name, id)))
    }

    /// The id of `name` in this family, if it is programmed.
    pub fn programmed_service_id(&self, name: &ServicePortName) -> Option<u32> {
        self.ports.get(name).and_then(|port| port.id)
    }

    /// Every backend in this family's `BACKENDS` map, by id.
    pub fn backend_ids(&self) -> impl Iterator<Item = (BackendId, &BackendOf<F>)> {
        self.backend_by_id.iter().map(|(id, b)| (*id, b))
    }

    /// The backend `id` names in this family's `BACKENDS` map.
    pub fn backend(&self, id: BackendId) -> Option<&BackendOf<F>> {
        self.backend_by_id.get(&id)
    }

    /// The service ports and backends whose ids were given or taken back
    /// since the last call.
    pub fn take_touched(&mut self) -> Touched {
        std::mem::take(&mut self.touched)
    }

    /// Makes the maps hold exactly `state`.
    pub fn sync(
        &mut self,
        state: &DesiredState,
        maps: &mut impl ServiceMaps<F>,
    ) -> Result<SyncStats, MapError> {
        // A port whose first sync failed early may hold an id but no frontend.
        let leftover: Vec<ServicePortName> = self
            .ports
            .keys()
            .filter(|k| !state.services.contains_key(*k))
            .cloned()
            .collect();
        let ports: Vec<Port<'_>> = (state.services.iter().map(|(k, v)| (k, Some(v))))
            .chain(leftover.iter().map(|k| (k, None)))
            .collect();
        self.sync_ports(state, &ports, maps)
    }

    /// Brings only the service ports in `changed` to what `state` says
    /// (a port absent from `state` is removed).
    pub fn sync_changed(
        &mut self,
        state: &DesiredState,
        changed: &BTreeSet<ServicePortName>,
        maps: &mut impl ServiceMaps<F>,
    ) -> Result<SyncStats, MapError> {
        self.sync_ports(state, &ports_of(state, changed), maps)
    }

    /// Records the node's addresses and re-syncs the service ports that
    /// depend on them (node ports, LB source ranges); nothing when unchanged.
    pub fn set_node_addresses(
        &mut self,
        node: &NodeAddressesOf<F>,
        state: &DesiredState,
        maps: &mut impl ServiceMaps<F>,
    ) -> Result<SyncStats, MapError> {
        if *node == self.node {
            return Ok(self.totals(SyncStats::default()));
        }
        // Endpoints on an address the node gained or lost change flags.
        let moved: BTreeSet<F::Ip> = self
            .node
            .host
            .symmetric_difference(&node.host)
            .copied()
            .collect();
        self.node = node.clone();
        let ports: BTreeSet<ServicePortName> = state
            .services
            .values()
            .filter(|svc| depends_on_node(svc) || has_endpoint_on::<F>(svc, &moved))
            .map(|svc| svc.name.clone())
            .collect();
        self.sync_ports(state, &ports_of(state, &ports), maps)
    }

    fn totals(&self, stats: SyncStats) -> SyncStats {
        SyncStats {
            frontends: self.frontends.len(),
            backends: self.backends.len(),
            ..stats
        }
    }

    fn sync_ports(
        &mut self,
        state: &DesiredState,
        ports: &[Port<'_>],
        maps: &mut impl ServiceMaps<F>,
    ) -> Result<SyncStats, MapError> {
        self.check_capacity(ports)?;
        let mut run = SyncRun::default();
        // Each port's wanted frontend keys, by its place in `ports`.
        let mut wanted_keys: Vec<Option<Vec<ServiceKeyOf<F>>>> = Vec::with_capacity(ports.len());
        self.make_room(ports);

        for (spn, svc) in ports {
            wanted_keys.push(match svc {
                Some(svc) => Some(self.program_service(spn, svc, maps, &mut run)?),
                None => None,
            });
        }
        for frontend in std::mem::take(&mut run.cluster_ip_frontends) {
            self.markers.add(frontend, maps, &mut run.stats)?;
        }

        for ((spn, svc), keep) in ports.iter().zip(&wanted_keys) {
            let spn = *spn;
            let keep = keep.as_ref();
            let gone: Vec<ServiceKeyOf<F>> = self.ports.get(spn).map_or_else(Vec::new, |port| {
                (port.frontends.iter())
                    .filter(|k| keep.is_none_or(|w| w.binary_search(k).is_err()))
                    .copied()
                    .collect()
            });
            for key in gone {
                self.remove_frontend(key, maps, &mut run)?;
            }
            if self
                .ports
                .get(spn)
                .is_none_or(|port| port.frontends.is_empty())
            {
                self.release_service(spn, maps, &mut run)?;
            }
            // No frontend names the tables of sets no longer balanced by one.
            let keep = run.maglev_sets.get(spn).map_or(&[][..], Vec::as_slice);
            self.maglev.release_unused(spn, keep);
            if svc.is_none()
                && let Some(port) = self.ports.get_mut(spn)
            {
                port.set_slots = PerSet::default();
            }
            if let Some(svc) = svc.filter(|s| s.protocol == Protocol::Udp) {
                self.judge_udp_flows(spn, svc);
            }
            if self.ports.get(spn).is_some_and(PortState::is_empty) {
                self.ports.remove(spn);
            }
        }

        // Ports that found no Maglev table get one freed by this sync.
        for spn in self.maglev.take_starved() {
            if let Some(svc) = state.services.get(&spn) {
                self.program_service(&spn, svc, maps, &mut run)?;
            }
        }
        for frontend in std::mem::take(&mut run.cluster_ip_frontends) {
            self.markers.add(frontend, maps, &mut run.stats)?;
        }

        self.flush_gone_udp_flows(maps, &mut run)?;
        self.markers.delete_unused(maps, &mut run.stats)?;
        self.delete_unreferenced_backends(maps, &mut run)?;
        // Not counted in `writes`: words of a derived bitmap, written after
        // the entries they stand for (before a cold start's batched ones,
        // which is harmless: a bit without its entry costs XDP a lookup),
        // and all of them once after adoption.
        self.filter.write(maps)?;
        Ok(self.totals(run.stats))
    }

    /// Makes room in the per-port tables for the ports a sync brings, at
    /// once: a cold start's tables grown one doubling at a time were a tenth
    /// of its sync. Counted from this family's ports, beyond those held.
    fn make_room(&mut self, ports: &[Port<'_>]) {
        if ports.len() <= self.ports.len() {
            return;
        }
        let of_family = (ports.iter())
            .filter(|(_, svc)| {
                svc.is_some_and(|s| s.cluster_ips.iter().any(|ip| F::ip(ip).is_some()))
            })
            .count();
        let more = of_family.saturating_sub(self.ports.len());
        self.ports.reserve(more);
        self.frontends.reserve(more);
        self.backends.reserve(more);
        self.backend_by_id.reserve(more);
        self.backend_refs.reserve(more);
    }

    /// Fails, before anything is written, when the maps could not hold the
    /// state while syncing `ports`: new entries are written before stale ones
    /// go, so what counts is the old entries plus what the sync adds.
    fn check_capacity(&self, ports: &[Port<'_>]) -> Result<(), MapError> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        // Counted, not summed over every frontend: a sync of one port at
        // 50,000 services spent 0.8 ms here.
        debug_assert_eq!(
            self.maglev_refs,
            self.frontends
                .values()
                .filter(|f| f.maglev.is_some())
                .count()
        );
        let mut entries = self.frontends.len() + self.maglev_refs + self.markers.len();
        // Ranges that move are held twice until the old one is freed.
        let mut slots = self.slot_ranges.used();
        let mut new_backends = HashSet::new();
        for svc in ports.iter().filter_map(|(_, svc)| *svc) {
            for f in wanted_frontends(svc, &self.node) {
                let backends = f.endpoints.backends(svc, &self.node.host);
                let have = self.frontends.get(&f.key);
                let had = have.map_or(0, |fe| 1 + usize::from(fe.maglev.is_some()));
                let maglev = usize::from(self.maglev.settings().wanted(svc.balancing));
                entries += (1 + maglev).saturating_sub(had);
                if !backends.is_empty()
                    && have
                        .and_then(|fe| fe.range)
                        .is_none_or(|r| (r.len as usize) < backends.len())
                {
                    slots += u64::from(room_for(backends.len()));
                }
                if f.kind() == FrontendKind::ClusterIp && !self.markers.has(f.key.addr_be) {
                    entries += 1;
                }
                new_backends.extend(
                    backends
                        .into_iter()
                        .filter(|b| !self.backends.contains_key(b)),
                );
            }
        }
        let backends = self.backends.len() + new_backends.len();
        let slots = usize::try_from(slots).unwrap_or(usize::MAX);
        for (map, setting, needed, capacity) in [
            (
                F::SERVICES,
                "maps.services (--ebpf-map-size-services)",
                entries,
                capacity.services,
            ),
            (
                F::SLOTS,
                "maps.backendSlots (--ebpf-map-size-backend-slots)",
                slots,
                capacity.slots,
            ),
            (
                F::BACKENDS,
                "maps.backends (--ebpf-map-size-backends)",
                backends,
                capacity.backends,
            ),
        ] {
            if needed > capacity as usize {
                return Err(MapError::Capacity {
                    map,
                    setting,
                    needed,
                    capacity,
                });
            }
        }
        Ok(())
    }

    /// Programs every frontend of one service port; returns their keys, sorted.
    fn program_service(
        &mut self,
        spn: &ServicePortName,
        svc: &DesiredService,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<Vec<ServiceKeyOf<F>>, MapError> {
        let wanted = wanted_frontends(svc, &self.node);
        if wanted.is_empty() && self.programmed_service_id(spn).is_none() {
            // Nothing of this family (an IPv4-only port in the IPv6
            // programmer): no id, no entry.
            return Ok(Vec::new());
        }
        let service_id = self.service_id(spn)?;
        let ranges = wanted_source_ranges(svc, &self.node);
        self.add_source_ranges(service_id, &ranges, maps, run)?;

        let maglev = self.maglev.settings().wanted(svc.balancing);
        // A port's frontends use one to three endpoint sets: a list, not a map.
        let mut sets: Vec<(EndpointSet, SetSlots)> = Vec::new();
        for f in &wanted {
            if !sets.iter().any(|(set, _)| *set == f.endpoints) {
                let backends = f.endpoints.backends(svc, &self.node.host);
                let mut ids = Vec::with_capacity(backends.len());
                for backend in backends {
                    ids.push(self.ensure_backend(&backend, maps, run)?);
                }
                let set = f.endpoints;
                // Adopted frontends bring the slots a previous agent gave them.
                let known = self.ports.get(spn).and_then(|port| port.set_slots.get(set));
                let current = known.cloned().unwrap_or_else(|| {
                    wanted
                        .iter()
                        .filter(|w| w.endpoints == f.endpoints)
                        .find_map(|w| self.frontends.get(&w.key))
                        .map(|fe| fe.slots.clone())
                        .unwrap_or_default()
                });
                let slots = stable_slots(&current, &ids);
                let table = if maglev {
                    let names: Vec<String> = slots
                        .iter()
                        .map(|id| {
                            let b = &self.backend_by_id[id];
                            socket_addr::<F>(b.addr_be, b.port_be).to_string()
                        })
                        .collect();
                    let mut writes = Default::default();
                    let table = self
                        .maglev
                        .update((spn.clone(), set), &names, maps, &mut writes);
                    run.stats.maglev_elements += writes.elements;
                    let table = table?;
                    if table.is_some() {
                        run.maglev_sets
                            .entry(spn.clone())
                            .or_default()
                            .push(f.endpoints);
                    }
                    table
                } else {
                    None
                };
                self.ports
                    .entry(spn.clone())
                    .or_default()
                    .set_slots
                    .insert(set, slots.clone());
                sets.push((set, (slots, table)));
            }
            let (_, (slots, table)) = sets
                .iter()
                .find(|(set, _)| *set == f.endpoints)
                .expect("added above");
            self.program_frontend(f, spn, service_id, slots, *table, maps, run)?;
            if f.kind() == FrontendKind::ClusterIp {
                run.cluster_ip_frontends.push(f.key);
            } else {
                // The key may have been a cluster IP's before.
                self.markers.remove(f.key, maps, &mut run.stats)?;
            }
        }

        self.remove_source_ranges(service_id, &ranges, maps, run)?;
        if let Some(port) = self.ports.get_mut(spn) {
            port.set_slots
                .retain(|set| sets.iter().any(|(kept, _)| *kept == set));
        }
        let mut keys: Vec<ServiceKeyOf<F>> = wanted.iter().map(|f| f.key).collect();
        keys.sort_unstable();
        Ok(keys)
    }

    fn service_id(&mut self, spn: &ServicePortName) -> Result<u32, MapError> {
        if let Some(id) = self.ports.get(spn).and_then(|port| port.id) {
            return Ok(id);
        }
        let id = self
            .service_id_pool
            .take()
            .ok_or(MapError::TooManyServices)?;
        self.ports.entry(spn.clone()).or_default().id = Some(id);
        self.touched.ports.push(spn.clone());
        Ok(id)
    }

    /// The port has no frontend left: its source ranges and id go.
    fn release_service(
        &mut self,
        spn: &ServicePortName,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        if let Some(id) = self.ports.get(spn).and_then(|port| port.id) {
            self.remove_source_ranges(id, &BTreeSet::new(), maps, run)?;
            self.service_id_pool.give_back(id);
            self.touched.ports.push(spn.clone());
        }
        if let Some(port) = self.ports.get_mut(spn) {
            port.id = None;
            port.frontends = SmallSet::default();
        }
        Ok(())
    }

    fn add_source_ranges(
        &mut self,
        service_id: u32,
        wanted: &BTreeSet<F::Net>,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        for range in wanted {
            if self
                .source_ranges
                .get(&service_id)
                .is_some_and(|written| written.contains(range))
            {
                continue;
            }
            maps.put_source_range(service_id, *range)?;
            run.stats.writes += 1;
            self.source_ranges
                .entry(service_id)
                .or_default()
                .insert(*range);
        }
        Ok(())
    }

    fn remove_source_ranges(
        &mut self,
        service_id: u32,
        keep: &BTreeSet<F::Net>,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        let Some(written) = self.source_ranges.get_mut(&service_id) else {
            return Ok(());
        };
        let stale: Vec<F::Net> = written.difference(keep).copied().collect();
        for range in stale {
            maps.delete_source_range(service_id, range)?;
            run.stats.deletes += 1;
            written.remove(&range);
        }
        if written.is_empty() {
            self.source_ranges.remove(&service_id);
        }
        Ok(())
    }

    fn ensure_backend(
        &mut self,
        backend: &BackendOf<F>,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
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
        run.stats.writes += 1;
        self.unreferenced.insert(id);
        self.backends.insert(*backend, id);
        self.backend_by_id.insert(id, *backend);
        self.touched.backends.push(id);
        self.filter.add(backend_filter_bit(backend));
        Ok(id)
    }

    /// Writes one frontend: its slots (`slots`, its set's, in order), its
    /// Maglev `table` reference when it has one, then slot 0.
    #[allow(clippy::too_many_arguments)]
    fn program_frontend(
        &mut self,
        f: &WantedFrontend<F>,
        owner: &ServicePortName,
        service_id: u32,
        slots: &[BackendId],
        table: Option<ServiceValue>,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        let key = f.key;
        let filter = &mut self.filter;
        let frontend = self.frontends.entry(key).or_insert_with(|| {
            filter.add(frontend_filter_bit(&key));
            Frontend {
                owner: owner.clone(),
                service_id,
                slots: Vec::new(),
                range: None,
                written: None,
                maglev: None,
            }
        });
        if &frontend.owner != owner {
            // Two service ports claim one address:port (e.g. the same external IP):
            // the last one programmed wins, as with upstream's rules.
            tracing::warn!(frontend = ?key, previous = %frontend.owner, now = %owner, "frontend claimed by two service ports");
            if let Some(port) = self.ports.get_mut(&frontend.owner) {
                port.frontends.remove(&key);
            }
            frontend.owner = owner.clone();
            if key.proto == proto::UDP {
                // Its flows were the other port's: judged by this one's keepers.
                self.ports.entry(owner.clone()).or_default().udp_keepers = None;
            }
        }
        self.ports
            .entry(owner.clone())
            .or_default()
            .frontends
            .insert(key);

        let count = u16::try_from(slots.len())
            .ok()
            .filter(|n| *n < MAGLEV_SLOT)
            .ok_or(MapError::TooManyBackends { count: slots.len() })?;
        let refs = &mut self.backend_refs;

        // Slots first, where the datapath does not look yet: a new range
        // when the set outgrew its own (the old one is freed once slot 0
        // names the new), else in place, only the slots that change.
        let mut left = None;
        if !slots.is_empty()
            && frontend
                .range
                .is_none_or(|r| (r.len as usize) < slots.len())
        {
            let len = room_for(slots.len());
            let range = self.slot_ranges.take(len).ok_or(MapError::Capacity {
                map: F::SLOTS,
                setting: "maps.backendSlots (--ebpf-map-size-backend-slots)",
                needed: usize::try_from(self.slot_ranges.used()).unwrap_or(usize::MAX)
                    + len as usize,
                capacity: self.slot_ranges.capacity(),
            })?;
            if let Err(e) = maps.put_slots(range.first, slots) {
                self.slot_ranges.give_back(range);
                return Err(e);
            }
            run.stats.writes += 1;
            left = frontend.range.replace(range);
        } else if let Some(range) = frontend.range {
            for (i, id) in slots.iter().enumerate() {
                if frontend.slots.get(i) != Some(id) {
                    maps.put_slots(range.first + i as u32, std::slice::from_ref(id))?;
                    run.stats.writes += 1;
                }
            }
        }
        frontend
            .slots
            .reserve_exact(slots.len().saturating_sub(frontend.slots.len()));
        for (i, id) in slots.iter().enumerate() {
            if frontend.slots.get(i) != Some(id) {
                *refs.entry(*id).or_default() += 1;
                match frontend.slots.get_mut(i) {
                    Some(old) => {
                        unref(refs, *old, &mut self.unreferenced);
                        *old = *id;
                    }
                    None => frontend.slots.push(*id),
                }
            }
        }
        let mut value = f.value(count, service_id);
        value.first_slot = frontend.range.map_or(0, |r| r.first);
        if let Some(table) = table {
            if frontend.maglev != Some(table) {
                maps.put_service(&key.with_slot(MAGLEV_SLOT), &table)?;
                run.stats.writes += 1;
                if frontend.maglev.replace(table).is_none() {
                    self.maglev_refs += 1;
                }
            }
            value.flags |= flags::MAGLEV;
        }
        if frontend.written != Some(value) {
            maps.put_service(&key, &value)?;
            run.stats.writes += 1;
            frontend.written = Some(value);
            frontend.service_id = service_id;
        }
        if table.is_none() && frontend.maglev.is_some() {
            maps.delete_service(&key.with_slot(MAGLEV_SLOT))?;
            run.stats.deletes += 1;
            frontend.maglev = None;
            self.maglev_refs -= 1;
        }
        if let Some(range) = left {
            self.slot_ranges.give_back(range);
        }
        // Slots past the count are not read: nothing to delete.
        while frontend.slots.len() > slots.len() {
            let old = frontend.slots.pop().expect("longer than slots");
            unref(refs, old, &mut self.unreferenced);
        }
        Ok(())
    }

    fn remove_frontend(
        &mut self,
        key: ServiceKeyOf<F>,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        let Some(frontend) = self.frontends.get_mut(&key) else {
            return Ok(());
        };
        if frontend.written.is_some() {
            maps.delete_service(&key)?;
            run.stats.deletes += 1;
            frontend.written = None;
        }
        if frontend.maglev.is_some() {
            maps.delete_service(&key.with_slot(MAGLEV_SLOT))?;
            run.stats.deletes += 1;
            frontend.maglev = None;
            self.maglev_refs -= 1;
        }
        if let Some(range) = frontend.range.take() {
            self.slot_ranges.give_back(range);
        }
        while let Some(id) = frontend.slots.pop() {
            unref(&mut self.backend_refs, id, &mut self.unreferenced);
        }
        if key.proto == proto::UDP {
            self.removed_udp.push(key);
        }
        let owner = frontend.owner.clone();
        self.markers.remove(key, maps, &mut run.stats)?;
        self.frontends.remove(&key);
        self.filter.remove(frontend_filter_bit(&key));
        if let Some(port) = self.ports.get_mut(&owner) {
            port.frontends.remove(&key);
        }
        Ok(())
    }

    /// Judges a UDP port's flows again when an endpoint address it kept them
    /// for is no longer among its keepers (`DesiredService::udp_flow_keepers`),
    /// or when they are not known (adopted, or without serving endpoints
    /// until now): upstream deletes the conntrack entries of UDP
    /// flows to endpoints that no longer serve, since UDP flows never end on
    /// their own. A port without serving endpoints keeps its flows, as
    /// upstream's.
    fn judge_udp_flows(&mut self, spn: &ServicePortName, svc: &DesiredService) {
        let Some(port) = self.ports.get_mut(spn) else {
            return;
        };
        let mut keep: Vec<F::Addr> = (svc.udp_flow_keepers().iter())
            .filter_map(|ip| F::ip(ip))
            .map(F::to_be)
            .collect();
        keep.sort_unstable();
        if keep.is_empty() {
            port.udp_keepers = None;
            return;
        }
        let lost = port
            .udp_keepers
            .as_ref()
            .is_none_or(|before| before.iter().any(|a| keep.binary_search(a).is_err()));
        if lost {
            for frontend in port.frontends.iter() {
                self.udp_rules.push(UdpRule {
                    frontend: *frontend,
                    keep: keep.clone(),
                });
            }
        }
        port.udp_keepers = Some(keep);
    }

    /// Hands the flows [`Self::judge_udp_flows`] and removed frontends doom
    /// to the flusher, and their sockets to the proxier.
    ///
    /// Upstream also flushes a UDP service IP when it gains its first endpoint,
    /// because packets sent while it had none left kernel conntrack entries
    /// behind. Nothing like that exists here: the datapath rejects or drops a
    /// packet to a frontend without backends before creating any flow state.
    fn flush_gone_udp_flows(
        &mut self,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        for key in std::mem::take(&mut self.removed_udp) {
            let stays = [Scope::Primary, Scope::ClusterWide]
                .into_iter()
                .any(|scope| self.frontends.contains_key(&key.with_scope(scope)));
            if !stays {
                self.udp_rules.push(UdpRule {
                    frontend: key,
                    keep: Vec::new(),
                });
            }
        }
        let mut gone = GoneFlows::default();
        let mut sockets = Vec::new();
        let judged_ns = crate::clock::coarse_monotonic_ns();
        for rule in &self.udp_rules {
            let fe = rule.frontend;
            let mut keep: Vec<IpAddr> = rule.keep.iter().map(|a| F::from_be(*a).into()).collect();
            keep.sort_unstable();
            sockets.push(GoneUdp {
                service: socket_addr::<F>(fe.addr_be, fe.port_be),
                keep,
            });
            gone.keep_only(&fe, judged_ns, rule.keep.iter().copied());
        }
        if gone.is_empty() {
            return Ok(());
        }
        let judged = gone.len();
        let flushed = maps.flush_gone_flows(gone)?;
        // Handed over: only now are the rules done with.
        self.udp_rules.clear();
        self.gone_udp.extend(sockets);
        run.stats.udp_frontends_judged += judged;
        if let Flushed::Now(n) = flushed {
            run.stats.flushed_flows += n;
        }
        Ok(())
    }

    /// The UDP frontends whose flows were judged in the syncs since the last
    /// call: the sockets the socket hooks pointed at endpoints they no longer
    /// keep are the proxier's to end.
    pub fn take_gone_udp(&mut self) -> Vec<GoneUdp> {
        std::mem::take(&mut self.gone_udp)
    }

    fn delete_unreferenced_backends(
        &mut self,
        maps: &mut impl ServiceMaps<F>,
        run: &mut SyncRun<F>,
    ) -> Result<(), MapError> {
        while let Some(id) = self.unreferenced.first().copied() {
            if self.backend_refs.get(&id).copied().unwrap_or(0) == 0 {
                maps.delete_backend(id)?;
                run.stats.deletes += 1;
                self.backend_refs.remove(&id);
                if let Some(backend) = self.backend_by_id.remove(&id) {
                    self.touched.backends.push(id);
                    self.backends.remove(&backend);
                    self.filter.remove(backend_filter_bit(&backend));
                }
                self.backend_ids.give_back(id);
            }
            self.unreferenced.remove(&id);
        }
        Ok(())
    }
}

fn frontend_filter_bit<F: AgentFamily>(key: &ServiceKeyOf<F>) -> u32 {
    frontend_bit::<F>(&key.addr_be, key.port_be, key.proto)
}

fn backend_filter_bit<F: AgentFamily>(backend: &BackendOf<F>) -> u32 {
    backend_bit::<F>(&backend.addr_be, backend.port_be, backend.proto)
}

/// A service port a sync looks at, with what the state wants of it (`None`: remove it).
type Port<'a> = (&'a ServicePortName, Option<&'a DesiredService>);

/// `names` with what `state` wants of each.
fn ports_of<'a>(state: &'a DesiredState, names: &'a BTreeSet<ServicePortName>) -> Vec<Port<'a>> {
    names.iter().map(|k| (k, state.services.get(k))).collect()
}

/// Service ports whose frontends change with the node's addresses.
fn depends_on_node(svc: &DesiredService) -> bool {
    svc.node_port.is_some()
        || (!svc.load_balancer_ips.is_empty() && !svc.load_balancer_source_ranges.is_empty())
}

fn unref(
    refs: &mut HashMap<BackendId, u32>,
    id: BackendId,
    unreferenced: &mut BTreeSet<BackendId>,
) {
    if let Some(n) = refs.get_mut(&id) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            unreferenced.insert(id);
        }
    }
}

/// Keeps backends that stay in the slots they had, newcomers taking the
/// slots of those that left and the last backends moving into the slots
/// still free, so that as few slots as possible change (a Maglev table
/// names slots: each moved backend's buckets are rewritten).
fn stable_slots(current: &[BackendId], wanted: &[BackendId]) -> Vec<BackendId> {
    if current.is_empty() {
        // What the general case below gives, without its sets: every port
        // at a cold start.
        return wanted.to_vec();
    }
    let wanted_set: BTreeSet<BackendId> = wanted.iter().copied().collect();
    // Each backend keeps one slot (adopted maps may name one twice).
    let mut kept = BTreeSet::new();
    let mut slots: Vec<Option<BackendId>> = current
        .iter()
        .map(|id| (wanted_set.contains(id) && kept.insert(*id)).then_some(*id))
        .collect();
    let placed: BTreeSet<BackendId> = slots.iter().flatten().copied().collect();
    let mut newcomers = wanted.iter().copied().filter(|id| !placed.contains(id));
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = newcomers.next();
    }
    slots.extend(newcomers.map(Some));
    loop {
        while slots.last() == Some(&None) {
            slots.pop();
        }
        let Some(hole) = slots.iter().position(Option::is_none) else {
            break;
        };
        slots[hole] = slots.pop().flatten();
    }
    slots.into_iter().flatten().collect()
}

/// Both families' programmers: each writes its own maps from the same
/// desired state, and neither sees the other's addresses.
pub struct Programmer {
    pub v4: FamilyProgrammer<V4>,
    pub v6: FamilyProgrammer<V6>,
}

impl Default for Programmer {
    fn default() -> Self {
        Self::new()
    }
}

impl Programmer {
    pub fn new() -> Self {
        Programmer {
            v4: FamilyProgrammer::new(),
            v6: FamilyProgrammer::new(),
        }
    }

    /// Refuse syncs that would not fit in maps of these sizes (each
    /// family's maps are created with the same configured sizes).
    pub fn set_capacity(&mut self, capacity: Capacity) {
        self.v4.set_capacity(capacity);
        self.v6.set_capacity(capacity);
    }

    /// See [`FamilyProgrammer::set_maglev`].
    pub fn set_maglev(&mut self, settings: MaglevSettings) {
        self.v4.set_maglev(settings);
        self.v6.set_maglev(settings);
    }

    /// The id of every service port programmed, in either family (a
    /// dual-stack port has one per family).
    pub fn service_ids(&self) -> impl Iterator<Item = (&ServicePortName, u32)> {
        self.v4.service_ids().chain(self.v6.service_ids())
    }

    /// Makes both families' maps hold exactly `state`.
    pub fn sync<M: ServiceMaps<V4> + ServiceMaps<V6>>(
        &mut self,
        state: &DesiredState,
        maps: &mut M,
    ) -> Result<SyncStats, MapError> {
        let v4 = self.v4.sync(state, maps)?;
        Ok(v4.plus(&self.v6.sync(state, maps)?))
    }

    /// Brings only the service ports in `changed` to what `state` says.
    pub fn sync_changed<M: ServiceMaps<V4> + ServiceMaps<V6>>(
        &mut self,
        state: &DesiredState,
        changed: &BTreeSet<ServicePortName>,
        maps: &mut M,
    ) -> Result<SyncStats, MapError> {
        let v4 = self.v4.sync_changed(state, changed, maps)?;
        Ok(v4.plus(&self.v6.sync_changed(state, changed, maps)?))
    }

    /// Records the node's addresses of both families (see
    /// [`FamilyProgrammer::set_node_addresses`]).
    pub fn set_node_addresses<M: ServiceMaps<V4> + ServiceMaps<V6>>(
        &mut self,
        node: &NodeAddresses,
        node6: &NodeAddressesOf<V6>,
        state: &DesiredState,
        maps: &mut M,
    ) -> Result<SyncStats, MapError> {
        let v4 = self.v4.set_node_addresses(node, state, maps)?;
        Ok(v4.plus(&self.v6.set_node_addresses(node6, state, maps)?))
    }

    /// Rebuilds both families' bookkeeping from what their maps hold (see
    /// [`FamilyProgrammer::adopt`]).
    pub fn adopt(
        &mut self,
        snapshots: (&ServiceSnapshotOf<V4>, &ServiceSnapshotOf<V6>),
        state: &DesiredState,
        nodes: (&NodeAddresses, &NodeAddressesOf<V6>),
    ) -> AdoptStats {
        let v4 = self.v4.adopt(snapshots.0, state, nodes.0);
        let v6 = self.v6.adopt(snapshots.1, state, nodes.1);
        AdoptStats {
            frontends: v4.frontends + v6.frontends,
            backends: v4.backends + v6.backends,
            stale_frontends: v4.stale_frontends + v6.stale_frontends,
        }
    }

    /// What either family's ids were given to or taken from since the last call.
    pub fn take_touched(&mut self) -> Touched {
        let mut touched = self.v4.take_touched();
        let v6 = self.v6.take_touched();
        touched.ports.extend(v6.ports);
        touched.backends.extend(v6.backends);
        touched
    }

    /// The UDP frontends whose flows were judged, in either family.
    pub fn take_gone_udp(&mut self) -> Vec<GoneUdp> {
        let mut gone = self.v4.take_gone_udp();
        gone.extend(self.v6.take_gone_udp());
        gone
    }
}

impl SyncStats {
    fn plus(&self, other: &SyncStats) -> SyncStats {
        SyncStats {
            frontends: self.frontends + other.frontends,
            backends: self.backends + other.backends,
            writes: self.writes + other.writes,
            deletes: self.deletes + other.deletes,
            udp_frontends_judged: self.udp_frontends_judged + other.udp_frontends_judged,
            flushed_flows: self.flushed_flows + other.flushed_flows,
            maglev_elements: self.maglev_elements + other.maglev_elements,
        }
    }
}

#[cfg(test)]
mod tests;

fn socket_addr<F: AgentFamily>(addr_be: F::Addr, port_be: u16) -> SocketAddr {
    SocketAddr::new(F::from_be(addr_be).into(), u16::from_be(port_be))
}
