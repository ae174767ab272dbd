//! What the oracle knows: the services (as specified, not as programmed)
//! and the flows it saw being created.

use std::{
    collections::{HashMap, HashSet},
    marker::PhantomData,
    net::{IpAddr, SocketAddr},
};

use ipnet::IpNet;
use proxy_agent::{
    cli::packet::{Frame, tcp_flags},
    model::{DesiredService, Endpoint, Protocol, ServicePortName},
};
use proxy_common::proto;

use super::family::{Fam, Topology};

/// Where a service is reached; the oracle's own copy of the frontend kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

/// One service port of the fixture: what is programmed and what the oracle knows.
pub struct Spec<A: 'static> {
    pub name: &'static str,
    pub protocol: Protocol,
    pub vip: A,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ip: Option<A>,
    pub lb_ip: Option<A>,
    pub source_ranges: &'static [&'static str],
    pub etp_local: bool,
    /// (address, port, on this node)
    pub endpoints: Vec<(A, u16, bool)>,
}

impl<A: Copy + Into<IpAddr>> Spec<A> {
    /// A ClusterIP service port, and nothing more.
    pub fn cluster_ip(
        name: &'static str,
        protocol: Protocol,
        vip: A,
        port: u16,
        endpoints: &[(A, u16, bool)],
    ) -> Spec<A> {
        Spec {
            name,
            protocol,
            vip,
            port,
            node_port: None,
            external_ip: None,
            lb_ip: None,
            source_ranges: &[],
            etp_local: false,
            endpoints: endpoints.to_vec(),
        }
    }

    pub fn ip_proto(&self) -> u8 {
        self.protocol.ip_proto()
    }

    fn frontends(&self, node: A) -> Vec<(A, u16, Kind)> {
        let mut out = vec![(self.vip, self.port, Kind::ClusterIp)];
        out.extend(self.node_port.map(|p| (node, p, Kind::NodePort)));
        out.extend(self.external_ip.map(|a| (a, self.port, Kind::ExternalIp)));
        out.extend(self.lb_ip.map(|a| (a, self.port, Kind::LoadBalancer)));
        out
    }

    fn ranges(&self) -> Vec<IpNet> {
        self.source_ranges
            .iter()
            .map(|r| r.parse().unwrap())
            .collect()
    }

    pub fn desired(&self) -> DesiredService {
        let name = ServicePortName {
            namespace: "fuzz".into(),
            name: self.name.into(),
            port_name: self.protocol.to_string().into(),
            protocol: self.protocol,
        };
        let endpoints: Vec<Endpoint> = self
            .endpoints
            .iter()
            .map(|(ip, port, local)| Endpoint {
                is_local: *local,
                ..Endpoint::new((*ip).into(), *port)
            })
            .collect();
        let local = endpoints.iter().filter(|e| e.is_local).cloned().collect();
        DesiredService {
            node_port: self.node_port,
            external_ips: self.external_ip.map(Into::into).into_iter().collect(),
            load_balancer_ips: self.lb_ip.map(Into::into).into_iter().collect(),
            load_balancer_source_ranges: self.ranges(),
            external_policy_local: self.etp_local,
            local_endpoints: local,
            ..DesiredService::cluster_ip(name, vec![self.vip.into()], self.port, endpoints)
        }
    }
}

