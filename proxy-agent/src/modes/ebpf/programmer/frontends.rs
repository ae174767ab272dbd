//! Which frontends of one family one service port needs, with which flags
//! and endpoints, and which source ranges guard them. Pure functions.

use std::{
    collections::BTreeSet,
    hash::Hash,
    net::{IpAddr, Ipv4Addr},
};

use proxy_common::{
    BackendOf, FrontendKind, Scope, ServiceKeyOf, ServiceValue, backend::flags as backend_flags,
    service::flags,
};

use crate::model::{DesiredService, Endpoint, SessionAffinity};
use crate::modes::ebpf::{family::AgentFamily, node::NodeAddressesOf};

/// Which of the service's endpoint lists a frontend balances over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum EndpointSet {
    /// internalTrafficPolicy applied (cluster IPs).
    Internal,
    /// externalTrafficPolicy applied (node ports, external and LB IPs).
    External,
    /// Every usable endpoint: the short-circuit for local clients under eTP Local.
    Cluster,
}

impl EndpointSet {
    pub(super) const ALL: [EndpointSet; 3] = [Self::Internal, Self::External, Self::Cluster];
}

/// Something per [`EndpointSet`]: inline, where a map per service port
/// allocated a table (19 MB at 50,000 services).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PerSet<T>([Option<T>; 3]);

impl<T> Default for PerSet<T> {
    fn default() -> Self {
        PerSet([None, None, None])
    }
}

impl<T> PerSet<T> {
    pub(super) fn get(&self, set: EndpointSet) -> Option<&T> {
        self.0[set as usize].as_ref()
    }

    pub(super) fn insert(&mut self, set: EndpointSet, value: T) {
        self.0[set as usize] = Some(value);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(EndpointSet) -> bool) {
        for set in EndpointSet::ALL {
            if !keep(set) {
                self.0[set as usize] = None;
            }
        }
    }
}

impl EndpointSet {
    /// The set's backends of family `F`; those on one of `host`'s
    /// addresses (the node itself) are flagged so.
    pub(super) fn backends<F: AgentFamily>(
        self,
        svc: &DesiredService,
        host: &BTreeSet<F::Ip>,
    ) -> Vec<BackendOf<F>> {
        let endpoints = match self {
            EndpointSet::Internal => svc.internal_endpoints(),
            EndpointSet::External => svc.external_endpoints(),
            EndpointSet::Cluster => &svc.cluster_endpoints,
        };
        backends_of::<F>(endpoints, svc.protocol.ip_proto(), host)
    }
}

