//! EndpointSlice -> the few fields kube-proxy needs (upstream `endpointSliceInfo`),
//! and the per-service-port endpoint lists built from a service's slices.

use std::{
    collections::{BTreeMap, btree_map::Entry},
    net::IpAddr,
    sync::Arc,
};

use super::{Endpoint, NamespacedName, Placement, Protocol, endpoint_slice::EndpointSlice};

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `(port name, protocol)` of a service port, the per-service half of a `ServicePortName`.
pub type PortKey = (String, Protocol);

/// Endpoints of one service, per port, sorted and de-duplicated. A sorted
/// Vec, not a map: a service has a port or two, and a `BTreeMap` node per
/// service held 32 MB of the agent's heap at 50,000 services.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointsByPort(Vec<(PortKey, Vec<Endpoint>)>);

impl EndpointsByPort {
    pub fn get(&self, port_name: &str, protocol: Protocol) -> Option<&[Endpoint]> {
        self.0
            .binary_search_by(|((name, proto), _)| {
                (name.as_str(), *proto).cmp(&(port_name, protocol))
            })
            .ok()
            .map(|i| self.0[i].1.as_slice())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// Upstream only ever uses `addresses[0]`.
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub placement: Arc<Placement>,
}

/// One slice, reduced. Compared whole to decide whether an update changed anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    pub service: NamespacedName,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
}

/// `(namespace, slice name)`.
pub fn slice_key(slice: &EndpointSlice) -> Option<(String, String)> {
    let name = slice.metadata.name.as_deref()?;
    Some((
        slice
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
            .to_owned(),
        name.to_owned(),
    ))
}

/// `None` for slices kube-proxy ignores: FQDN address type or no service-name label.
pub fn slice_info(slice: &EndpointSlice) -> Option<SliceInfo> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return None;
    }
    let (namespace, _) = slice_key(slice)?;
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .filter(|s| !s.is_empty())?;
    let mut ports: Vec<SlicePort> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            // A nil or zero port is invalid upstream ("TODO: nil means all"), so skipped.
            let port = u16::try_from(p.port?).ok().filter(|p| *p != 0)?;
            Some(SlicePort {
                name: p.name.clone().unwrap_or_default(),
                protocol: Protocol::parse(p.protocol.as_deref())?,
                port,
            })
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    // A slice's endpoints are mostly placed alike: the previous one's
    // placement is reused without the interner's lock and allocations.
    let mut previous: Option<Arc<Placement>> = None;
    let mut endpoints: Vec<SliceEndpoint> = slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|ep| {
            let ip: IpAddr = ep.addresses.first()?.parse().ok()?;
            let cond = ep.conditions.as_ref();
            let hints = ep.hints.as_ref();
            let mut zone_hints: Vec<String> = hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect();
            let mut node_hints: Vec<String> = hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect();
            zone_hints.sort();
            zone_hints.dedup();
            node_hints.sort();
            node_hints.dedup();
            let placement = match previous.as_ref() {
                Some(p)
                    if p.node_name == ep.node_name
                        && p.zone == ep.zone
                        && p.zone_hints == zone_hints
                        && p.node_hints == node_hints =>
                {
                    p.clone()
                }
                _ => {
                    let placement = Placement {
                        node_name: ep.node_name.clone(),
                        zone: ep.zone.clone(),
                        zone_hints,
                        node_hints,
                    }
                    .shared();
                    previous = Some(placement.clone());
                    placement
                }
            };
            Some(SliceEndpoint {
                ip,
                ready: cond.and_then(|c| c.ready).unwrap_or(true),
                serving: cond.and_then(|c| c.serving).unwrap_or(true),
                terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                placement,
            })
        })
        .collect();
    endpoints.sort_by_key(|e| e.ip);
    // Kept for the agent's life: no growth slack.
    ports.shrink_to_fit();
    endpoints.shrink_to_fit();
    Some(SliceInfo {
        service: NamespacedName::new(namespace, service.clone()),
        ports,
        endpoints,
    })
}

