//! Plain constructors with upstream's defaults, for code that builds model
//! values directly (datapath tests, fixtures, tools) rather than from API objects.

use std::net::IpAddr;

use super::{DesiredService, Endpoint, FamilySet, ServicePortName, SessionAffinity};

impl Endpoint {
    /// A ready, serving endpoint on no particular node.
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Endpoint {
            ip,
            port,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            is_local: false,
            zone_hints: Vec::new(),
            node_hints: Vec::new(),
        }
    }
}

impl DesiredService {
    /// A ClusterIP service port with Cluster traffic policies and no affinity.
    pub fn cluster_ip(
        name: ServicePortName,
        cluster_ips: Vec<IpAddr>,
        port: u16,
        endpoints: Vec<Endpoint>,
    ) -> Self {
        let has_any_endpoints = FamilySet {
            v4: endpoints.iter().any(|e| e.ip.is_ipv4()),
            v6: endpoints.iter().any(|e| e.ip.is_ipv6()),
        };
        DesiredService {
            protocol: name.protocol,
            name,
            cluster_ips,
            port,
            cluster_endpoints: endpoints,
            local_endpoints: Vec::new(),
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity: SessionAffinity::None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            has_any_endpoints,
        }
    }
}