/// The services of either world, on its node's addresses: every frontend
/// kind, both protocols, local and remote endpoints, none at all, source
/// ranges and externalTrafficPolicy Local.
pub fn services<A: Copy + Into<IpAddr>>(net: &Topology<A>) -> Vec<Spec<A>> {
    let (local_a, local_b) = (net.local_a, net.local_b);
    let (remote_a, remote_b) = (net.remote_a, net.remote_b);
    vec![
        // ClusterIP + NodePort, a local and a remote endpoint.
        Spec {
            node_port: Some(30080),
            ..Spec::cluster_ip(
                "web",
                Protocol::Tcp,
                net.web_vip,
                80,
                &[(local_a, 8080, true), (remote_a, 8080, false)],
            )
        },
        // The same cluster IP, UDP.
        Spec {
            node_port: Some(30053),
            ..Spec::cluster_ip(
                "dns",
                Protocol::Udp,
                net.web_vip,
                53,
                &[(local_b, 5353, true), (remote_b, 5353, false)],
            )
        },
        // An external IP.
        Spec {
            external_ip: Some(net.external_ip),
            ..Spec::cluster_ip(
                "ext",
                Protocol::Tcp,
                net.ext_vip,
                443,
                &[(remote_a, 8443, false), (remote_b, 8443, false)],
            )
        },
        // An LB IP with source ranges, TCP and UDP.
        Spec {
            node_port: Some(30081),
            lb_ip: Some(net.lb_ip),
            source_ranges: net.lb_ranges,
            ..Spec::cluster_ip(
                "lb",
                Protocol::Tcp,
                net.lb_vip,
                80,
                &[(remote_b, 8080, false), (local_a, 8081, true)],
            )
        },
        Spec {
            node_port: Some(30081),
            lb_ip: Some(net.lb_ip),
            source_ranges: net.lb_ranges,
            ..Spec::cluster_ip(
                "lb",
                Protocol::Udp,
                net.lb_vip,
                80,
                &[(remote_b, 8080, false)],
            )
        },
        // No endpoints: rejected, TCP and UDP.
        Spec {
            node_port: Some(30082),
            ..Spec::cluster_ip("empty", Protocol::Tcp, net.empty_vip, 80, &[])
        },
        Spec {
            node_port: Some(30082),
            ..Spec::cluster_ip("empty", Protocol::Udp, net.empty_vip, 80, &[])
        },
        // externalTrafficPolicy Local with a local endpoint, and an LB IP.
        Spec {
            node_port: Some(30083),
            lb_ip: Some(net.local_lb_ip),
            etp_local: true,
            ..Spec::cluster_ip(
                "local",
                Protocol::Tcp,
                net.local_vip,
                80,
                &[(local_a, 9090, true), (remote_a, 9090, false)],
            )
        },
        // externalTrafficPolicy Local with endpoints elsewhere only.
        Spec {
            node_port: Some(30084),
            etp_local: true,
            ..Spec::cluster_ip(
                "elsewhere",
                Protocol::Udp,
                net.elsewhere_vip,
                53,
                &[(remote_b, 9053, false)],
            )
        },
    ]
}

pub fn local_client<F: Fam>(addr: F::Addr) -> bool {
    F::NET
        .pod_cidr
        .parse::<IpNet>()
        .unwrap()
        .contains(&addr.into())
}

/// What the oracle knows of the services: frontends by (address, port, protocol).
pub struct World<F: Fam> {
    pub specs: Vec<Spec<F::Addr>>,
    frontends: HashMap<(F::Addr, u16, u8), (usize, Kind)>,
    pub frontend_list: Vec<(F::Addr, u16, u8)>,
    pub cluster_ips: HashSet<F::Addr>,
    ranges: Vec<Vec<IpNet>>,
    family: PhantomData<F>,
}

impl<F: Fam> World<F> {
    /// The world of [`services`].
    pub fn new() -> Self {
        World::with(services(&F::NET))
    }

