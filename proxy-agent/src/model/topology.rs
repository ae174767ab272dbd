//! Upstream's `CategorizeEndpoints`: which endpoints this node uses for a
//! service port under each traffic policy, with the ready -> serving-terminating
//! fallback and topology hints.

use std::collections::BTreeMap;

use super::{Endpoint, ServicePortInfo};

/// The outcome for one IP family of one service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// `None` when the port never uses Cluster policy.
    pub cluster: Option<Vec<Endpoint>>,
    /// `None` when the port never uses Local policy.
    pub local: Option<Vec<Endpoint>>,
    /// Union of the two, sorted by address.
    pub all_reachable: Vec<Endpoint>,
    /// Some usable endpoint exists somewhere in the cluster (even if none is
    /// reachable from here, e.g. iTP=Local with only remote endpoints).
    pub has_any: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyMode {
    None,
    PreferSameZone,
    PreferSameNode,
}

/// `endpoints` must all be of one IP family. `zone` is this node's
/// `topology.kubernetes.io/zone` label.
pub fn categorize_endpoints(
    endpoints: &[Endpoint],
    svc: &ServicePortInfo,
    node_name: &str,
    zone: Option<&str>,
) -> Categorized {
    let mut out = Categorized::default();
    if endpoints.is_empty() {
        return out;
    }
    let zone = zone.unwrap_or("");

    if svc.uses_cluster_endpoints() {
        let mode = topology_mode(endpoints, node_name, zone);
        let mut cluster: Vec<Endpoint> = endpoints
            .iter()
            .filter(|ep| ep.ready && available(ep, mode, node_name, zone))
            .cloned()
            .collect();
        // Topology was already dropped if it left no ready endpoint, so an empty list
        // here means nothing is ready anywhere: fall back to serving-terminating.
        if cluster.is_empty() {
            cluster = endpoints
                .iter()
                .filter(|ep| ep.is_serving_terminating())
                .cloned()
                .collect();
        }
        out.has_any = !cluster.is_empty();
        out.cluster = Some(cluster);
    }

    if !svc.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone().unwrap_or_default();
        return out;
    }

    let (mut local_ready, mut local_serving_terminating) = (false, false);
    for ep in endpoints {
        if ep.ready {
            out.has_any = true;
            local_ready |= ep.is_local;
        } else if ep.is_serving_terminating() {
            out.has_any = true;
            local_serving_terminating |= ep.is_local;
        }
    }
    let local: Vec<Endpoint> = if local_ready {
        endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.ready)
            .cloned()
            .collect()
    } else if local_serving_terminating {
        endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.is_serving_terminating())
            .cloned()
            .collect()
    } else {
        Vec::new()
    };

    out.all_reachable = match &out.cluster {
        None => local.clone(),
        Some(cluster) => {
            let mut union: BTreeMap<String, &Endpoint> = BTreeMap::new();
            for ep in cluster.iter().chain(&local) {
                union.insert(ep.to_string(), ep);
            }
            let mut all: Vec<Endpoint> = union.into_values().cloned().collect();
            all.sort();
            all
        }
    };
    out.local = Some(local);
    out
}

/// PreferSameNode when every ready endpoint carries node hints and one names
/// this node; else PreferSameZone likewise for zones; else no topology.
fn topology_mode(endpoints: &[Endpoint], node_name: &str, zone: &str) -> TopologyMode {
    let mut any_ready = false;
    let (mut all_node_hints, mut hinted_for_node) = (true, false);
    let (mut all_zone_hints, mut hinted_for_zone) = (true, false);
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        any_ready = true;
        if ep.node_hints().is_empty() {
            all_node_hints = false;
        } else if ep.node_hints().iter().any(|n| n == node_name) {
            hinted_for_node = true;
        }
        if ep.zone_hints().is_empty() {
            all_zone_hints = false;
        } else if ep.zone_hints().iter().any(|z| z == zone) {
            hinted_for_zone = true;
        }
    }
    if !any_ready {
        TopologyMode::None
    } else if all_node_hints && hinted_for_node {
        TopologyMode::PreferSameNode
    } else if all_zone_hints && hinted_for_zone {
        TopologyMode::PreferSameZone
    } else {
        TopologyMode::None
    }
}

fn available(ep: &Endpoint, mode: TopologyMode, node_name: &str, zone: &str) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => ep.node_hints().iter().any(|n| n == node_name),
        TopologyMode::PreferSameZone => ep.zone_hints().iter().any(|z| z == zone),
    }
}
