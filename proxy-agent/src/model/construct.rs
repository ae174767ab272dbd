//! Plain constructors with upstream's defaults, for code that builds model
//! values directly (datapath tests, fixtures, tools) rather than from API objects.

use std::net::IpAddr;

use super::{DesiredService, Endpoint, FamilySet, ServicePortName};

impl Endpoint {
    /// A ready, serving endpoint on no particular node.
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Endpoint {
            ip,
            port,
            ready: true,
            serving: true,
            ..Default::default()
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
            has_any_endpoints,
            ..Default::default()
        }
    }
}