/// Whether one of `svc`'s endpoints is on one of `addrs`.
pub(super) fn has_endpoint_on<F: AgentFamily>(
    svc: &DesiredService,
    addrs: &BTreeSet<F::Ip>,
) -> bool {
    svc.cluster_endpoints
        .iter()
        .chain(&svc.local_endpoints)
        .any(|ep| F::ip(&ep.ip).is_some_and(|ip| addrs.contains(&ip)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WantedFrontend<F: AgentFamily> {
    pub key: ServiceKeyOf<F>,
    pub flags: u16,
    pub endpoints: EndpointSet,
    /// `sessionAffinity: ClientIP`'s timeout in seconds; 0: none.
    pub affinity_s: u32,
}

impl<F: AgentFamily> WantedFrontend<F> {
    pub(super) fn kind(&self) -> FrontendKind {
        ServiceValue::frontend(0, 0, self.flags).kind()
    }

    /// Slot 0's value: with affinity, its timeout is in `backend_id`.
    pub(super) fn value(&self, count: u16, service_id: u32) -> ServiceValue {
        if self.affinity_s == 0 {
            return ServiceValue::frontend(count, service_id, self.flags);
        }
        ServiceValue {
            backend_id: self.affinity_s,
            ..ServiceValue::frontend(count, service_id, self.flags | flags::AFFINITY)
        }
    }
}

/// Every frontend of `svc` in family `F`'s maps. A key appears once: the
/// first kind claiming it wins (cluster IP, node port, external IP, LB IP).
pub(super) fn wanted_frontends<F: AgentFamily>(
    svc: &DesiredService,
    node: &NodeAddressesOf<F>,
) -> Vec<WantedFrontend<F>> {
    let proto = svc.protocol.ip_proto();
    let reject = if svc.has_any_endpoints.contains(F::FAMILY) {
        0
    } else {
        flags::REJECT_WHEN_EMPTY
    };
    let policy_local = |local: bool| if local { flags::POLICY_LOCAL } else { 0 };
    let affinity_s = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => timeout_seconds.max(1),
        SessionAffinity::None => 0,
    };
    let mut out = Vec::new();

    for vip in of_family::<F>(&svc.cluster_ips) {
        out.push(WantedFrontend {
            key: ServiceKeyOf::frontend(F::to_be(vip), svc.port.to_be(), proto),
            flags: ServiceValue::kind_flags(FrontendKind::ClusterIp)
                | reject
                | policy_local(svc.internal_policy_local),
            endpoints: EndpointSet::Internal,
            affinity_s,
        });
    }

    let node_ports = svc.node_port.into_iter().flat_map(|port| {
        node.node_ports
            .iter()
            .map(move |a| (FrontendKind::NodePort, *a, port))
    });
    // Upstream serves localhost NodePorts on 127.0.0.1 only (route_localnet).
    let localhost = svc
        .node_port
        .filter(|_| node.localhost_node_ports)
        .and_then(|port| {
            F::ip(&IpAddr::V4(Ipv4Addr::LOCALHOST)).map(|a| (FrontendKind::NodePort, a, port))
        });
    let external_ips =
        of_family::<F>(&svc.external_ips).map(|a| (FrontendKind::ExternalIp, a, svc.port));
    let lb_ips =
        of_family::<F>(&svc.load_balancer_ips).map(|a| (FrontendKind::LoadBalancer, a, svc.port));
    let has_source_ranges = !ranges_of::<F>(&svc.load_balancer_source_ranges).is_empty();
    for (kind, addr, port) in node_ports
        .chain(localhost)
        .chain(external_ips)
        .chain(lb_ips)
    {
        let key = ServiceKeyOf::frontend(F::to_be(addr), port.to_be(), proto);
        let mut flags = ServiceValue::kind_flags(kind) | flags::EXTERNAL | reject;
        if Into::<IpAddr>::into(addr).is_loopback() {
            flags |= flags::HOST_ONLY;
        }
        if kind == FrontendKind::LoadBalancer && has_source_ranges {
            flags |= flags::SOURCE_RANGES;
        }
        out.push(WantedFrontend {
            key,
            flags: flags | policy_local(svc.external_policy_local),
            endpoints: EndpointSet::External,
            affinity_s,
        });
        if svc.external_policy_local {
            out.push(WantedFrontend {
                key: key.with_scope(Scope::ClusterWide),
                flags,
                endpoints: EndpointSet::Cluster,
                affinity_s,
            });
        }
    }

    keep_first(&mut out, |f| f.key);
    out
}

/// The source ranges of `svc`'s LB frontends (empty: none, or no LB IP).
/// As upstream, when a range holds the node's primary IP the LB IPs are
/// allowed as sources too: a node that routes its LB IPs locally sends from them.
pub(super) fn wanted_source_ranges<F: AgentFamily>(
    svc: &DesiredService,
    node: &NodeAddressesOf<F>,
) -> BTreeSet<F::Net> {
    let lb_ips: Vec<F::Ip> = of_family::<F>(&svc.load_balancer_ips).collect();
    let mut ranges: BTreeSet<F::Net> = ranges_of::<F>(&svc.load_balancer_source_ranges);
    if lb_ips.is_empty() {
        return BTreeSet::new();
    }
    let allow_from_node = node
        .primary
        .is_some_and(|primary| ranges.iter().any(|r| F::contains(r, &primary)));
    if allow_from_node {
        ranges.extend(lb_ips.into_iter().map(F::host_net));
    }
    ranges
}

fn ranges_of<F: AgentFamily>(ranges: &[ipnet::IpNet]) -> BTreeSet<F::Net> {
    ranges.iter().filter_map(F::net).collect()
}

fn of_family<F: AgentFamily>(addrs: &[IpAddr]) -> impl Iterator<Item = F::Ip> + '_ {
    addrs.iter().filter_map(F::ip)
}

/// The endpoints of family `F` as backends, deduplicated.
fn backends_of<F: AgentFamily>(
    endpoints: &[Endpoint],
    proto: u8,
    host: &BTreeSet<F::Ip>,
) -> Vec<BackendOf<F>> {
    let mut backends: Vec<BackendOf<F>> = endpoints
        .iter()
        .filter_map(|ep| {
            let ip = F::ip(&ep.ip)?;
            Some(BackendOf::<F> {
                addr_be: F::to_be(ip),
                port_be: ep.port.to_be(),
                proto,
                flags: if host.contains(&ip) {
                    backend_flags::HOST_LOCAL
                } else {
                    0
                },
            })
        })
        .collect();
    keep_first(&mut backends, |b| (b.addr_be, b.port_be));
    backends
}

/// Drops every item whose key an earlier one has, keeping the order. A
/// port's lists are short: scanned while they are, a hash set past that (a
/// set allocated per list was a tenth of a cold sync at 50,000 services).
fn keep_first<T, K: Eq + Hash>(items: &mut Vec<T>, key: impl Fn(&T) -> K) {
    const SCANNED: usize = 16;
    if items.len() <= SCANNED {
        let mut kept = 0;
        for i in 0..items.len() {
            if !items[..kept]
                .iter()
                .any(|earlier| key(earlier) == key(&items[i]))
            {
                items.swap(kept, i);
                kept += 1;
            }
        }
        items.truncate(kept);
    } else {
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(items.len(), Default::default());
        items.retain(|item| seen.insert(key(item)));
    }
}

#[cfg(test)]
mod tests {
    use super::keep_first;

    /// Short lists are scanned and long ones go through a set: both keep
    /// the first item of each key, in the items' order.
    #[test]
    fn keep_first_keeps_each_keys_first_item_in_order() {
        for len in [0, 1, 5, 16, 17, 40] {
            let items: Vec<(u32, usize)> = (0..len).map(|i| ((i * 7 % 5) as u32, i)).collect();
            let mut kept = items.clone();
            keep_first(&mut kept, |(key, _)| *key);
            let mut expected: Vec<(u32, usize)> = Vec::new();
            for item in &items {
                if !expected.iter().any(|(key, _)| *key == item.0) {
                    expected.push(*item);
                }
            }
            assert_eq!(kept, expected, "{len} items");
        }
    }
}
