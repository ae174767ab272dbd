//! The IPVS virtual servers of a node from the model, as upstream's ipvs
//! proxier (`pkg/proxy/ipvs/proxier.go`) makes them: one per cluster IP,
//! external IP, load-balancer IP and NodePort address of each service port,
//! with the configured scheduler, persistence for ClientIP affinity, and as
//! real servers (weight 1) the endpoints the traffic policy allows
//! (internal for the cluster IP, external for the rest). As upstream's,
//! a Local policy without local endpoints falls back to the cluster's
//! endpoints (kubernetes#97081: pods on the node still reach the service).
//! Removed endpoints drain in `reconcile`. Pure.

use std::net::{IpAddr, SocketAddr};

use crate::model::{DesiredService, DesiredState, Endpoint, IpFamily, Protocol, SessionAffinity};

/// Which address of the service a virtual server answers on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Frontend {
    ClusterIp,
    ExternalIp,
    LoadBalancer,
    NodePort,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RealServer {
    pub address: SocketAddr,
    /// 1, or 0 while a removed endpoint drains its connections.
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub frontend: Frontend,
    pub scheduler: String,
    /// ClientIP affinity: persistence for this many seconds.
    pub persistence_s: Option<u32>,
    pub reals: Vec<RealServer>,
}

impl VirtualServer {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.address)
    }
}

/// Upstream's default when `ipvs.scheduler` is blank.
pub const DEFAULT_SCHEDULER: &str = "rr";

/// Every virtual server of `family` for `desired`.
pub fn virtual_servers(
    desired: &DesiredState,
    family: IpFamily,
    scheduler: &str,
) -> Vec<VirtualServer> {
    let scheduler = if scheduler.is_empty() {
        DEFAULT_SCHEDULER
    } else {
        scheduler
    };
    let node_port_ips: Vec<IpAddr> = desired
        .node
        .node_port_addresses
        .iter()
        .copied()
        .filter(|a| IpFamily::of(a) == family && !a.is_loopback())
        .collect();
    let mut out = Vec::new();
    for svc in desired.services.values() {
        let Some(cluster_ip) = svc
            .cluster_ips
            .iter()
            .copied()
            .find(|a| IpFamily::of(a) == family)
        else {
            continue;
        };
        let vs = |address: IpAddr, port: u16, frontend: Frontend, eps: &[Endpoint]| VirtualServer {
            address,
            port,
            protocol: svc.protocol,
            frontend,
            scheduler: scheduler.to_owned(),
            persistence_s: persistence(svc),
            reals: reals(eps, family),
        };
        out.push(vs(
            cluster_ip,
            svc.port,
            Frontend::ClusterIp,
            svc.internal_endpoints(),
        ));
        let external = svc.external_endpoints();
        for ip in svc
            .external_ips
            .iter()
            .filter(|a| IpFamily::of(a) == family)
        {
            out.push(vs(*ip, svc.port, Frontend::ExternalIp, external));
        }
        for ip in svc
            .load_balancer_ips
            .iter()
            .filter(|a| IpFamily::of(a) == family)
        {
            out.push(vs(*ip, svc.port, Frontend::LoadBalancer, external));
        }
        if let Some(np) = svc.node_port {
            for ip in &node_port_ips {
                out.push(vs(*ip, np, Frontend::NodePort, external));
            }
        }
    }
    out
}

fn persistence(svc: &DesiredService) -> Option<u32> {
    match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    }
}

fn reals(eps: &[Endpoint], family: IpFamily) -> Vec<RealServer> {
    let mut out: Vec<RealServer> = eps
        .iter()
        .filter(|e| IpFamily::of(&e.ip) == family)
        .map(|e| RealServer {
            address: SocketAddr::new(e.ip, e.port),
            weight: 1,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The virtual servers as `ipvsadm --save -n` prints them, for review.
pub fn render(servers: &[VirtualServer]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for vs in servers {
        let flag = match vs.protocol {
            Protocol::Tcp => "-t",
            Protocol::Udp => "-u",
            Protocol::Sctp => "--sctp-service",
        };
        let addr = SocketAddr::new(vs.address, vs.port);
        let _ = write!(s, "-A {flag} {addr} -s {}", vs.scheduler);
        if let Some(t) = vs.persistence_s {
            let _ = write!(s, " -p {t}");
        }
        s.push('\n');
        for r in &vs.reals {
            let _ = writeln!(s, "-a {flag} {addr} -r {} -m -w {}", r.address, r.weight);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServicePortName;

    fn ep(ip: &str, terminating: bool, is_local: bool) -> Endpoint {
        Endpoint {
            terminating,
            is_local,
            ..Endpoint::new(ip.parse().unwrap(), 8080)
        }
    }

    #[test]
    fn every_frontend_gets_a_virtual_server_with_the_policys_endpoints() {
        let name = ServicePortName {
            namespace: "ns1".into(),
            name: "web".into(),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
        };
        let svc = DesiredService {
            node_port: Some(30080),
            external_ips: vec!["198.18.3.30".parse().unwrap()],
            load_balancer_ips: vec![
                "198.18.3.20".parse().unwrap(),
                "2001:db8:3::20".parse().unwrap(),
            ],
            external_policy_local: true,
            local_endpoints: vec![ep("198.18.1.10", false, true)],
            session_affinity: SessionAffinity::ClientIp {
                timeout_seconds: 600,
            },
            ..DesiredService::cluster_ip(
                name,
                vec!["198.19.0.10".parse().unwrap()],
                80,
                vec![
                    ep("198.18.1.10", false, true),
                    ep("198.18.2.10", true, false),
                ],
            )
        };
        let mut desired = DesiredState::default();
        desired.services.insert(svc.name.clone(), svc);
        desired.node.node_port_addresses = vec![
            "127.0.0.1".parse().unwrap(),
            "198.18.100.1".parse().unwrap(),
        ];
        let v4 = virtual_servers(&desired, IpFamily::V4, "");
        let text = render(&v4);
        assert_eq!(
            text,
            "-A -t 198.19.0.10:80 -s rr -p 600\n\
             -a -t 198.19.0.10:80 -r 198.18.1.10:8080 -m -w 1\n\
             -a -t 198.19.0.10:80 -r 198.18.2.10:8080 -m -w 1\n\
             -A -t 198.18.3.30:80 -s rr -p 600\n\
             -a -t 198.18.3.30:80 -r 198.18.1.10:8080 -m -w 1\n\
             -A -t 198.18.3.20:80 -s rr -p 600\n\
             -a -t 198.18.3.20:80 -r 198.18.1.10:8080 -m -w 1\n\
             -A -t 198.18.100.1:30080 -s rr -p 600\n\
             -a -t 198.18.100.1:30080 -r 198.18.1.10:8080 -m -w 1\n"
        );
        // No IPv6 cluster IP: no IPv6 virtual servers at all, as upstream.
        assert!(virtual_servers(&desired, IpFamily::V6, "sh").is_empty());
    }
}
