//! The maps as the programmers see them: real aya maps, or fakes in tests.

use super::programmer::{Capacity, ServiceSnapshot};
use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
};
use ipnet::Ipv4Net;
use proxy_common::{
    Backend, BackendId, CtKey, CtValue, DatapathConfig, IfaceInfo, Ipv4Prefix, ServiceKey,
    ServiceValue, SockKey, SockValue, SourceRange, maps as names,
};

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
    #[error("too many backends ({count}): a frontend addresses at most 65535 slots")]
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

/// What the service programmer writes: services, backends, source ranges, conntrack flushes.
pub trait ServiceMaps {
    fn put_backend(&mut self, id: BackendId, backend: &Backend) -> Result<(), MapError>;
    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError>;
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError>;
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError>;
    /// Allows sources in `range` for the frontends of `service_id` that carry
    /// [`proxy_common::service::flags::SOURCE_RANGES`].
    fn put_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError>;
    fn delete_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError>;
    /// Deletes every conntrack entry matching `matches`, returning how many.
    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError>;
}

/// What the node programmer writes: the node-wide settings and interface table.
pub trait NodeMaps {
    fn put_config(&mut self, config: &DatapathConfig) -> Result<(), MapError>;
    fn put_iface(&mut self, ifindex: u32, info: &IfaceInfo) -> Result<(), MapError>;
    fn delete_iface(&mut self, ifindex: u32) -> Result<(), MapError>;
    fn put_local_pod_cidr(&mut self, cidr: Ipv4Net) -> Result<(), MapError>;
    fn delete_local_pod_cidr(&mut self, cidr: Ipv4Net) -> Result<(), MapError>;
}

/// The `SOURCE_RANGES` key of `range` for `service_id`: the id is matched
/// exactly (its 32 bits come first), then the range's prefix.
pub fn source_range_key(service_id: u32, range: Ipv4Net) -> Key<SourceRange> {
    let range = range.trunc();
    Key::new(
        32 + u32::from(range.prefix_len()),
        SourceRange {
            service_be: service_id.to_be(),
            addr_be: u32::from(range.addr()).to_be(),
        },
    )
}

/// The `LOCAL_POD_CIDRS` key of `cidr`.
pub fn local_pod_cidr_key(cidr: Ipv4Net) -> Key<Ipv4Prefix> {
    let cidr = cidr.trunc();
    Key::new(
        u32::from(cidr.prefix_len()),
        Ipv4Prefix {
            addr_be: u32::from(cidr.addr()).to_be(),
        },
    )
}

/// The kernel maps of a loaded datapath.
pub struct KernelMaps {
    pub services: HashMap<MapData, ServiceKey, ServiceValue>,
    pub backends: HashMap<MapData, BackendId, Backend>,
    pub conntrack: HashMap<MapData, CtKey, CtValue>,
    pub config: Array<MapData, DatapathConfig>,
    pub ifaces: HashMap<MapData, u32, IfaceInfo>,
    pub local_pod_cidrs: LpmTrie<MapData, Ipv4Prefix, u8>,
    pub source_ranges: LpmTrie<MapData, SourceRange, u8>,
    /// The socket hooks' choices (written only by the programs).
    pub sockets: HashMap<MapData, SockKey, SockValue>,
}

impl KernelMaps {
    /// Takes the agent's maps and the per-CPU counters out of a loaded object.
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<(KernelMaps, PerCpuArray<MapData, u64>)> {
        let maps = KernelMaps {
            services: take_map(ebpf, names::SERVICES)?,
            backends: take_map(ebpf, names::BACKENDS)?,
            conntrack: take_map(ebpf, names::CONNTRACK)?,
            config: take_map(ebpf, names::CONFIG)?,
            ifaces: take_map(ebpf, names::IFACES)?,
            local_pod_cidrs: take_map(ebpf, names::LOCAL_POD_CIDRS)?,
            source_ranges: take_map(ebpf, names::SOURCE_RANGES)?,
            sockets: take_map(ebpf, names::SOCKETS)?,
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
        }
    }

