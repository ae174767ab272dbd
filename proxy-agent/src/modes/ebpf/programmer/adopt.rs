//! Taking over maps a previous agent programmed (pinned maps found at start):
//! the bookkeeping is rebuilt from what the maps hold, so the first sync only
//! writes what differs, and backends and services keep their ids (established
//! flows name them).

use foldhash::HashMap;
use std::collections::BTreeMap;

use proxy_common::{
    BackendId, BackendOf, FrontendKind, ServiceKeyOf, ServiceValue, V4, maglev::MAGLEV_SLOT,
    service::flags,
};

use super::{
    FamilyProgrammer, Frontend,
    frontends::{EndpointSet, wanted_frontends},
};
use crate::{
    model::{DesiredState, NamespacedName, Protocol, ServicePortName},
    modes::ebpf::{family::AgentFamily, node::NodeAddressesOf},
};

/// What one family's service maps hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSnapshotOf<F: AgentFamily> {
    pub services: Vec<(ServiceKeyOf<F>, ServiceValue)>,
    pub backends: Vec<(BackendId, BackendOf<F>)>,
    pub source_ranges: Vec<(u32, F::Net)>,
}

impl<F: AgentFamily> Default for ServiceSnapshotOf<F> {
    fn default() -> Self {
        ServiceSnapshotOf {
            services: Vec::new(),
            backends: Vec::new(),
            source_ranges: Vec::new(),
        }
    }
}

/// What the IPv4 service maps hold.
pub type ServiceSnapshot = ServiceSnapshotOf<V4>;

impl<F: AgentFamily> FamilyProgrammer<F> {
    /// Rebuilds the bookkeeping from `snapshot`. Frontends are matched to the
    /// service ports of `state` that want them (under `node`'s addresses);
    /// the rest get a placeholder owner no service port has, so the next full
    /// sync removes them. Call once, before the first sync.
    pub fn adopt(
        &mut self,
        snapshot: &ServiceSnapshotOf<F>,
        state: &DesiredState,
        node: &NodeAddressesOf<F>,
    ) -> AdoptStats {
        self.node = node.clone();
        let owners: HashMap<ServiceKeyOf<F>, (&ServicePortName, EndpointSet)> = state
            .services
            .values()
            .flat_map(|svc| {
                wanted_frontends(svc, node)
                    .into_iter()
                    .map(move |f| (f.key, (&svc.name, f.endpoints)))
            })
            .collect();
        let entries: BTreeMap<ServiceKeyOf<F>, ServiceValue> =
            snapshot.services.iter().copied().collect();

        for (id, backend) in &snapshot.backends {
            self.backends.insert(*backend, *id);
            self.backend_by_id.insert(*id, *backend);
            self.unreferenced.insert(*id);
            self.filter.add(super::backend_filter_bit(backend));
        }
        self.backend_ids
            .adopt(snapshot.backends.iter().map(|(id, _)| *id));

        let mut stats = AdoptStats::default();
        let frontend_keys = entries
            .keys()
            .map(|k| k.with_slot(0))
            .collect::<std::collections::BTreeSet<_>>();
        for key in frontend_keys {
            let value = entries.get(&key);
            if value.is_some_and(|v| v.has(flags::CLUSTER_IP_MARKER)) {
                self.markers.adopt_written(key.addr_be);
                continue;
            }
            // The snapshot presents the `count` slots of the frontend's range.
            let slots: Vec<BackendId> = (1..MAGLEV_SLOT)
                .map_while(|i| entries.get(&key.with_slot(i)).map(|v| v.backend_id))
                .collect();
            let service_id = value.map_or_else(
                || entries.get(&key.with_slot(1)).map_or(0, |v| v.service_id),
                |v| v.service_id,
            );
            let maglev = entries.get(&key.with_slot(MAGLEV_SLOT)).copied();
            self.maglev_refs += usize::from(maglev.is_some());
            let owner = match owners.get(&key) {
                Some((spn, set)) => {
                    if let Some(table) = maglev {
                        self.maglev.adopt(((*spn).clone(), *set), table);
                    }
                    (*spn).clone()
                }
                None => {
                    stats.stale_frontends += 1;
                    placeholder(service_id, key.proto)
                }
            };
            for id in &slots {
                *self.backend_refs.entry(*id).or_default() += 1;
            }
            let port = self.ports.entry(owner.clone()).or_default();
            port.id.get_or_insert(service_id);
            // The previous agent's flows are judged at the first sync.
            port.udp_keepers = None;
            port.frontends.insert(key);
            if value.is_some_and(|v| v.kind() == FrontendKind::ClusterIp) {
                self.markers.adopt_user(key);
            }
            stats.frontends += 1;
            // The range it holds is known to be `count` long; one that
            // overlaps another (or is outside the array) is not taken over:
            // the first sync gives the frontend a new one.
            let range = value
                .filter(|v| v.count > 0)
                .map(|v| super::SlotRange {
                    first: v.first_slot,
                    len: u32::from(v.count),
                })
                .filter(|r| self.slot_ranges.adopt(*r));
            self.filter.add(super::frontend_filter_bit(&key));
            self.frontends.insert(
                key,
                Frontend {
                    owner,
                    service_id,
                    slots,
                    range,
                    written: value.copied(),
                    maglev,
                },
            );
        }
        for (service_id, range) in &snapshot.source_ranges {
            self.source_ranges
                .entry(*service_id)
                .or_default()
                .insert(*range);
            if !self.ports.values().any(|port| port.id == Some(*service_id)) {
                self.ports
                    .entry(placeholder(*service_id, 0))
                    .or_default()
                    .id = Some(*service_id);
            }
        }
        self.service_id_pool
            .adopt(self.ports.values().filter_map(|port| port.id));
        self.markers.note_unused();
        for (id, refs) in &self.backend_refs {
            if *refs > 0 {
                self.unreferenced.remove(id);
            }
        }
        self.filter.rewrite_all();
        stats.backends = self.backends.len();
        stats
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdoptStats {
    pub frontends: usize,
    pub backends: usize,
    /// Frontends no current service port wants: removed by the first sync.
    pub stale_frontends: usize,
}

/// An owner no Kubernetes service port can have (namespaces are never empty).
fn placeholder(service_id: u32, proto: u8) -> ServicePortName {
    let protocol = match proto {
        proxy_common::proto::UDP => Protocol::Udp,
        _ => Protocol::Tcp,
    };
    ServicePortName::new(
        &NamespacedName::new("", format!("adopted-service-{service_id}")),
        "",
        protocol,
    )
}
