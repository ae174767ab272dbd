//! Which IPv4 frontends one service port needs, with which flags and
//! endpoints, and which source ranges guard them. Pure functions.

use std::{
    collections::{BTreeSet, HashSet},
    net::{IpAddr, Ipv4Addr},
};

use ipnet::{IpNet, Ipv4Net};
use proxy_common::{
    Backend, FrontendKind, Scope, ServiceKey, ServiceValue, backend::flags as backend_flags,
    service::flags,
};

use crate::model::{DesiredService, Endpoint};
use crate::modes::ebpf::node::NodeAddresses;

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
    /// The set's IPv4 backends; those on one of `host`'s addresses (the
    /// node itself) are flagged so.
    pub(super) fn backends(self, svc: &DesiredService, host: &BTreeSet<Ipv4Addr>) -> Vec<Backend> {
        let endpoints = match self {
            EndpointSet::Internal => svc.internal_endpoints(),
            EndpointSet::External => svc.external_endpoints(),
            EndpointSet::Cluster => &svc.cluster_endpoints,
        };
        ipv4_backends(endpoints, svc.protocol.ip_proto(), host)
    }
}

/// Whether one of `svc`'s endpoints is on one of `addrs`.
pub(super) fn has_endpoint_on(svc: &DesiredService, addrs: &BTreeSet<Ipv4Addr>) -> bool {
    svc.cluster_endpoints
        .iter()
        .chain(&svc.local_endpoints)
        .any(|ep| matches!(ep.ip, IpAddr::V4(ip) if addrs.contains(&ip)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WantedFrontend {
    pub key: ServiceKey,
    pub flags: u16,
    pub endpoints: EndpointSet,
}

impl WantedFrontend {
    pub(super) fn kind(&self) -> FrontendKind {
        ServiceValue::frontend(0, 0, self.flags).kind()
    }
}

/// Every frontend of `svc` in the IPv4 maps. A key appears once: the first
/// kind claiming it wins (cluster IP, node port, external IP, LB IP).
pub(super) fn wanted_frontends(svc: &DesiredService, node: &NodeAddresses) -> Vec<WantedFrontend> {
    let proto = svc.protocol.ip_proto();
    let reject = if svc.has_any_endpoints.v4 {
        0
    } else {
        flags::REJECT_WHEN_EMPTY
    };
    let policy_local = |local: bool| if local { flags::POLICY_LOCAL } else { 0 };
    let mut out = Vec::new();

    for vip in ipv4(&svc.cluster_ips) {
        out.push(WantedFrontend {
            key: ServiceKey::frontend(be(vip), svc.port.to_be(), proto),
            flags: ServiceValue::kind_flags(FrontendKind::ClusterIp)
                | reject
                | policy_local(svc.internal_policy_local),
            endpoints: EndpointSet::Internal,
        });
    }

    let node_ports = svc.node_port.into_iter().flat_map(|port| {
        node.node_ports
            .iter()
            .map(move |a| (FrontendKind::NodePort, *a, port))
    });
    let localhost = svc
        .node_port
        .filter(|_| node.localhost_node_ports)
        .map(|port| (FrontendKind::NodePort, Ipv4Addr::LOCALHOST, port));
    let external_ips = ipv4(&svc.external_ips).map(|a| (FrontendKind::ExternalIp, a, svc.port));
    let lb_ips = ipv4(&svc.load_balancer_ips).map(|a| (FrontendKind::LoadBalancer, a, svc.port));
    let has_source_ranges = !ipv4_ranges(&svc.load_balancer_source_ranges).is_empty();
    for (kind, addr, port) in node_ports
        .chain(localhost)
        .chain(external_ips)
        .chain(lb_ips)
    {
        let key = ServiceKey::frontend(be(addr), port.to_be(), proto);
        let mut flags = ServiceValue::kind_flags(kind) | flags::EXTERNAL | reject;
        if addr.is_loopback() {
            flags |= flags::HOST_ONLY;
        }
        if kind == FrontendKind::LoadBalancer && has_source_ranges {
            flags |= flags::SOURCE_RANGES;
        }
        out.push(WantedFrontend {
            key,
            flags: flags | policy_local(svc.external_policy_local),
            endpoints: EndpointSet::External,
        });
        if svc.external_policy_local {
            out.push(WantedFrontend {
                key: key.with_scope(Scope::ClusterWide),
                flags,
                endpoints: EndpointSet::Cluster,
            });
        }
    }

    let mut seen = HashSet::new();
    out.retain(|f| seen.insert(f.key));
    out
}

/// The source ranges of `svc`'s LB frontends (empty: none, or no LB IP).
/// As upstream, when a range holds the node's primary IP the LB IPs are
/// allowed as sources too: a node that routes its LB IPs locally sends from them.
pub(super) fn wanted_source_ranges(
    svc: &DesiredService,
    node: &NodeAddresses,
) -> BTreeSet<Ipv4Net> {
    let lb_ips: Vec<Ipv4Addr> = ipv4(&svc.load_balancer_ips).collect();
    let mut ranges: BTreeSet<Ipv4Net> = ipv4_ranges(&svc.load_balancer_source_ranges);
    if lb_ips.is_empty() {
        return BTreeSet::new();
    }
    let allow_from_node = node
        .primary
        .is_some_and(|primary| ranges.iter().any(|r| r.contains(&primary)));
    if allow_from_node {
        ranges.extend(lb_ips.into_iter().map(Ipv4Net::from));
    }
    ranges
}

fn ipv4_ranges(ranges: &[IpNet]) -> BTreeSet<Ipv4Net> {
    ranges
        .iter()
        .filter_map(|r| match r {
            IpNet::V4(r) => Some(r.trunc()),
            IpNet::V6(_) => None,
        })
        .collect()
}

fn ipv4(addrs: &[IpAddr]) -> impl Iterator<Item = Ipv4Addr> + '_ {
    addrs.iter().filter_map(|a| match a {
        IpAddr::V4(a) => Some(*a),
        IpAddr::V6(_) => None,
    })
}

fn be(addr: Ipv4Addr) -> u32 {
    u32::from(addr).to_be()
}

/// The IPv4 endpoints as backends, deduplicated.
fn ipv4_backends(endpoints: &[Endpoint], proto: u8, host: &BTreeSet<Ipv4Addr>) -> Vec<Backend> {
    let mut seen = BTreeSet::new();
    endpoints
        .iter()
        .filter_map(|ep| match ep.ip {
            IpAddr::V4(ip) => Some(Backend {
                addr_be: be(ip),
                port_be: ep.port.to_be(),
                proto,
                flags: if host.contains(&ip) {
                    backend_flags::HOST_LOCAL
                } else {
                    0
                },
            }),
            IpAddr::V6(_) => None,
        })
        .filter(|b| seen.insert((b.addr_be, b.port_be)))
        .collect()
}
