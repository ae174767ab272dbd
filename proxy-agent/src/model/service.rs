//! Service -> one [`ServicePortInfo`] per service port (upstream `serviceport.go`
//! and `servicechangetracker.go`'s `serviceToServiceMap`).

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use super::{IpFamily, NamespacedName, Protocol, ServicePortName};

/// All ports of one service, sorted by key. A Vec, not a map: services have
/// few ports and a BTreeMap node per service costs kilobytes at 10k services.
pub type ServicePorts = Vec<(ServicePortName, ServicePortInfo)>;

/// Upstream's default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SessionAffinity {
    #[default]
    None,
    ClientIp {
        timeout_seconds: u32,
    },
}

/// The annotation choosing a service's backend selection in ebpf mode
/// (per service, as Calico's `lb.projectcalico.org/external-traffic-strategy`).
pub const BALANCING_ANNOTATION: &str = "kube-ebpf-proxy.io/lb-algorithm";

/// How a service asks to be balanced ([`BALANCING_ANNOTATION`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Balancing {
    /// The configured `loadBalancing.algorithm`.
    #[default]
    Configured,
    Random,
    Maglev,
}

/// What upstream's `BaseServicePortInfo` holds, for both IP families at once.
///
/// Addresses of a family the service has no cluster IP in are dropped, as a
/// per-family upstream proxier never sees them. Within a family, an empty
/// `load_balancer_source_ranges` means "no restriction" (upstream filters the
/// ranges per family the same way).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePortInfo {
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// Status ingress IPs in VIP mode (`ipMode` unset or `VIP`).
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    pub session_affinity: SessionAffinity,
    pub balancing: Balancing,
    /// `externalTrafficPolicy: Local` on a NodePort/LoadBalancer service.
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// Kept on the port so the slice side can treat every endpoint as ready,
    /// as the EndpointSlice controller does for API-sourced slices.
    pub publish_not_ready_addresses: bool,
}

impl ServicePortInfo {
    /// Reachable through something other than its cluster IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.load_balancer_ips.is_empty()
            || !self.external_ips.is_empty()
    }

    /// Even with eTP=Local, cluster endpoints are needed for short-circuiting.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    pub fn families(&self) -> impl Iterator<Item = IpFamily> + '_ {
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| self.cluster_ips.iter().any(|ip| IpFamily::of(ip) == *f))
    }
}

/// The namespace/name of an object, `default` standing in for a missing namespace
/// (manifests often omit it).
pub fn service_name(svc: &Service) -> Option<NamespacedName> {
    let name = svc.metadata.name.as_deref()?;
    Some(NamespacedName::new(
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        name,
    ))
}

/// The service's [`BALANCING_ANNOTATION`]; another value than `random` or
/// `maglev` is ignored with a warning, as upstream ignores annotations it
/// cannot parse.
fn balancing(svc: &Service, name: &NamespacedName) -> Balancing {
    let Some(value) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BALANCING_ANNOTATION))
    else {
        return Balancing::Configured;
    };
    match value.trim() {
        "random" => Balancing::Random,
        "maglev" => Balancing::Maglev,
        other => {
            tracing::warn!(
                service = %name,
                annotation = BALANCING_ANNOTATION,
                value = other,
                "ignoring the annotation: not one of random, maglev"
            );
            Balancing::Configured
        }
    }
}

/// Upstream's `ShouldSkipService` plus the per-port translation. Headless,
/// ExternalName and cluster-IP-less services map to no ports at all.
pub fn service_ports(svc: &Service) -> ServicePorts {
    let mut out = ServicePorts::new();
    let (Some(nn), Some(spec)) = (service_name(svc), svc.spec.as_ref()) else {
        return out;
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return out;
    }
    let raw_ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if raw_ips.contains(&"None") {
        return out;
    }
    let cluster_ips: Vec<IpAddr> = raw_ips
        .iter()
        .filter_map(|ip| ip.trim().parse().ok())
        .collect();
    if cluster_ips.is_empty() {
        return out;
    }
    let has_family = |ip: &IpAddr| {
        cluster_ips
            .iter()
            .any(|c| IpFamily::of(c) == IpFamily::of(ip))
    };

    let node_facing = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let external_policy_local =
        node_facing && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let session_affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => SessionAffinity::ClientIp {
            timeout_seconds: spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
        },
        _ => SessionAffinity::None,
    };
    let balancing = balancing(svc, &nn);
    let external_ips: Vec<IpAddr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.trim().parse().ok())
        .filter(has_family)
        .collect();
    // Validation lets whitespace through in source ranges; upstream trims it too.
    let load_balancer_source_ranges: Vec<IpNet> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|r| r.trim().parse::<IpNet>().ok())
        .filter(|net| has_family(&net.addr()))
        .collect();
    let load_balancer_ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|ing| ing.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
        .filter_map(|ing| ing.ip.as_deref()?.parse().ok())
        .filter(has_family)
        .collect();
    let health_check_node_port = (spec.type_.as_deref() == Some("LoadBalancer")
        && external_policy_local)
        .then(|| {
            spec.health_check_node_port
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0)
        })
        .flatten();
    let publish_not_ready_addresses = spec.publish_not_ready_addresses.unwrap_or(false);

    for port in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
            continue;
        };
        let Ok(port_number) = u16::try_from(port.port) else {
            continue;
        };
        let spn = ServicePortName::new(&nn, port.name.clone().unwrap_or_default(), protocol);
        out.push((
            spn,
            ServicePortInfo {
                cluster_ips: cluster_ips.clone(),
                port: port_number,
                protocol,
                node_port: port
                    .node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0),
                external_ips: external_ips.clone(),
                load_balancer_ips: load_balancer_ips.clone(),
                load_balancer_source_ranges: load_balancer_source_ranges.clone(),
                session_affinity,
                balancing,
                external_policy_local,
                internal_policy_local,
                health_check_node_port,
                publish_not_ready_addresses,
            },
        ));
    }
    // API validation forbids duplicate name/protocol pairs; manifests might not.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    // Kept for the agent's life: no growth slack (a first push makes room for four).
    out.shrink_to_fit();
    out
}
