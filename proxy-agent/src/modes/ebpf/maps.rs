//! The maps as the programmers see them: real aya maps, or fakes in tests.

use super::programmer::{Capacity, ServiceSnapshotOf};
use anyhow::Context as _;
use aya::Pod;
use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
};
use ipnet::{IpNet, Ipv4Net};
use proxy_common::{
    AffinityKey, AffinityKey6, AffinityValue, Backend, Backend6, BackendId, BackendOf, CtKey,
    CtKey6, CtKeyOf, CtValue, CtValue6, CtValueOf, DatapathConfig, DatapathConfig6, IfaceInfo,
    Ipv4Prefix, Ipv6Prefix, PrefixOf, ServiceKey, ServiceKey6, ServiceKeyOf, ServiceValue, SockKey,
    SockKey6, SockKeyOf, SockValue, SockValue6, SockValueOf, SourceRange, SourceRange6,
    SourceRangeOf, V4, V6, maglev::MaglevChunk, maps as names,
};

use super::deferred::{DeferredWrites, Entries};
use super::family::AgentFamily;
use super::flow_flush::{Flusher, GoneFlows, Request};
use super::{mapped_array::MappedArray, slot_table::SlotTable};

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("writing {map} failed: {source}")]
    Write {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("reading {map} failed: {source}")]
    Read {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("flushing flows from {map} failed: {source}")]
    Flush {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the packet programs could not be loaded: {0}")]
    ProgramsNotLoaded(String),
    #[error("{map} holds {capacity} slots: indexes {first}..{first}+{count} are outside it")]
    SlotsOutOfRange {
        map: &'static str,
        first: u32,
        count: usize,
        capacity: u32,
    },
    #[error("{map} holds {capacity} words: word {word} is outside it")]
    FilterOutOfRange {
        map: &'static str,
        word: u32,
        capacity: u32,
    },
    #[error("too many backends ({count}): a frontend addresses at most 65534 slots")]
    TooManyBackends { count: usize },
    #[error("no service id left for another service port")]
    TooManyServices,
    #[error(
        "{map} would need {needed} entries but holds {capacity}: raise {setting}; \
         nothing was written, the last good state stays programmed"
    )]
    Capacity {
        map: &'static str,
        setting: &'static str,
        needed: usize,
        capacity: u32,
    },
}

/// What a family's service programmer writes: services, backends, source
/// ranges, conntrack flushes, all in the maps of family `F`.
pub trait ServiceMaps<F: AgentFamily> {
    fn put_backend(&mut self, id: BackendId, backend: &BackendOf<F>) -> Result<(), MapError>;
    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError>;
    fn put_service(&mut self, key: &ServiceKeyOf<F>, value: &ServiceValue) -> Result<(), MapError>;
    fn delete_service(&mut self, key: &ServiceKeyOf<F>) -> Result<(), MapError>;
    /// Writes backend ids into the slots array at indexes `first..`.
    fn put_slots(&mut self, first: u32, ids: &[BackendId]) -> Result<(), MapError>;
    /// Allows sources in `range` for the frontends of `service_id` that carry
    /// [`proxy_common::service::flags::SOURCE_RANGES`].
    fn put_source_range(&mut self, service_id: u32, range: F::Net) -> Result<(), MapError>;
    fn delete_source_range(&mut self, service_id: u32, range: F::Net) -> Result<(), MapError>;
    /// Writes element `element` of the Maglev tables (`proxy_common::maglev`).
    fn put_maglev(&mut self, element: u32, chunk: &MaglevChunk) -> Result<(), MapError>;
    /// Deletes every conntrack entry matching `matches`, returning how many.
    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool,
    ) -> Result<usize, MapError>;
    /// Deletes the UDP flows `gone` judges stale: now, or
    /// handed to a thread of their own ([`KernelMaps::flush_in_background`]).
    fn flush_gone_flows(&mut self, gone: GoneFlows<F>) -> Result<Flushed, MapError> {
        self.flush_flows(&|k, v| gone.matches(k, v))
            .map(Flushed::Now)
    }
    /// Writes word `index` of XDP's filter (`proxy_common::filter`).
    fn put_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapError>;
}

