//! Service + EndpointSlice + Node -> [`DesiredState`].

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName};

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Builds the desired state from the current objects. `node_name` decides
/// which endpoints are local.
pub fn build_desired_state(
    services: &[Service],
    slices: &[EndpointSlice],
    node_name: &str,
) -> DesiredState {
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(svc) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        {
            by_service
                .entry((ns, svc.as_str()))
                .or_default()
                .push(slice);
        }
    }

    let mut state = DesiredState::default();
    for svc in services {
        let (Some(name), Some(spec)) = (svc.metadata.name.as_deref(), svc.spec.as_ref()) else {
            continue;
        };
        let namespace = svc.metadata.namespace.as_deref().unwrap_or("default");
        let cluster_ips: Vec<IpAddr> = spec
            .cluster_ips
            .clone()
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default()
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if cluster_ips.is_empty() {
            continue; // headless or ExternalName: nothing to program
        }
        let slices = by_service
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
                continue;
            };
            let port_name = port.name.clone().unwrap_or_default();
            let spn = ServicePortName {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                port_name,
                protocol,
            };
            let endpoints = endpoints_for(&spn, slices, node_name);
            state.services.insert(
                spn.clone(),
                DesiredService {
                    name: spn,
                    cluster_ips: cluster_ips.clone(),
                    port: port.port as u16,
                    protocol,
                    cluster_endpoints: endpoints,
                },
            );
        }
    }
    state
}

fn endpoints_for(
    spn: &ServicePortName,
    slices: &[&EndpointSlice],
    node_name: &str,
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for slice in slices {
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == spn.port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(spn.protocol)
        }) else {
            continue;
        };
        let Some(port_number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            let cond = ep.conditions.as_ref();
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            if !ready {
                continue;
            }
            for addr in &ep.addresses {
                let Ok(ip) = addr.parse() else { continue };
                out.push(Endpoint {
                    ip,
                    port: port_number,
                    ready,
                    serving,
                    terminating,
                    node_name: ep.node_name.clone(),
                    zone: ep.zone.clone(),
                    is_local: ep.node_name.as_deref() == Some(node_name),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
