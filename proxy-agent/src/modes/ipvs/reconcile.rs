//! From the virtual servers the kernel holds to the wanted ones: the IPVS
//! operations upstream's ipvs proxier performs (`syncService`,
//! `syncEndpoint`, `cleanLegacyService`), with its graceful termination: a
//! real server that is no longer wanted keeps serving its TCP connections
//! with weight 0 and goes once it has none; UDP and SCTP ones go at once
//! (`expire_nodest_conn` ends their flows). Pure.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use super::virtual_servers::{RealServer, VirtualServer};
use crate::model::Protocol;

/// A real server as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedReal {
    pub real: RealServer,
    /// Active plus inactive connections.
    pub connections: u32,
}

/// A virtual server as the kernel reports it, with its real servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub server: VirtualServer,
    pub reals: Vec<AppliedReal>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    AddService(VirtualServer),
    UpdateService(VirtualServer),
    DeleteService(VirtualServer),
    AddReal(VirtualServer, RealServer),
    UpdateReal(VirtualServer, RealServer),
    DeleteReal(VirtualServer, RealServer),
}

type Key = (IpAddr, u16, Protocol);

fn key(vs: &VirtualServer) -> Key {
    (vs.address, vs.port, vs.protocol)
}

/// The operations, in order: services added or updated with their real
/// servers, then the virtual servers no longer wanted deleted.
pub fn reconcile(current: &[Applied], wanted: &[VirtualServer]) -> Vec<Op> {
    let have: BTreeMap<Key, &Applied> = current.iter().map(|a| (key(&a.server), a)).collect();
    let mut ops = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for vs in wanted {
        if !seen.insert(key(vs)) {
            continue;
        }
        let existing = have.get(&key(vs));
        match existing {
            None => ops.push(Op::AddService(vs.clone())),
            Some(a)
                if a.server.scheduler != vs.scheduler
                    || a.server.persistence_s != vs.persistence_s =>
            {
                ops.push(Op::UpdateService(vs.clone()))
            }
            Some(_) => {}
        }
        let applied: BTreeMap<SocketAddr, &AppliedReal> = existing
            .map(|a| a.reals.iter().map(|r| (r.real.address, r)).collect())
            .unwrap_or_default();
        for r in &vs.reals {
            match applied.get(&r.address) {
                None => ops.push(Op::AddReal(vs.clone(), r.clone())),
                // Back from graceful termination, or reweighted.
                Some(a) if a.real.weight != r.weight => {
                    ops.push(Op::UpdateReal(vs.clone(), r.clone()))
                }
                Some(_) => {}
            }
        }
        for (addr, a) in &applied {
            if vs.reals.iter().any(|r| r.address == *addr) {
                continue;
            }
            let drains = vs.protocol == Protocol::Tcp && a.connections > 0;
            if !drains {
                ops.push(Op::DeleteReal(vs.clone(), a.real.clone()));
            } else if a.real.weight != 0 {
                ops.push(Op::UpdateReal(
                    vs.clone(),
                    RealServer {
                        address: *addr,
                        weight: 0,
                    },
                ));
            }
        }
    }
    for a in current {
        if !seen.contains(&key(&a.server)) {
            ops.push(Op::DeleteService(a.server.clone()));
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::ipvs::virtual_servers::Frontend;

    fn vs(protocol: Protocol, reals: &[&str]) -> VirtualServer {
        VirtualServer {
            address: "198.19.0.10".parse().unwrap(),
            port: 80,
            protocol,
            frontend: Frontend::ClusterIp,
            scheduler: "rr".into(),
            persistence_s: None,
            reals: reals
                .iter()
                .map(|r| RealServer {
                    address: r.parse().unwrap(),
                    weight: 1,
                })
                .collect(),
        }
    }

    fn applied(v: &VirtualServer, conns: &[(&str, u32, u32)]) -> Applied {
        Applied {
            server: VirtualServer {
                reals: Vec::new(),
                ..v.clone()
            },
            reals: conns
                .iter()
                .map(|(a, weight, connections)| AppliedReal {
                    real: RealServer {
                        address: a.parse().unwrap(),
                        weight: *weight,
                    },
                    connections: *connections,
                })
                .collect(),
        }
    }

    #[test]
    fn a_leaving_tcp_backend_drains_with_weight_zero_then_goes() {
        let want = vs(Protocol::Tcp, &["198.18.2.10:8080"]);
        let with_conns = applied(
            &want,
            &[("198.18.2.10:8080", 1, 0), ("198.18.2.11:8080", 1, 3)],
        );
        let ops = reconcile(&[with_conns], std::slice::from_ref(&want));
        assert_eq!(
            ops,
            vec![Op::UpdateReal(
                want.clone(),
                RealServer {
                    address: "198.18.2.11:8080".parse().unwrap(),
                    weight: 0
                }
            )]
        );
        // Drained: deleted. Still draining at weight 0: nothing to do.
        let drained = applied(
            &want,
            &[("198.18.2.10:8080", 1, 0), ("198.18.2.11:8080", 0, 0)],
        );
        assert!(
            matches!(reconcile(&[drained], std::slice::from_ref(&want))[..], [Op::DeleteReal(_, ref r)] if r.address.port() == 8080 && r.weight == 0)
        );
        let draining = applied(
            &want,
            &[("198.18.2.10:8080", 1, 0), ("198.18.2.11:8080", 0, 2)],
        );
        assert!(reconcile(&[draining], std::slice::from_ref(&want)).is_empty());
        // Back before it drained: weight 1 again.
        let back = vs(Protocol::Tcp, &["198.18.2.10:8080", "198.18.2.11:8080"]);
        let draining = applied(
            &want,
            &[("198.18.2.10:8080", 1, 0), ("198.18.2.11:8080", 0, 2)],
        );
        assert!(
            matches!(reconcile(&[draining], &[back])[..], [Op::UpdateReal(_, ref r)] if r.weight == 1)
        );
    }

    #[test]
    fn udp_backends_go_at_once_and_unwanted_services_are_deleted() {
        let want = vs(Protocol::Udp, &[]);
        let current = applied(&want, &[("198.18.2.11:8080", 1, 5)]);
        let mut other = vs(Protocol::Tcp, &[]);
        other.port = 81;
        let ops = reconcile(
            &[current, applied(&other, &[])],
            std::slice::from_ref(&want),
        );
        assert!(matches!(ops[0], Op::DeleteReal(..)));
        assert_eq!(ops[1], Op::DeleteService(other));
        // A new service and its real server; a changed scheduler updates.
        let fresh = vs(Protocol::Tcp, &["198.18.2.10:8080"]);
        assert!(matches!(
            reconcile(&[], std::slice::from_ref(&fresh))[..],
            [Op::AddService(_), Op::AddReal(..)]
        ));
        let mut sh = fresh.clone();
        sh.scheduler = "sh".into();
        let now = applied(&fresh, &[("198.18.2.10:8080", 1, 0)]);
        assert_eq!(
            reconcile(&[now], std::slice::from_ref(&sh)),
            vec![Op::UpdateService(sh)]
        );
    }
}