    pub fn with(specs: Vec<Spec<F::Addr>>) -> Self {
        let mut frontends = HashMap::new();
        let mut frontend_list = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            for (addr, port, kind) in spec.frontends(F::NET.node) {
                let key = (addr, port, spec.ip_proto());
                assert!(frontends.insert(key, (i, kind)).is_none(), "{key:?} twice");
                frontend_list.push(key);
            }
        }
        World {
            frontends,
            frontend_list,
            cluster_ips: specs.iter().map(|s| s.vip).collect(),
            ranges: specs.iter().map(Spec::ranges).collect(),
            specs,
            family: PhantomData,
        }
    }

    pub fn frontend(&self, t: &Tuple<F::Addr>) -> Option<(usize, Kind)> {
        self.frontends.get(&(t.dst, t.dport, t.proto)).copied()
    }

    pub fn range_denies(&self, spec: usize, kind: Kind, src: F::Addr) -> bool {
        let ranges = &self.ranges[spec];
        kind == Kind::LoadBalancer
            && !ranges.is_empty()
            && !ranges.iter().any(|r| r.contains(&src.into()))
    }

    /// The endpoints a new flow from `client` to this frontend may use.
    pub fn backends(&self, spec: usize, kind: Kind, client: F::Addr) -> Vec<(F::Addr, u16)> {
        let spec = &self.specs[spec];
        let only_local = kind != Kind::ClusterIp && spec.etp_local && !local_client::<F>(client);
        spec.endpoints
            .iter()
            .filter(|(_, _, local)| *local || !only_local)
            .map(|(a, p, _)| (*a, *p))
            .collect()
    }

    /// Whether a flow from `client` through this frontend to `backend` leaves with the node's address.
    pub fn masquerades(&self, spec: usize, kind: Kind, client: F::Addr, backend: F::Addr) -> bool {
        backend == client
            || match kind {
                Kind::ClusterIp => !local_client::<F>(client),
                _ => !self.specs[spec].etp_local,
            }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple<A> {
    pub src: A,
    pub sport: u16,
    pub dst: A,
    pub dport: u16,
    pub proto: u8,
}

impl<A: Copy> Tuple<A> {
    pub fn reversed(&self) -> Tuple<A> {
        Tuple {
            src: self.dst,
            sport: self.dport,
            dst: self.src,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

impl<A: Copy + Into<IpAddr>> Tuple<A> {
    /// The shared frame builder's view of this tuple.
    pub fn frame(&self) -> Frame {
        Frame {
            src: self.src.into(),
            dst: self.dst.into(),
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
        }
    }
}

impl<A: Copy + Into<IpAddr>> std::fmt::Display for Tuple<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.proto {
            proto::TCP => "tcp",
            proto::UDP => "udp",
            _ => "?",
        };
        let src = SocketAddr::new(self.src.into(), self.sport);
        let dst = SocketAddr::new(self.dst.into(), self.dport);
        write!(f, "{p} {src} -> {dst}")
    }
}

/// The flows the oracle saw being created. Timeouts are an hour and the
/// conntrack table is sized so nothing is evicted: every flow stays live.
pub struct Model<A> {
    /// A reply as it arrives (backend -> client or masquerade address) ->
    /// the tuple it must leave with (frontend -> client).
    pub replies: HashMap<Tuple<A>, Tuple<A>>,
    pub reply_keys: Vec<Tuple<A>>,
    /// A client's tuple -> the tuple it was translated to.
    pub forwards: HashMap<Tuple<A>, Tuple<A>>,
    pub forward_keys: Vec<Tuple<A>>,
    /// Masqueraded flows by backend (address, port, protocol).
    pub masqueraded: HashMap<(A, u16, u8), usize>,
    /// TCP flows (by reply tuple) the datapath may hold closed: a RST or a
    /// FIN of each direction went through them (`CLOSED_*` bits). Only such
    /// a flow's reply tuple may be taken over by a masquerade port claim
    /// that found no free one, as the kernel's NAT evicts TIME_WAIT.
    pub closing: HashMap<Tuple<A>, u8>,
}

impl<A> Default for Model<A> {
    fn default() -> Self {
        Model {
            replies: HashMap::new(),
            reply_keys: Vec::new(),
            forwards: HashMap::new(),
            forward_keys: Vec::new(),
            masqueraded: HashMap::new(),
            closing: HashMap::new(),
        }
    }
}

const CLOSED_RST: u8 = 1;
const CLOSED_FIN_FORWARD: u8 = 2;
const CLOSED_FIN_REPLY: u8 = 4;

impl<A: Copy + Eq + std::hash::Hash> Model<A> {
    /// Notes the FIN or RST of a packet of the TCP flow whose reply tuple
    /// is `key`, sent by its client (`forward`) or its backend.
    pub fn note_closing(&mut self, key: Tuple<A>, tcp_flags: u8, forward: bool) {
        if key.proto != proto::TCP {
            return;
        }
        let bits = if tcp_flags & tcp_flags::RST != 0 {
            CLOSED_RST
        } else if tcp_flags & tcp_flags::FIN != 0 {
            if forward {
                CLOSED_FIN_FORWARD
            } else {
                CLOSED_FIN_REPLY
            }
        } else {
            return;
        };
        *self.closing.entry(key).or_default() |= bits;
    }

    /// The flow of client tuple `t`, translated to `to`.
    pub fn add_forward(&mut self, t: Tuple<A>, to: Tuple<A>) {
        if self.forwards.insert(t, to).is_none() {
            self.forward_keys.push(t);
        }
    }

    /// The flow of client tuple `t` as the datapath drops it when a SYN
    /// replaces it: its forward half, and its reply half while still its own.
    pub fn forget(&mut self, t: &Tuple<A>) {
        let Some(prev) = self.forwards.remove(t) else {
            return;
        };
        if let Some(at) = self.forward_keys.iter().position(|k| k == t) {
            self.forward_keys.swap_remove(at);
        }
        let key = prev.reversed();
        if self.replies.get(&key) == Some(&t.reversed()) {
            self.replies.remove(&key);
            self.closing.remove(&key);
        }
    }

    pub fn may_be_closed(&self, key: &Tuple<A>) -> bool {
        self.closing.get(key).is_some_and(|&bits| {
            bits & CLOSED_RST != 0 || bits & (CLOSED_FIN_FORWARD | CLOSED_FIN_REPLY) == 6
        })
    }

    /// The other flow holding the reply tuple `t` would have to `backend`
    /// without a translated source: one whose replies come back on it (as it
    /// leaves, frontend -> client), or one whose client sends on it.
    pub fn clash(&self, t: &Tuple<A>, (addr, port): (A, u16)) -> Option<Tuple<A>> {
        let plain = Tuple {
            src: addr,
            sport: port,
            dst: t.src,
            dport: t.sport,
            proto: t.proto,
        };
        // Another flow's own tuple (its client is this flow's backend) holds
        // the tuple as surely as a reply does.
        if plain != *t && self.forwards.contains_key(&plain) {
            return Some(plain);
        }
        self.replies
            .get(&plain)
            .copied()
            .filter(|m| *m != t.reversed())
    }
}