/// What became of a [`ServiceMaps::flush_gone_flows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// This many entries were deleted.
    Now(usize),
    /// Handed to the flusher's thread, which logs what it deleted.
    Queued,
}

/// What the node programmer writes: the node-wide settings and interface table.
pub trait NodeMaps {
    fn put_config(&mut self, config: &DatapathConfig) -> Result<(), MapError>;
    fn put_config6(&mut self, config: &DatapathConfig6) -> Result<(), MapError>;
    fn put_iface(&mut self, ifindex: u32, info: &IfaceInfo) -> Result<(), MapError>;
    fn delete_iface(&mut self, ifindex: u32) -> Result<(), MapError>;
    fn put_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError>;
    fn delete_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError>;
    fn put_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError>;
    fn delete_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError>;
}

/// The `SOURCE_RANGES` key of `range` for `service_id`: the id is matched
/// exactly (its 32 bits come first), then the range's prefix.
pub fn source_range_key(service_id: u32, range: Ipv4Net) -> Key<SourceRange> {
    V4::source_range_key(service_id, range)
}

/// The IPv4 prefix-trie key of `cidr`.
pub fn prefix_key(cidr: Ipv4Net) -> Key<Ipv4Prefix> {
    V4::prefix_key(cidr)
}

/// The IPv6 maps of a loaded datapath.
pub struct Maps6 {
    pub services: HashMap<MapData, ServiceKey6, ServiceValue>,
    pub backends: HashMap<MapData, BackendId, Backend6>,
    pub conntrack: HashMap<MapData, CtKey6, CtValue6>,
    pub config: Array<MapData, DatapathConfig6>,
    pub local_pod_cidrs: LpmTrie<MapData, Ipv6Prefix, u8>,
    pub service_cidrs: LpmTrie<MapData, Ipv6Prefix, u8>,
    pub source_ranges: LpmTrie<MapData, SourceRange6, u8>,
    pub sockets: HashMap<MapData, SockKey6, SockValue6>,
    pub affinity: HashMap<MapData, AffinityKey6, AffinityValue>,
    pub maglev: Array<MapData, MaglevChunk>,
    pub slots: SlotTable,
    pub filter: Option<MappedArray<u64>>,
}

/// The kernel maps of a loaded datapath.
pub struct KernelMaps {
    pub services: HashMap<MapData, ServiceKey, ServiceValue>,
    pub backends: HashMap<MapData, BackendId, Backend>,
    pub conntrack: HashMap<MapData, CtKey, CtValue>,
    pub config: Array<MapData, DatapathConfig>,
    pub ifaces: HashMap<MapData, u32, IfaceInfo>,
    pub local_pod_cidrs: LpmTrie<MapData, Ipv4Prefix, u8>,
    pub service_cidrs: LpmTrie<MapData, Ipv4Prefix, u8>,
    pub source_ranges: LpmTrie<MapData, SourceRange, u8>,
    /// The socket hooks' choices (written only by the programs).
    pub sockets: HashMap<MapData, SockKey, SockValue>,
    pub affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    pub maglev: Array<MapData, MaglevChunk>,
    pub slots: SlotTable,
    /// XDP's filter words (`proxy_common::filter`); `None` in maps an
    /// older agent pinned (`PinnedMaps`), which have none.
    pub filter: Option<MappedArray<u64>>,
    pub v6: Maps6,
    /// Service and backend writes held back to be written in batches
    /// ([`KernelMaps::defer_writes`]).
    pub(crate) deferred: Option<Box<DeferredWrites>>,
    /// Deletes gone flows on a thread of its own, once started
    /// ([`KernelMaps::flush_in_background`]); without it, syncs do.
    pub(crate) flusher: Option<Flusher>,
}