    /// What the service maps hold (for adopting pinned maps).
    pub fn service_snapshot(&self) -> Result<ServiceSnapshot, MapError> {
        let read = |map: &'static str| move |source| MapError::Read { map, source };
        Ok(ServiceSnapshot {
            services: self
                .services
                .iter()
                .collect::<Result<_, _>>()
                .map_err(read(names::SERVICES))?,
            backends: self
                .backends
                .iter()
                .collect::<Result<_, _>>()
                .map_err(read(names::BACKENDS))?,
            source_ranges: self
                .source_ranges
                .keys()
                .map(|k| {
                    k.map(|k| {
                        let data = k.data();
                        let prefix = (k.prefix_len().saturating_sub(32)) as u8;
                        let addr = std::net::Ipv4Addr::from(u32::from_be(data.addr_be));
                        (
                            u32::from_be(data.service_be),
                            Ipv4Net::new(addr, prefix.min(32)).unwrap_or_default(),
                        )
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(read(names::SOURCE_RANGES))?,
        })
    }

    /// What the node maps hold (for adopting pinned maps).
    pub fn node_snapshot(&self) -> Result<NodeSnapshot, MapError> {
        let read = |map: &'static str| move |source| MapError::Read { map, source };
        Ok(NodeSnapshot {
            config: self.config.get(&0, 0).map_err(read(names::CONFIG))?,
            ifaces: self
                .ifaces
                .iter()
                .collect::<Result<_, _>>()
                .map_err(read(names::IFACES))?,
            local_pod_cidrs: self
                .local_pod_cidrs
                .keys()
                .map(|k| {
                    k.map(|k| {
                        let addr = std::net::Ipv4Addr::from(u32::from_be(k.data().addr_be));
                        Ipv4Net::new(addr, k.prefix_len().min(32) as u8).unwrap_or_default()
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(read(names::LOCAL_POD_CIDRS))?,
        })
    }
}

/// What the node maps hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub config: DatapathConfig,
    pub ifaces: Vec<(u32, IfaceInfo)>,
    pub local_pod_cidrs: Vec<Ipv4Net>,
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

impl ServiceMaps for KernelMaps {
    fn put_backend(&mut self, id: BackendId, backend: &Backend) -> Result<(), MapError> {
        self.backends
            .insert(id, backend, 0)
            .map_err(write_error(names::BACKENDS))
    }

    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError> {
        ignore_missing(self.backends.remove(&id)).map_err(write_error(names::BACKENDS))
    }

    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services
            .insert(key, value, 0)
            .map_err(write_error(names::SERVICES))
    }

    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        ignore_missing(self.services.remove(key)).map_err(write_error(names::SERVICES))
    }

    fn put_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError> {
        self.source_ranges
            .insert(&source_range_key(service_id, range), PRESENT, 0)
            .map_err(write_error(names::SOURCE_RANGES))
    }

    fn delete_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError> {
        ignore_missing(
            self.source_ranges
                .remove(&source_range_key(service_id, range)),
        )
        .map_err(write_error(names::SOURCE_RANGES))
    }

    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError> {
        let doomed: Vec<CtKey> = self
            .conntrack
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| matches(k, v))
            .map(|(k, _)| k)
            .collect();
        for key in &doomed {
            ignore_missing(self.conntrack.remove(key)).map_err(write_error(names::CONNTRACK))?;
        }
        Ok(doomed.len())
    }
}

impl NodeMaps for KernelMaps {
    fn put_config(&mut self, config: &DatapathConfig) -> Result<(), MapError> {
        self.config
            .set(0, config, 0)
            .map_err(write_error(names::CONFIG))
    }

    fn put_iface(&mut self, ifindex: u32, info: &IfaceInfo) -> Result<(), MapError> {
        self.ifaces
            .insert(ifindex, info, 0)
            .map_err(write_error(names::IFACES))
    }

    fn delete_iface(&mut self, ifindex: u32) -> Result<(), MapError> {
        ignore_missing(self.ifaces.remove(&ifindex)).map_err(write_error(names::IFACES))
    }

    fn put_local_pod_cidr(&mut self, cidr: Ipv4Net) -> Result<(), MapError> {
        self.local_pod_cidrs
            .insert(&local_pod_cidr_key(cidr), PRESENT, 0)
            .map_err(write_error(names::LOCAL_POD_CIDRS))
    }

    fn delete_local_pod_cidr(&mut self, cidr: Ipv4Net) -> Result<(), MapError> {
        ignore_missing(self.local_pod_cidrs.remove(&local_pod_cidr_key(cidr)))
            .map_err(write_error(names::LOCAL_POD_CIDRS))
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
    fn local_pod_cidr_key_is_the_prefix() {
        let key = local_pod_cidr_key("10.244.1.0/24".parse().unwrap());
        assert_eq!(key.prefix_len(), 24);
        assert_eq!(key.data().addr_be.to_ne_bytes(), [10, 244, 1, 0]);
    }
}