/// Merges a service's slices into per-port endpoint lists. Each slice resolves a
/// named target port to its own number, so one port name can map to different
/// ports on different endpoints. The same `ip:port` in several slices appears
/// once, a local copy winning, as upstream's `addEndpoints`.
pub fn endpoints_by_port<'a>(
    slices: impl IntoIterator<Item = &'a SliceInfo>,
    node_name: &str,
) -> EndpointsByPort {
    let mut merged: BTreeMap<PortKey, BTreeMap<(IpAddr, u16), Endpoint>> = BTreeMap::new();
    for slice in slices {
        for port in &slice.ports {
            let set = merged
                .entry((port.name.clone(), port.protocol))
                .or_default();
            for ep in &slice.endpoints {
                let is_local =
                    !node_name.is_empty() && ep.placement.node_name.as_deref() == Some(node_name);
                let endpoint = Endpoint {
                    ip: ep.ip,
                    port: port.port,
                    ready: ep.ready,
                    serving: ep.serving,
                    terminating: ep.terminating,
                    is_local,
                    placement: ep.placement.clone(),
                };
                match set.entry((ep.ip, port.port)) {
                    Entry::Vacant(v) => {
                        v.insert(endpoint);
                    }
                    Entry::Occupied(mut o) if is_local => {
                        o.insert(endpoint);
                    }
                    Entry::Occupied(_) => {}
                }
            }
        }
    }
    let mut ports: Vec<_> = merged
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(key, set)| (key, set.into_values().collect()))
        .collect();
    ports.shrink_to_fit();
    EndpointsByPort(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each endpoint keeps its own node, zone and hints; endpoints placed
    /// alike, next to each other or not, hold one allocation.
    #[test]
    fn every_endpoint_gets_its_own_placement_shared_with_those_placed_alike() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["198.18.1.1"], "nodeName": "node-a", "zone": "z1"},
                {"addresses": ["198.18.1.2"], "nodeName": "node-a", "zone": "z1"},
                {"addresses": ["198.18.1.3"], "nodeName": "node-a", "zone": "z2"},
                {"addresses": ["198.18.1.4"], "nodeName": "node-b", "zone": "z2"},
                {"addresses": ["198.18.1.5"], "nodeName": "node-b", "zone": "z2",
                 "hints": {"forZones": [{"name": "z2"}, {"name": "z1"}]}},
                {"addresses": ["198.18.1.6"], "nodeName": "node-b", "zone": "z2",
                 "hints": {"forZones": [{"name": "z2"}], "forNodes": [{"name": "node-b"}]}},
                {"addresses": ["198.18.1.7"], "zone": "z2"},
                {"addresses": ["198.18.1.8"], "nodeName": "node-a", "zone": "z1"}
            ]
        }))
        .unwrap();
        let info = slice_info(&slice).unwrap();
        type Placed<'a> = (Option<&'a str>, Option<&'a str>, Vec<&'a str>, Vec<&'a str>);
        let placed: Vec<Placed> = info
            .endpoints
            .iter()
            .map(|e| {
                let p = &e.placement;
                (
                    p.node_name.as_deref(),
                    p.zone.as_deref(),
                    p.zone_hints.iter().map(String::as_str).collect(),
                    p.node_hints.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let none = Vec::<&str>::new;
        assert_eq!(
            placed,
            [
                (Some("node-a"), Some("z1"), none(), none()),
                (Some("node-a"), Some("z1"), none(), none()),
                (Some("node-a"), Some("z2"), none(), none()),
                (Some("node-b"), Some("z2"), none(), none()),
                (Some("node-b"), Some("z2"), vec!["z1", "z2"], none()),
                (Some("node-b"), Some("z2"), vec!["z2"], vec!["node-b"]),
                (None, Some("z2"), none(), none()),
                (Some("node-a"), Some("z1"), none(), none()),
            ]
        );
        let shared = |a: usize, b: usize| {
            Arc::ptr_eq(&info.endpoints[a].placement, &info.endpoints[b].placement)
        };
        assert!(shared(0, 1) && shared(0, 7));
        assert!(!shared(1, 2) && !shared(2, 3) && !shared(3, 4) && !shared(4, 5));
    }
}