impl KernelMaps {
    /// From now on stale UDP flows are deleted on a thread
    /// of their own ([`super::flow_flush`]), not by the sync that saw them go.
    pub fn flush_in_background(
        &mut self,
        metrics: crate::metrics::ConntrackReconcilerMetrics,
    ) -> std::io::Result<()> {
        use std::os::fd::AsFd as _;
        let fd = |map: &MapData| map.fd().as_fd().try_clone_to_owned();
        let conntrack = fd(aya::maps::IterableMap::map(&self.conntrack))?;
        let conntrack6 = fd(aya::maps::IterableMap::map(&self.v6.conntrack))?;
        self.flusher = Some(Flusher::spawn(conntrack, conntrack6, metrics)?);
        Ok(())
    }

    /// Holds service and backend writes back from now on, to be written in
    /// batches by [`KernelMaps::write_deferred`]; a delete (or flush of
    /// flows) writes what is held first, so nothing goes before what
    /// replaces it.
    pub fn defer_writes(&mut self) {
        self.deferred.get_or_insert_default();
    }

    /// Writes the held-back entries (backends before frontends) and stops
    /// holding writes back; how many were written. After an error the maps
    /// hold part of them.
    pub fn write_deferred(&mut self) -> Result<usize, MapError> {
        let Some(deferred) = self.deferred.take() else {
            return Ok(0);
        };
        let count = deferred.len();
        deferred.write(self)?;
        Ok(count)
    }

    /// Forgets the held-back writes and stops holding writes back.
    pub fn discard_deferred(&mut self) {
        self.deferred = None;
    }

    /// Writes what is held back before a write that must come after it,
    /// and keeps holding back the writes after that.
    fn write_deferred_before(&mut self) -> Result<(), MapError> {
        if self.deferred.is_some() {
            self.write_deferred()?;
            self.defer_writes();
        }
        Ok(())
    }

    /// Takes the agent's maps and the per-CPU counters out of a loaded object.
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<(KernelMaps, PerCpuArray<MapData, u64>)> {
        let maps = KernelMaps {
            services: take_map(ebpf, names::SERVICES)?,
            backends: take_map(ebpf, names::BACKENDS)?,
            conntrack: take_map(ebpf, names::CONNTRACK)?,
            config: take_map(ebpf, names::CONFIG)?,
            ifaces: take_map(ebpf, names::IFACES)?,
            local_pod_cidrs: take_map(ebpf, names::LOCAL_POD_CIDRS)?,
            service_cidrs: take_map(ebpf, names::SERVICE_CIDRS)?,
            source_ranges: take_map(ebpf, names::SOURCE_RANGES)?,
            sockets: take_map(ebpf, names::SOCKETS)?,
            affinity: take_map(ebpf, names::AFFINITY)?,
            maglev: take_map(ebpf, names::MAGLEV)?,
            slots: SlotTable::new(take_map(ebpf, names::SLOTS)?)?,
            filter: Some(MappedArray::new(
                take_map(ebpf, names::FILTER)?,
                names::FILTER,
            )?),
            v6: Maps6 {
                services: take_map(ebpf, names::SERVICES6)?,
                backends: take_map(ebpf, names::BACKENDS6)?,
                conntrack: take_map(ebpf, names::CONNTRACK6)?,
                config: take_map(ebpf, names::CONFIG6)?,
                local_pod_cidrs: take_map(ebpf, names::LOCAL_POD_CIDRS6)?,
                service_cidrs: take_map(ebpf, names::SERVICE_CIDRS6)?,
                source_ranges: take_map(ebpf, names::SOURCE_RANGES6)?,
                sockets: take_map(ebpf, names::SOCKETS6)?,
                affinity: take_map(ebpf, names::AFFINITY6)?,
                maglev: take_map(ebpf, names::MAGLEV6)?,
                slots: SlotTable::new(take_map(ebpf, names::SLOTS6)?)?,
                filter: Some(MappedArray::new(
                    take_map(ebpf, names::FILTER6)?,
                    names::FILTER6,
                )?),
            },
            deferred: None,
            flusher: None,
        };
        Ok((maps, take_map(ebpf, names::STATS)?))
    }
}

