//! The frontend a packet addresses, as the programmed `SERVICES` map holds
//! it, and (offline, where the model is at hand) the service port behind it.

use std::{collections::BTreeMap, net::IpAddr};

use proxy_common::{FrontendKind, ServiceKey, ServiceKey6, ServiceValue, service::flags};

use super::probe::Probe;
use crate::{
    model::DesiredState,
    modes::ebpf::{KernelMaps, family::AgentFamily as _},
};

/// Service port names by frontend (address, port, IP protocol).
pub type Names = BTreeMap<(IpAddr, u16, u8), String>;

/// Every frontend of `desired` the way the programmer writes them: cluster,
/// external and load-balancer IPs on the service port, node ports on
/// `node_ports`, in both families.
pub fn names(desired: &DesiredState, node_ports: &[IpAddr]) -> Names {
    let mut out = Names::new();
    for svc in desired.services.values() {
        let proto = svc.protocol.ip_proto();
        let name = svc.name.to_string();
        for ip in svc
            .cluster_ips
            .iter()
            .chain(&svc.external_ips)
            .chain(&svc.load_balancer_ips)
        {
            out.insert((*ip, svc.port, proto), name.clone());
        }
        if let Some(port) = svc.node_port {
            for ip in node_ports {
                out.insert((*ip, port, proto), name.clone());
            }
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    pub kind: FrontendKind,
    /// The service port (offline only).
    pub service: Option<String>,
    /// Backend slots of the frontend's primary scope: this node's endpoints
    /// when the policy is Local, every endpoint otherwise.
    pub endpoints: u16,
    pub policy_local: bool,
    pub source_ranges: bool,
    pub service_id: u32,
    /// `sessionAffinity: ClientIP`'s timeout; `None`: no affinity.
    pub affinity_timeout_s: Option<u32>,
}

impl Frontend {
    /// The field that decides the policy for this kind of frontend.
    pub fn policy_field(&self) -> &'static str {
        match self.kind {
            FrontendKind::ClusterIp => "internalTrafficPolicy",
            _ => "externalTrafficPolicy",
        }
    }

    pub fn policy(&self) -> &'static str {
        if self.policy_local {
            "Local"
        } else {
            "Cluster"
        }
    }
}

/// The frontend `probe` addresses, if the maps have one.
pub fn lookup(maps: &KernelMaps, names: &Names, probe: &Probe) -> Option<Frontend> {
    let (port_be, proto) = (probe.dport.to_be(), probe.proto.number());
    let value: ServiceValue = match probe.dst {
        IpAddr::V4(ip) => {
            let key = ServiceKey::frontend(proxy_common::V4::to_be(ip), port_be, proto);
            maps.services.get(&key, 0).ok()?
        }
        IpAddr::V6(ip) => {
            let key = ServiceKey6::frontend(proxy_common::V6::to_be(ip), port_be, proto);
            maps.v6.services.get(&key, 0).ok()?
        }
    };
    if value.has(flags::CLUSTER_IP_MARKER) {
        return None;
    }
    Some(Frontend {
        kind: value.kind(),
        service: names
            .get(&(probe.dst, probe.dport, probe.proto.number()))
            .cloned(),
        endpoints: value.count,
        policy_local: value.has(flags::POLICY_LOCAL),
        source_ranges: value.has(flags::SOURCE_RANGES),
        service_id: value.service_id,
        affinity_timeout_s: value.has(flags::AFFINITY).then_some(value.backend_id),
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::model::{DesiredService, Protocol, ServicePortName};

    #[test]
    fn names_cover_every_frontend_kind() {
        let mut svc = DesiredService::cluster_ip(
            ServicePortName {
                namespace: "ns".into(),
                name: "web".into(),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
            },
            vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))],
            80,
            vec![],
        );
        svc.node_port = Some(30080);
        svc.cluster_ips.push("2001:db8:ffff::1".parse().unwrap());
        svc.external_ips = vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 30))];
        svc.load_balancer_ips = vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 20))];
        let desired = DesiredState {
            services: [(svc.name.clone(), svc)].into_iter().collect(),
            ..DesiredState::default()
        };
        let n = names(
            &desired,
            &[[192, 0, 2, 1].into(), "2001:db8::1".parse().unwrap()],
        );
        let keys: Vec<_> = n
            .keys()
            .map(|(ip, port, _)| (ip.to_string(), *port))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("10.96.0.1".to_string(), 80),
                ("192.0.2.1".to_string(), 30080),
                ("192.0.2.20".to_string(), 80),
                ("192.0.2.30".to_string(), 80),
                ("2001:db8::1".to_string(), 30080),
                ("2001:db8:ffff::1".to_string(), 80),
            ]
        );
        assert!(n.values().all(|v| v == "ns/web:http/TCP"));
    }
}