impl KernelMaps {
    /// The capacities of the service maps, as created (or pinned).
    pub fn capacity(&self) -> Capacity {
        use aya::maps::IterableMap as _;
        let max = |m: &MapData| m.info().map_or(u32::MAX, |i| i.max_entries());
        Capacity {
            services: max(self.services.map()),
            backends: max(self.backends.map()),
            maglev_chunks: max(self.maglev.map()).min(max(self.v6.maglev.map())),
            slots: self.slots.capacity().min(self.v6.slots.capacity()),
        }
    }

    /// What family `F`'s service maps hold (for adopting pinned maps).
    pub fn service_snapshot<F: FamilyMapsOf>(&mut self) -> Result<ServiceSnapshotOf<F>, MapError>
    where
        ServiceKeyOf<F>: Pod,
        BackendOf<F>: Pod,
        SourceRangeOf<F>: Pod,
    {
        let read = |map: &'static str| move |source| MapError::Read { map, source };
        let entries = entries_where(F::SERVICES, F::services(self), &every)?;
        Ok(ServiceSnapshotOf {
            services: with_slots(entries, F::slots(self)),
            backends: entries_where(F::BACKENDS, F::backends(self), &every)?,
            source_ranges: F::source_ranges(self)
                .keys()
                .map(|k| {
                    k.map(|k| {
                        let data = k.data();
                        let prefix = k.prefix_len().saturating_sub(32) as u8;
                        (
                            u32::from_be(data.service_be),
                            F::net_of(F::from_be(data.addr_be), prefix),
                        )
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(read(F::SOURCE_RANGES))?,
        })
    }

    /// What the node maps hold (for adopting pinned maps).
    pub fn node_snapshot(&self) -> Result<NodeSnapshot, MapError> {
        let read = |map: &'static str| move |source| MapError::Read { map, source };
        Ok(NodeSnapshot {
            config: self.config.get(&0, 0).map_err(read(names::CONFIG))?,
            config6: self.v6.config.get(&0, 0).map_err(read(names::CONFIG6))?,
            ifaces: self
                .ifaces
                .iter()
                .collect::<Result<_, _>>()
                .map_err(read(names::IFACES))?,
            local_pod_cidrs: prefixes(&self.local_pod_cidrs, &self.v6.local_pod_cidrs)
                .map_err(read(names::LOCAL_POD_CIDRS))?,
            service_cidrs: prefixes(&self.service_cidrs, &self.v6.service_cidrs)
                .map_err(read(names::SERVICE_CIDRS))?,
        })
    }
}

/// Both families' prefixes of a pair of prefix tries.
fn prefixes(
    v4: &LpmTrie<MapData, Ipv4Prefix, u8>,
    v6: &LpmTrie<MapData, Ipv6Prefix, u8>,
) -> Result<Vec<IpNet>, aya::maps::MapError> {
    let net4 = |k: Key<Ipv4Prefix>| {
        IpNet::from(V4::net_of(
            V4::from_be(k.data().addr_be),
            k.prefix_len() as u8,
        ))
    };
    let net6 = |k: Key<Ipv6Prefix>| {
        IpNet::from(V6::net_of(
            V6::from_be(k.data().addr_be),
            k.prefix_len() as u8,
        ))
    };
    v4.keys()
        .map(|k| k.map(net4))
        .chain(v6.keys().map(|k| k.map(net6)))
        .collect()
}

/// The entries of a service map with each frontend's backend slots added
/// as entries of their own (slot `1..=count`, as `ServiceValue::slot`):
/// the view snapshots, `inspect` and adoption work on.
pub fn with_slots<F: AgentFamily>(
    entries: Vec<(ServiceKeyOf<F>, ServiceValue)>,
    slots: &SlotTable,
) -> Vec<(ServiceKeyOf<F>, ServiceValue)> {
    let mut all = Vec::with_capacity(entries.len() * 2);
    for (key, value) in entries {
        all.push((key, value));
        if key.slot != 0
            || value.count == 0
            || value.has(proxy_common::service::flags::CLUSTER_IP_MARKER)
        {
            continue;
        }
        let ids = slots.read(value.first_slot, usize::from(value.count));
        all.extend(ids.into_iter().enumerate().map(|(i, id)| {
            (
                key.with_slot(i as u16 + 1),
                ServiceValue::slot(id, value.service_id),
            )
        }));
    }
    all
}

/// What the node maps hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub config: DatapathConfig,
    pub config6: DatapathConfig6,
    pub ifaces: Vec<(u32, IfaceInfo)>,
    /// Both families'.
    pub local_pod_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
}

fn take_map<M>(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<M>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("map {name} missing from the eBPF object"))?;
    M::try_from(map).with_context(|| format!("map {name} has an unexpected type or layout"))
}

fn write_error(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> MapError {
    move |source| MapError::Write { map, source }
}

/// Deleting an entry that is already gone is success: the goal state holds.
fn ignore_missing(result: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Value stored in the LPM tries: only the key's presence matters.
const PRESENT: u8 = 1;

/// One family's maps in [`KernelMaps`], for the generic [`ServiceMaps`] impl.
pub trait FamilyMapsOf: AgentFamily {
    fn services(maps: &mut KernelMaps) -> &mut HashMap<MapData, ServiceKeyOf<Self>, ServiceValue>;
    fn backends(maps: &mut KernelMaps) -> &mut HashMap<MapData, BackendId, BackendOf<Self>>;
    fn conntrack(maps: &mut KernelMaps) -> &mut HashMap<MapData, CtKeyOf<Self>, CtValueOf<Self>>;
    fn source_ranges(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, SourceRangeOf<Self>, u8>;
    fn local_pod_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, PrefixOf<Self>, u8>;
    fn service_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, PrefixOf<Self>, u8>;
    fn sockets(maps: &mut KernelMaps) -> &mut HashMap<MapData, SockKeyOf<Self>, SockValueOf<Self>>;
    fn maglev(maps: &mut KernelMaps) -> &mut Array<MapData, MaglevChunk>;
    fn slots(maps: &mut KernelMaps) -> &mut SlotTable;
    fn filter(maps: &mut KernelMaps) -> Option<&mut MappedArray<u64>>;
    fn deferred_services(
        deferred: &mut DeferredWrites,
    ) -> &mut Entries<ServiceKeyOf<Self>, ServiceValue>;
    fn deferred_backends(deferred: &mut DeferredWrites)
    -> &mut Entries<BackendId, BackendOf<Self>>;
    fn flush_request(gone: GoneFlows<Self>) -> Request;
    fn requested(request: Request) -> Option<GoneFlows<Self>>;
}

impl FamilyMapsOf for V4 {
    fn services(maps: &mut KernelMaps) -> &mut HashMap<MapData, ServiceKey, ServiceValue> {
        &mut maps.services
    }
    fn backends(maps: &mut KernelMaps) -> &mut HashMap<MapData, BackendId, Backend> {
        &mut maps.backends
    }
    fn conntrack(maps: &mut KernelMaps) -> &mut HashMap<MapData, CtKey, CtValue> {
        &mut maps.conntrack
    }
    fn source_ranges(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, SourceRange, u8> {
        &mut maps.source_ranges
    }
    fn local_pod_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, Ipv4Prefix, u8> {
        &mut maps.local_pod_cidrs
    }
    fn service_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, Ipv4Prefix, u8> {
        &mut maps.service_cidrs
    }
    fn sockets(maps: &mut KernelMaps) -> &mut HashMap<MapData, SockKey, SockValue> {
        &mut maps.sockets
    }
    fn maglev(maps: &mut KernelMaps) -> &mut Array<MapData, MaglevChunk> {
        &mut maps.maglev
    }
    fn slots(maps: &mut KernelMaps) -> &mut SlotTable {
        &mut maps.slots
    }
    fn filter(maps: &mut KernelMaps) -> Option<&mut MappedArray<u64>> {
        maps.filter.as_mut()
    }
    fn deferred_services(d: &mut DeferredWrites) -> &mut Entries<ServiceKey, ServiceValue> {
        &mut d.services
    }
    fn deferred_backends(d: &mut DeferredWrites) -> &mut Entries<BackendId, Backend> {
        &mut d.backends
    }
    fn flush_request(gone: GoneFlows<Self>) -> Request {
        Request::V4(gone)
    }
    fn requested(request: Request) -> Option<GoneFlows<Self>> {
        match request {
            Request::V4(gone) => Some(gone),
            Request::V6(_) => None,
        }
    }
}

impl FamilyMapsOf for V6 {
    fn services(maps: &mut KernelMaps) -> &mut HashMap<MapData, ServiceKey6, ServiceValue> {
        &mut maps.v6.services
    }
    fn backends(maps: &mut KernelMaps) -> &mut HashMap<MapData, BackendId, Backend6> {
        &mut maps.v6.backends
    }
    fn conntrack(maps: &mut KernelMaps) -> &mut HashMap<MapData, CtKey6, CtValue6> {
        &mut maps.v6.conntrack
    }
    fn source_ranges(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, SourceRange6, u8> {
        &mut maps.v6.source_ranges
    }
    fn local_pod_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, Ipv6Prefix, u8> {
        &mut maps.v6.local_pod_cidrs
    }
    fn service_cidrs(maps: &mut KernelMaps) -> &mut LpmTrie<MapData, Ipv6Prefix, u8> {
        &mut maps.v6.service_cidrs
    }
    fn sockets(maps: &mut KernelMaps) -> &mut HashMap<MapData, SockKey6, SockValue6> {
        &mut maps.v6.sockets
    }
    fn maglev(maps: &mut KernelMaps) -> &mut Array<MapData, MaglevChunk> {
        &mut maps.v6.maglev
    }
    fn slots(maps: &mut KernelMaps) -> &mut SlotTable {
        &mut maps.v6.slots
    }
    fn filter(maps: &mut KernelMaps) -> Option<&mut MappedArray<u64>> {
        maps.v6.filter.as_mut()
    }
    fn deferred_services(d: &mut DeferredWrites) -> &mut Entries<ServiceKey6, ServiceValue> {
        &mut d.services6
    }
    fn deferred_backends(d: &mut DeferredWrites) -> &mut Entries<BackendId, Backend6> {
        &mut d.backends6
    }
    fn flush_request(gone: GoneFlows<Self>) -> Request {
        Request::V6(gone)
    }
    fn requested(request: Request) -> Option<GoneFlows<Self>> {
        match request {
            Request::V6(gone) => Some(gone),
            Request::V4(_) => None,
        }
    }
}

impl<F: FamilyMapsOf> ServiceMaps<F> for KernelMaps
where
    ServiceKeyOf<F>: Pod,
    BackendOf<F>: Pod,
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
    SourceRangeOf<F>: Pod,
{
    fn put_backend(&mut self, id: BackendId, backend: &BackendOf<F>) -> Result<(), MapError> {
        if let Some(deferred) = self.deferred.as_deref_mut() {
            F::deferred_backends(deferred).push(id, *backend);
            return Ok(());
        }
        F::backends(self)
            .insert(id, backend, 0)
            .map_err(write_error(F::BACKENDS))
    }

    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError> {
        self.write_deferred_before()?;
        ignore_missing(F::backends(self).remove(&id)).map_err(write_error(F::BACKENDS))
    }

    fn put_service(&mut self, key: &ServiceKeyOf<F>, value: &ServiceValue) -> Result<(), MapError> {
        if let Some(deferred) = self.deferred.as_deref_mut() {
            F::deferred_services(deferred).push(*key, *value);
            return Ok(());
        }
        F::services(self)
            .insert(key, value, 0)
            .map_err(write_error(F::SERVICES))
    }

    fn delete_service(&mut self, key: &ServiceKeyOf<F>) -> Result<(), MapError> {
        self.write_deferred_before()?;
        ignore_missing(F::services(self).remove(key)).map_err(write_error(F::SERVICES))
    }

    fn put_slots(&mut self, first: u32, ids: &[BackendId]) -> Result<(), MapError> {
        let slots = F::slots(self);
        if slots.write(first, ids) {
            Ok(())
        } else {
            Err(MapError::SlotsOutOfRange {
                map: F::SLOTS,
                first,
                count: ids.len(),
                capacity: slots.capacity(),
            })
        }
    }

    fn put_source_range(&mut self, service_id: u32, range: F::Net) -> Result<(), MapError> {
        F::source_ranges(self)
            .insert(&F::source_range_key(service_id, range), PRESENT, 0)
            .map_err(write_error(F::SOURCE_RANGES))
    }

    fn delete_source_range(&mut self, service_id: u32, range: F::Net) -> Result<(), MapError> {
        self.write_deferred_before()?;
        ignore_missing(F::source_ranges(self).remove(&F::source_range_key(service_id, range)))
            .map_err(write_error(F::SOURCE_RANGES))
    }

    fn put_maglev(&mut self, element: u32, chunk: &MaglevChunk) -> Result<(), MapError> {
        F::maglev(self)
            .set(element, chunk, 0)
            .map_err(write_error(F::MAGLEV))
    }

    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool,
    ) -> Result<usize, MapError> {
        self.write_deferred_before()?;
        let conntrack = aya::maps::IterableMap::map(F::conntrack(self));
        super::flow_flush::flush_table::<F>(std::os::fd::AsFd::as_fd(conntrack.fd()), matches)
            .map_err(|source| MapError::Flush {
                map: F::CONNTRACK,
                source,
            })
    }

    fn flush_gone_flows(&mut self, gone: GoneFlows<F>) -> Result<Flushed, MapError> {
        // What replaces the gone backends is in the maps before their flows
        // go, however soon the thread gets to them.
        self.write_deferred_before()?;
        let Some(flusher) = &self.flusher else {
            return self
                .flush_flows(&|k, v| gone.matches(k, v))
                .map(Flushed::Now);
        };
        let (request, metrics) = match flusher.queue(F::flush_request(gone)) {
            Ok(()) => return Ok(Flushed::Queued),
            Err(request) => (request, flusher.metrics().clone()),
        };
        // The thread is gone (it cannot end but by a panic): the syncs
        // flush, still counted in the metrics.
        let gone = F::requested(request).expect("the request of this family");
        let started = std::time::Instant::now();
        let flushed = self.flush_flows(&|k, v| gone.matches(k, v))?;
        let family = super::flow_flush::ip_family::<F>();
        metrics.observe(family, started.elapsed(), flushed);
        Ok(Flushed::Now(flushed))
    }

    fn put_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapError> {
        let Some(filter) = F::filter(self) else {
            return Ok(());
        };
        if filter.write(index, word) {
            Ok(())
        } else {
            Err(MapError::FilterOutOfRange {
                map: F::FILTER,
                word: index,
                capacity: filter.elements(),
            })
        }
    }
}

impl NodeMaps for KernelMaps {
    fn put_config(&mut self, config: &DatapathConfig) -> Result<(), MapError> {
        self.config
            .set(0, config, 0)
            .map_err(write_error(names::CONFIG))
    }

    fn put_config6(&mut self, config: &DatapathConfig6) -> Result<(), MapError> {
        self.v6
            .config
            .set(0, config, 0)
            .map_err(write_error(names::CONFIG6))
    }

    fn put_iface(&mut self, ifindex: u32, info: &IfaceInfo) -> Result<(), MapError> {
        self.ifaces
            .insert(ifindex, info, 0)
            .map_err(write_error(names::IFACES))
    }

    fn delete_iface(&mut self, ifindex: u32) -> Result<(), MapError> {
        ignore_missing(self.ifaces.remove(&ifindex)).map_err(write_error(names::IFACES))
    }

    fn put_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        PrefixSet::LocalPodCidrs.put(self, cidr)
    }

    fn delete_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        PrefixSet::LocalPodCidrs.delete(self, cidr)
    }

    fn put_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        PrefixSet::ServiceCidrs.put(self, cidr)
    }

    fn delete_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        PrefixSet::ServiceCidrs.delete(self, cidr)
    }
}

/// The prefix tries the node maps hold, one per family each.
#[derive(Clone, Copy)]
enum PrefixSet {
    LocalPodCidrs,
    ServiceCidrs,
}

impl PrefixSet {
    fn trie<F: FamilyMapsOf>(
        self,
        maps: &mut KernelMaps,
    ) -> &mut LpmTrie<MapData, PrefixOf<F>, u8> {
        match self {
            PrefixSet::LocalPodCidrs => F::local_pod_cidrs(maps),
            PrefixSet::ServiceCidrs => F::service_cidrs(maps),
        }
    }

    fn name<F: FamilyMapsOf>(self) -> &'static str {
        match self {
            PrefixSet::LocalPodCidrs => F::LOCAL_POD_CIDRS,
            PrefixSet::ServiceCidrs => F::SERVICE_CIDRS,
        }
    }

    fn put(self, maps: &mut KernelMaps, cidr: IpNet) -> Result<(), MapError> {
        match cidr {
            IpNet::V4(c) => self
                .trie::<V4>(maps)
                .insert(&V4::prefix_key(c), PRESENT, 0)
                .map_err(write_error(self.name::<V4>())),
            IpNet::V6(c) => self
                .trie::<V6>(maps)
                .insert(&V6::prefix_key(c), PRESENT, 0)
                .map_err(write_error(self.name::<V6>())),
        }
    }

    fn delete(self, maps: &mut KernelMaps, cidr: IpNet) -> Result<(), MapError> {
        match cidr {
            IpNet::V4(c) => ignore_missing(self.trie::<V4>(maps).remove(&V4::prefix_key(c)))
                .map_err(write_error(self.name::<V4>())),
            IpNet::V6(c) => ignore_missing(self.trie::<V6>(maps).remove(&V6::prefix_key(c)))
                .map_err(write_error(self.name::<V6>())),
        }
    }
}

/// The maps of these kernel ids, with their names: how the datapath's maps
/// are found from its programs, pinned or not, taken out of the object or not.
pub fn named_maps(ids: impl IntoIterator<Item = u32>) -> Vec<(String, MapData)> {
    ids.into_iter()
        .filter_map(|id| MapData::from_id(id).ok())
        .filter_map(|data| Some((data.info().ok()?.name_as_str()?.to_owned(), data)))
        .collect()
}

/// The keys of `map`'s entries that `matches` (see [`entries_where`]).
pub fn matching_entries<K: Pod, V: Pod>(
    name: &'static str,
    map: &HashMap<MapData, K, V>,
    matches: &dyn Fn(&K, &V) -> bool,
) -> Result<Vec<K>, MapError> {
    Ok(entries_where(name, map, matches)?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

fn every<K, V>(_: &K, _: &V) -> bool {
    true
}

/// `map`'s entries that `matches`, read in batches: a conntrack table of a
/// busy node holds hundreds of thousands of entries, and reading them one
/// at a time took two calls each. Kernels without batch reads (before 5.6)
/// are walked entry by entry.
pub fn entries_where<K: Pod, V: Pod>(
    name: &'static str,
    map: &HashMap<MapData, K, V>,
    matches: &dyn Fn(&K, &V) -> bool,
) -> Result<Vec<(K, V)>, MapError> {
    let fd = std::os::fd::AsFd::as_fd(aya::maps::IterableMap::map(map).fd());
    let mut found = Vec::new();
    let walked = super::sys::walk_typed_batches::<K, V>(fd, |entries| {
        found.extend(entries.filter(|(key, value)| matches(key, value)));
    });
    match walked {
        Ok(()) => Ok(found),
        // An entry deleted between its key and its value is skipped.
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(map
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| matches(k, v))
            .collect()),
        Err(e) => Err(MapError::Read {
            map: name,
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_lookup_batch",
                io_error: e,
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_range_key_puts_the_service_first_and_truncates_the_range() {
        let key = source_range_key(7, "10.1.2.3/16".parse().unwrap());
        assert_eq!(key.prefix_len(), 48);
        let data = key.data();
        assert_eq!(data.service_be.to_ne_bytes(), [0, 0, 0, 7]);
        assert_eq!(data.addr_be.to_ne_bytes(), [10, 1, 0, 0]);
    }

    #[test]
    fn prefix_key_is_the_prefix() {
        let key = prefix_key("10.244.1.0/24".parse().unwrap());
        assert_eq!(key.prefix_len(), 24);
        assert_eq!(key.data().addr_be.to_ne_bytes(), [10, 244, 1, 0]);
    }
}
