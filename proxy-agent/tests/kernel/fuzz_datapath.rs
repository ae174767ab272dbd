//! Fuzzing every datapath program (`tc_from_pod`, `tc_from_netdev`,
//! `xdp_from_netdev`) through BPF_PROG_TEST_RUN: seeded random frames (pure
//! garbage, service requests, replies of live flows, ICMP errors quoting
//! them, VLAN / IPv6 / ARP frames) and mutations of them (truncated, wrong
//! lengths, IP options, fragments, every TCP flag combination, bad
//! checksums) go through the real programs with the real maps, programmed by
//! the agent's own `Programmer` and `NodeProgrammer`. Every outcome is
//! judged by an oracle that knows only the fixture's services and the flows
//! it saw being created, not the datapath's code:
//!
//! - the action is one the hook allows and the test run never fails (but
//!   for the frames the kernel refuses to run: shorter than an Ethernet
//!   header, or for TC than an IPv4 / IPv6 header);
//! - a new destination is an endpoint of the service whose frontend the
//!   packet was sent to (with that service's traffic policy, masquerade and
//!   source ranges applied), with checksums as valid as they came in, and
//!   only addresses, ports, checksums, TTL and MACs changed;
//! - a source rewritten to a frontend is the reply of a flow forwarded
//!   earlier in the run, translated back to exactly that flow's client,
//!   and a new flow never takes a live flow's reply tuple;
//! - a reject (TCP RST, ICMP port unreachable) answers only a service
//!   without endpoints or an unused port of a cluster IP, and is well made;
//! - a drop has a reason the service gives (source ranges, no local
//!   endpoint, masquerade ports crowded, a reject that cannot be built);
//! - anything else leaves untouched (or, malformed, is dropped).
//!
//! Timeouts are an hour and the conntrack table holds every flow of the
//! run, so the oracle's model of the flows stays exact. The regression
//! cases at the end are what the fuzzer found, minimised.
//!
//! Each program gets its own object, maps and network namespace (one
//! `unshare` per test thread: a node with an external veth and a pod veth,
//! neighbours and routes for the FIB lookups; addresses from 198.18.0.0/15).
//! The XDP program's `XDP_PASS` goes on to `tc_from_netdev` of the same
//! maps, as in the kernel, so flows XDP created without finishing are seen.
//!
//! `KUBE_EBPF_PROXY_FUZZ_PACKETS=N` sets the packets per program (default
//! 20,000); `KUBE_EBPF_PROXY_FUZZ_SEED` the seed. `cargo xtask fuzz` runs a
//! million per program. Needs root.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

use aya::Ebpf;

use crate::tester::{ifindex, ip, mac_str};
use ipnet::{IpNet, Ipv4Net};
use proxy_agent::{
    cli::packet::{self, ETH_HLEN, Frame, IPV4_HLEN, checksums_valid, tcp_flags},
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        self, KernelMaps, MapSizes, NodeFacts, NodeProgrammer, Programmer,
        node::{NodeAddresses, SNAT_PORT_MAX, SNAT_PORT_MIN},
        test_run::{self, Hook, Outcome},
    },
};
use proxy_common::{
    DatapathConfig, IfaceInfo,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP, XDP_PASS, XDP_TX},
    config::{flags, iface},
    proto,
};

const PACKETS_VAR: &str = "KUBE_EBPF_PROXY_FUZZ_PACKETS";
const SEED_VAR: &str = "KUBE_EBPF_PROXY_FUZZ_SEED";
const DEFAULT_PACKETS: u64 = 20_000;
const DEFAULT_SEED: u64 = 0x6b75_6265_7072_7879;
/// The datapath bug the (ignored) regression cases at the end document: a
/// new flow without masquerade whose reply tuple a live flow already uses
/// overwrites that flow's reply state. Counted and shown, not failed, until
/// the fix lands; then this turns false.
const REPLY_TUPLE_CLASH_KNOWN: bool = false;
/// Violations of each invariant kept in full for the report (all are counted).
const KEPT_PER_INVARIANT: u64 = 3;
/// Masqueraded flows to one backend past which a failed SNAT port claim
/// (8 random tries) is plausible: 10% of the 4,536 ports.
const SNAT_PRESSURE: usize = 454;
const HOUR_NS: u64 = 3_600_000_000_000;

// The node: one-armed on ext0 (198.18.0.0/24, the peer node routes the
// remote pods 198.18.2.0/24), this node's pods behind pod0 (198.18.1.0/24).
const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER_NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// A client on the lan with a neighbour entry, inside the LB source range.
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// A client on the lan without a neighbour entry (FIB: no neighbour).
const STRANGER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
/// A client no route leads to (FIB: unreachable).
const FAR_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 9, 9);
const POD_GW: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
const LOCAL_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const LOCAL_B: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 12);
const REMOTE_A: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
const REMOTE_B: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 11);
const POD_CIDR: &str = "198.18.1.0/24";

const EXT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x01];
/// Permanent neighbours: (address, MAC, on the pod side).
const NEIGHBOURS: [(Ipv4Addr, [u8; 6], bool); 5] = [
    (PEER_NODE, [0x02, 0, 0, 0, 0, 0x22], false),
    (CLIENT, [0x02, 0, 0, 0, 0, 0x64], false),
    (LOCAL_A, [0x02, 0, 0, 0, 1, 0x0a], true),
    (LOCAL_B, [0x02, 0, 0, 0, 1, 0x0c], true),
    (LOCAL_POD, [0x02, 0, 0, 0, 1, 0x0b], true),
];

/// Where a service is reached; the oracle's own copy of the frontend kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

/// One service port of the fixture: what is programmed and what the oracle knows.
struct Spec {
    name: &'static str,
    protocol: Protocol,
    vip: Ipv4Addr,
    port: u16,
    node_port: Option<u16>,
    external_ip: Option<Ipv4Addr>,
    lb_ip: Option<Ipv4Addr>,
    source_ranges: &'static [&'static str],
    etp_local: bool,
    /// (address, port, on this node)
    endpoints: &'static [(Ipv4Addr, u16, bool)],
}

const SPECS: &[Spec] = &[
    // ClusterIP + NodePort, a local and a remote endpoint.
    Spec {
        node_port: Some(30080),
        ..Spec::cluster_ip(
            "web",
            Protocol::Tcp,
            Ipv4Addr::new(198, 19, 0, 10),
            80,
            &[(LOCAL_A, 8080, true), (REMOTE_A, 8080, false)],
        )
    },
    // The same cluster IP, UDP.
    Spec {
        node_port: Some(30053),
        ..Spec::cluster_ip(
            "dns",
            Protocol::Udp,
            Ipv4Addr::new(198, 19, 0, 10),
            53,
            &[(LOCAL_B, 5353, true), (REMOTE_B, 5353, false)],
        )
    },
    // An external IP.
    Spec {
        external_ip: Some(Ipv4Addr::new(198, 18, 3, 31)),
        ..Spec::cluster_ip(
            "ext",
            Protocol::Tcp,
            Ipv4Addr::new(198, 19, 0, 11),
            443,
            &[(REMOTE_A, 8443, false), (REMOTE_B, 8443, false)],
        )
    },
    // An LB IP with source ranges, TCP and UDP.
    Spec {
        node_port: Some(30081),
        lb_ip: Some(LB_IP),
        source_ranges: LB_RANGES,
        ..Spec::cluster_ip(
            "lb",
            Protocol::Tcp,
            Ipv4Addr::new(198, 19, 0, 12),
            80,
            &[(REMOTE_B, 8080, false), (LOCAL_A, 8081, true)],
        )
    },
    Spec {
        node_port: Some(30081),
        lb_ip: Some(LB_IP),
        source_ranges: LB_RANGES,
        ..Spec::cluster_ip(
            "lb",
            Protocol::Udp,
            Ipv4Addr::new(198, 19, 0, 12),
            80,
            &[(REMOTE_B, 8080, false)],
        )
    },
    // No endpoints: rejected, TCP and UDP.
    Spec {
        node_port: Some(30082),
        ..Spec::cluster_ip("empty", Protocol::Tcp, EMPTY_VIP, 80, &[])
    },
    Spec {
        node_port: Some(30082),
        ..Spec::cluster_ip("empty", Protocol::Udp, EMPTY_VIP, 80, &[])
    },
    // externalTrafficPolicy Local with a local endpoint, and an LB IP.
    Spec {
        node_port: Some(30083),
        lb_ip: Some(LOCAL_LB_IP),
        etp_local: true,
        ..Spec::cluster_ip(
            "local",
            Protocol::Tcp,
            LOCAL_VIP,
            80,
            &[(LOCAL_A, 9090, true), (REMOTE_A, 9090, false)],
        )
    },
    // externalTrafficPolicy Local with endpoints elsewhere only.
    Spec {
        node_port: Some(30084),
        etp_local: true,
        ..Spec::cluster_ip(
            "elsewhere",
            Protocol::Udp,
            Ipv4Addr::new(198, 19, 0, 15),
            53,
            &[(REMOTE_B, 9053, false)],
        )
    },
];
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 21);
const LB_RANGES: &[&str] = &["198.18.0.100/32", "198.18.1.0/24"];
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 13);
const LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 14);
const LOCAL_LB_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 22);

impl Spec {
    /// A ClusterIP service port, and nothing more.
    const fn cluster_ip(
        name: &'static str,
        protocol: Protocol,
        vip: Ipv4Addr,
        port: u16,
        endpoints: &'static [(Ipv4Addr, u16, bool)],
    ) -> Spec {
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
            endpoints,
        }
    }

    fn ip_proto(&self) -> u8 {
        self.protocol.ip_proto()
    }

    fn frontends(&self) -> Vec<(Ipv4Addr, u16, Kind)> {
        let mut out = vec![(self.vip, self.port, Kind::ClusterIp)];
        out.extend(self.node_port.map(|p| (NODE, p, Kind::NodePort)));
        out.extend(self.external_ip.map(|a| (a, self.port, Kind::ExternalIp)));
        out.extend(self.lb_ip.map(|a| (a, self.port, Kind::LoadBalancer)));
        out
    }

    fn ranges(&self) -> Vec<Ipv4Net> {
        self.source_ranges
            .iter()
            .map(|r| r.parse().unwrap())
            .collect()
    }

    fn desired(&self) -> DesiredService {
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
                ..Endpoint::new(IpAddr::V4(*ip), *port)
            })
            .collect();
        let local = endpoints.iter().filter(|e| e.is_local).cloned().collect();
        DesiredService {
            node_port: self.node_port,
            external_ips: self.external_ip.map(IpAddr::V4).into_iter().collect(),
            load_balancer_ips: self.lb_ip.map(IpAddr::V4).into_iter().collect(),
            load_balancer_source_ranges: self
                .source_ranges
                .iter()
                .map(|r| r.parse::<IpNet>().unwrap())
                .collect(),
            external_policy_local: self.etp_local,
            local_endpoints: local,
            ..DesiredService::cluster_ip(name, vec![IpAddr::V4(self.vip)], self.port, endpoints)
        }
    }
}

fn local_client(addr: Ipv4Addr) -> bool {
    POD_CIDR.parse::<Ipv4Net>().unwrap().contains(&addr)
}

/// What the oracle knows of the services: frontends by (address, port, protocol).
struct World {
    frontends: HashMap<(Ipv4Addr, u16, u8), (usize, Kind)>,
    frontend_list: Vec<(Ipv4Addr, u16, u8)>,
    cluster_ips: HashSet<Ipv4Addr>,
    ranges: Vec<Vec<Ipv4Net>>,
}

impl World {
    fn new() -> Self {
        let mut frontends = HashMap::new();
        let mut frontend_list = Vec::new();
        for (i, spec) in SPECS.iter().enumerate() {
            for (addr, port, kind) in spec.frontends() {
                let key = (addr, port, spec.ip_proto());
                assert!(frontends.insert(key, (i, kind)).is_none(), "{key:?} twice");
                frontend_list.push(key);
            }
        }
        World {
            frontends,
            frontend_list,
            cluster_ips: SPECS.iter().map(|s| s.vip).collect(),
            ranges: SPECS.iter().map(Spec::ranges).collect(),
        }
    }

    fn frontend(&self, t: &Tuple) -> Option<(usize, Kind)> {
        self.frontends.get(&(t.dst, t.dport, t.proto)).copied()
    }

    fn range_denies(&self, spec: usize, kind: Kind, src: Ipv4Addr) -> bool {
        let ranges = &self.ranges[spec];
        kind == Kind::LoadBalancer && !ranges.is_empty() && !ranges.iter().any(|r| r.contains(&src))
    }

    /// The endpoints a new flow from `client` to this frontend may use.
    fn backends(&self, spec: usize, kind: Kind, client: Ipv4Addr) -> Vec<(Ipv4Addr, u16)> {
        let spec = &SPECS[spec];
        let only_local = kind != Kind::ClusterIp && spec.etp_local && !local_client(client);
        spec.endpoints
            .iter()
            .filter(|(_, _, local)| *local || !only_local)
            .map(|(a, p, _)| (*a, *p))
            .collect()
    }

    /// Whether a flow from `client` through this frontend to `backend` leaves with the node's address.
    fn masquerades(&self, spec: usize, kind: Kind, client: Ipv4Addr, backend: Ipv4Addr) -> bool {
        backend == client
            || match kind {
                Kind::ClusterIp => !local_client(client),
                _ => !SPECS[spec].etp_local,
            }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Tuple {
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
    proto: u8,
}

impl Tuple {
    fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            sport: self.dport,
            dst: self.src,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

impl std::fmt::Display for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.proto {
            proto::TCP => "tcp",
            proto::UDP => "udp",
            _ => "?",
        };
        write!(
            f,
            "{p} {}:{} -> {}:{}",
            self.src, self.sport, self.dst, self.dport
        )
    }
}

/// The flows the oracle saw being created. Timeouts are an hour and the
/// conntrack table is sized so nothing is evicted: every flow stays live.
#[derive(Default)]
struct Model {
    /// A reply as it arrives (backend -> client or masquerade address) ->
    /// the tuple it must leave with (frontend -> client).
    replies: HashMap<Tuple, Tuple>,
    reply_keys: Vec<Tuple>,
    /// A client's tuple -> the tuple it was translated to.
    forwards: HashMap<Tuple, Tuple>,
    forward_keys: Vec<Tuple>,
    /// Masqueraded flows by backend (address, port, protocol).
    masqueraded: HashMap<(Ipv4Addr, u16, u8), usize>,
    /// Reply tuples another flow took over (REPLY_TUPLE_CLASH_KNOWN) that a
    /// SYN of a flow they were taken from may have taken back (if that flow
    /// was finished, the SYN reopened it): the mappings they may hold
    /// instead, until a reply shows which.
    taken_back: HashMap<Tuple, Vec<Tuple>>,
    /// TCP flows (by reply tuple) the datapath may hold closed: a RST or a
    /// FIN of each direction went through them (`CLOSED_*` bits). Only such
    /// a flow's reply tuple may be taken over by a masquerade port claim
    /// that found no free one, as the kernel's NAT evicts TIME_WAIT.
    closing: HashMap<Tuple, u8>,
}

const CLOSED_RST: u8 = 1;
const CLOSED_FIN_FORWARD: u8 = 2;
const CLOSED_FIN_REPLY: u8 = 4;

impl Model {
    /// Notes the FIN or RST of a packet of the TCP flow whose reply tuple
    /// is `key`, sent by its client (`forward`) or its backend.
    fn note_closing(&mut self, key: Tuple, tcp_flags: u8, forward: bool) {
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

    /// The flow of client tuple `t` as the datapath drops it when a SYN
    /// replaces it: its forward half, and its reply half while still its own.
    fn forget(&mut self, t: &Tuple) {
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
            self.taken_back.remove(&key);
        }
    }

    fn may_be_closed(&self, key: &Tuple) -> bool {
        self.closing.get(key).is_some_and(|&bits| {
            bits & CLOSED_RST != 0 || bits & (CLOSED_FIN_FORWARD | CLOSED_FIN_REPLY) == 6
        })
    }

    /// The other flow holding the reply tuple `t` would have to `backend`
    /// without a translated source: one whose replies come back on it (as it
    /// leaves, frontend -> client), or one whose client sends on it.
    fn clash(&self, t: &Tuple, (addr, port): (Ipv4Addr, u16)) -> Option<Tuple> {
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

// ---------------------------------------------------------------------------
// A small seeded PRNG (SplitMix64): the packet stream depends only on the
// seed and on the datapath's own choices (backends, masquerade ports).

struct Rng {
    state: u64,
    sweep: u8,
}

impl Rng {
    fn new(seed: u64) -> Self {
        Rng {
            state: seed,
            sweep: 0,
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// `lo..=hi` (`lo` when the range is empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next() as u8;
        }
    }

    /// 0, 1, .. 255, 0, ..: for what must go through every value.
    fn sweep(&mut self) -> u8 {
        self.sweep = self.sweep.wrapping_add(1);
        self.sweep.wrapping_sub(1)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

// ---------------------------------------------------------------------------
// Packet generation.

const MAX_FRAME: usize = 1600;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    RandomBytes,
    ToFrontend,
    NotService,
    Reply,
    NearReply,
    IcmpError,
    NotIpv4,
}

fn random_addr(rng: &mut Rng) -> Ipv4Addr {
    if rng.chance(70) {
        Ipv4Addr::from(0xc612_0000 | (rng.below(0x2_0000) as u32))
    } else {
        Ipv4Addr::from(rng.next() as u32)
    }
}

fn client_addr(rng: &mut Rng) -> Ipv4Addr {
    const CLIENTS: [Ipv4Addr; 8] = [
        CLIENT, STRANGER, FAR_CLIENT, LOCAL_POD, LOCAL_A, REMOTE_A, NODE, PEER_NODE,
    ];
    if rng.chance(88) {
        *rng.pick(&CLIENTS)
    } else {
        random_addr(rng)
    }
}

fn client_port(rng: &mut Rng) -> u16 {
    match rng.below(100) {
        0..75 => 40000 + rng.below(48) as u16,
        75..85 => rng.range(SNAT_PORT_MIN as u64, SNAT_PORT_MAX as u64) as u16,
        85..95 => rng.next() as u16,
        _ => *rng.pick(&[0, 1, 53, 80, 443, 8080, 30080, 61000, 65535]),
    }
}

fn tcp_flags_for(rng: &mut Rng) -> u8 {
    use tcp_flags::*;
    const PSH: u8 = 0x08;
    match rng.below(100) {
        0..28 => SYN,
        28..50 => ACK,
        50..58 => PSH | ACK,
        58..64 => SYN | ACK,
        64..70 => FIN | ACK,
        70..74 => RST,
        74..77 => RST | ACK,
        // Every combination in turn, the reserved bits included.
        _ => rng.sweep(),
    }
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0..4 => 0,
        4..8 => rng.range(1, 64),
        _ => rng.range(65, 1400),
    };
    rng.bytes(len as usize)
}

/// A well-formed Ethernet + IPv4 + TCP/UDP frame for `t`.
fn l4_frame(rng: &mut Rng, t: Tuple) -> Vec<u8> {
    let frame = Frame {
        src: t.src.into(),
        dst: t.dst.into(),
        sport: t.sport,
        dport: t.dport,
        proto: t.proto,
    };
    let mut pkt = frame.build(&payload(rng));
    let dmac = *rng.pick(&[EXT_MAC, POD_MAC]);
    pkt[0..6].copy_from_slice(&dmac);
    pkt[6..12].copy_from_slice(&rng.pick(&NEIGHBOURS).1);
    let ip = ETH_HLEN;
    pkt[ip + 1] = if rng.chance(10) { rng.next() as u8 } else { 0 };
    rng.fill(&mut pkt[ip + 4..ip + 6]);
    if rng.chance(30) {
        pkt[ip + 6] = 0; // DF off
    }
    pkt[ip + 8] = if rng.chance(90) { 64 } else { rng.next() as u8 };
    if t.proto == proto::TCP {
        let tcp = ip + IPV4_HLEN;
        rng.fill(&mut pkt[tcp + 4..tcp + 12]);
        pkt[tcp + 13] = tcp_flags_for(rng);
        rng.fill(&mut pkt[tcp + 14..tcp + 16]);
    }
    packet::fix_checksums(&mut pkt);
    pkt
}

/// Whether `fix_checksums` / `checksums_valid` can read this frame's lengths.
fn lengths_sane(pkt: &[u8]) -> bool {
    if pkt.len() < ETH_HLEN + IPV4_HLEN || pkt[12..14] != [0x08, 0x00] {
        return false;
    }
    let ip = &pkt[ETH_HLEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let csum_end = ihl + if ip[9] == proto::TCP { 18 } else { 8 };
    (ip[9] == proto::TCP || ip[9] == proto::UDP)
        && ihl >= IPV4_HLEN
        && tot >= csum_end
        && ETH_HLEN + tot <= pkt.len()
}

fn fix_if_sane(pkt: &mut [u8]) {
    if lengths_sane(pkt) {
        packet::fix_checksums(pkt);
    }
}

/// Mutations of a TCP/UDP frame; anything may come out.
fn mutate(rng: &mut Rng, mut pkt: Vec<u8>) -> Vec<u8> {
    let ip = ETH_HLEN;
    // IP options: IHL > 5, the L4 header moved along.
    if rng.chance(20) {
        let words = rng.range(1, 10) as usize;
        let mut options = vec![1u8; words * 4]; // NOPs
        if rng.chance(50) {
            rng.fill(&mut options);
        }
        let at = ip + IPV4_HLEN;
        pkt.splice(at..at, options);
        pkt[ip] = (pkt[ip] & 0xf0) | (5 + words) as u8;
        let tot = u16::from_be_bytes([pkt[ip + 2], pkt[ip + 3]]) + (words * 4) as u16;
        pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
    }
    // Fragments: more fragments, a non-zero offset, or both.
    if rng.chance(12) {
        let off: u16 = match rng.below(3) {
            0 => 0x2000,
            1 => rng.range(1, 0x1fff) as u16,
            _ => 0x2000 | rng.range(1, 0x1fff) as u16,
        };
        pkt[ip + 6..ip + 8].copy_from_slice(&off.to_be_bytes());
    }
    if rng.chance(10) {
        pkt[ip + 8] = *rng.pick(&[0, 1, 2, 255]);
    }
    if rng.chance(5) {
        // Ethernet padding beyond the IP total length.
        let pad = rng.range(1, 46) as usize;
        pkt.extend(std::iter::repeat_n(0, pad));
    }
    fix_if_sane(&mut pkt);
    // Header fields that lie.
    if rng.chance(20) {
        match rng.below(5) {
            0 => {
                let tot = rng.next() as u16;
                pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
            }
            1 => {
                let real = (pkt.len() - ETH_HLEN) as i64;
                let tot = (real + rng.range(0, 80) as i64 - 40).clamp(0, 0xffff) as u16;
                pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
            }
            2 => pkt[ip] = (pkt[ip] & 0xf0) | rng.below(16) as u8,
            3 => pkt[ip] = (rng.below(16) as u8) << 4 | (pkt[ip] & 0x0f),
            _ => pkt[ip + 9] = rng.next() as u8,
        }
        if rng.chance(50) {
            // Consistent checksums over the lie, where they can be computed.
            fix_if_sane(&mut pkt);
            let ihl = (pkt[ip] & 0x0f) as usize * 4;
            if ihl >= IPV4_HLEN && ip + ihl <= pkt.len() {
                pkt[ip + 10..ip + 12].fill(0);
                let sum = packet::checksum(&[&pkt[ip..ip + ihl]]);
                pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
            }
        }
    }
    // Bad checksums.
    if rng.chance(12) {
        match rng.below(3) {
            0 => pkt[ip + 10] ^= 1 << rng.below(8),
            1 if lengths_sane(&pkt) => {
                let off = packet::l4_checksum_offset(&pkt);
                pkt[off + rng.below(2) as usize] ^= 1 << rng.below(8);
            }
            _ if lengths_sane(&pkt) && pkt[ip + 9] == proto::UDP => {
                let off = packet::l4_checksum_offset(&pkt);
                pkt[off..off + 2].fill(0);
            }
            _ => {}
        }
    }
    // Truncated, at every length class.
    if rng.chance(15) {
        let ihl = ((pkt[ip] & 0x0f) as usize * 4).max(IPV4_HLEN);
        let l4 = ip + ihl;
        let len = match rng.below(5) {
            0 => rng.below(ETH_HLEN as u64) as usize,
            1 => rng.range(ETH_HLEN as u64, (ip + IPV4_HLEN - 1) as u64) as usize,
            2 => rng.range((ip + IPV4_HLEN) as u64, l4 as u64) as usize,
            3 => rng.range(l4 as u64, (l4 + 19) as u64) as usize,
            _ => rng.range(l4 as u64, pkt.len() as u64) as usize,
        };
        pkt.truncate(len);
    }
    if rng.chance(6) {
        for _ in 0..rng.range(1, 4) {
            if !pkt.is_empty() {
                let at = rng.below(pkt.len() as u64) as usize;
                pkt[at] = rng.next() as u8;
            }
        }
    }
    pkt.truncate(MAX_FRAME);
    pkt
}

fn icmp_frame(rng: &mut Rng, src: Ipv4Addr, dst: Ipv4Addr, quoted: Tuple) -> Vec<u8> {
    let inner = l4_frame(rng, quoted);
    let quote_len = (IPV4_HLEN + 8 + rng.below(3) as usize * 20).min(inner.len() - ETH_HLEN);
    let (icmp_type, code) = match rng.below(10) {
        0..6 => (3, rng.below(16) as u8),
        6..9 => (11, rng.below(2) as u8),
        _ => (rng.next() as u8, rng.next() as u8),
    };
    let icmp_len = 8 + quote_len;
    let mut pkt = vec![0u8; ETH_HLEN + IPV4_HLEN + icmp_len];
    pkt[0..6].copy_from_slice(&EXT_MAC);
    pkt[6..12].copy_from_slice(&NEIGHBOURS[0].1);
    pkt[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = ETH_HLEN;
    pkt[ip] = 0x45;
    pkt[ip + 1] = 0xc0;
    pkt[ip + 2..ip + 4].copy_from_slice(&((IPV4_HLEN + icmp_len) as u16).to_be_bytes());
    pkt[ip + 8] = 64;
    pkt[ip + 9] = proto::ICMP;
    pkt[ip + 12..ip + 16].copy_from_slice(&src.octets());
    pkt[ip + 16..ip + 20].copy_from_slice(&dst.octets());
    let sum = packet::checksum(&[&pkt[ip..ip + IPV4_HLEN]]);
    pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    let icmp = ip + IPV4_HLEN;
    pkt[icmp] = icmp_type;
    pkt[icmp + 1] = code;
    if icmp_type == 3 && code == 4 {
        pkt[icmp + 6..icmp + 8].copy_from_slice(&1400u16.to_be_bytes()); // next-hop MTU
    }
    pkt[icmp + 8..].copy_from_slice(&inner[ETH_HLEN..ETH_HLEN + quote_len]);
    let sum = packet::checksum(&[&pkt[icmp..]]);
    pkt[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
    pkt
}

struct Generator<'a> {
    world: &'a World,
}

impl Generator<'_> {
    fn next(&self, rng: &mut Rng, model: &Model) -> (Class, Vec<u8>) {
        let class = match rng.below(100) {
            0..8 => Class::RandomBytes,
            8..40 => Class::ToFrontend,
            40..50 => Class::NotService,
            50..75 if !model.reply_keys.is_empty() => Class::Reply,
            50..75 => Class::ToFrontend,
            75..80 if !model.reply_keys.is_empty() => Class::NearReply,
            75..80 => Class::NotService,
            80..87 => Class::IcmpError,
            _ => Class::NotIpv4,
        };
        let pkt = match class {
            Class::RandomBytes => self.random_bytes(rng),
            Class::ToFrontend => {
                let t = self.to_frontend(rng);
                {
                    let pkt = l4_frame(rng, t);
                    self.maybe_mutate(rng, pkt)
                }
            }
            Class::NotService => {
                let t = self.not_service(rng);
                {
                    let pkt = l4_frame(rng, t);
                    self.maybe_mutate(rng, pkt)
                }
            }
            Class::Reply => {
                let t = *rng.pick(&model.reply_keys);
                {
                    let pkt = l4_frame(rng, t);
                    self.maybe_mutate(rng, pkt)
                }
            }
            Class::NearReply => {
                let mut t = *rng.pick(&model.reply_keys);
                match rng.below(5) {
                    0 => t.sport = t.sport.wrapping_add(1),
                    1 => t.dport = t.dport.wrapping_add(1),
                    2 => t.src = client_addr(rng),
                    3 => t.dst = client_addr(rng),
                    _ => t.proto = proto::TCP + proto::UDP - t.proto,
                }
                {
                    let pkt = l4_frame(rng, t);
                    self.maybe_mutate(rng, pkt)
                }
            }
            Class::IcmpError => {
                let pkt = self.icmp_error(rng, model);
                if rng.chance(30) {
                    let mut pkt = pkt;
                    let at = rng.below(pkt.len() as u64) as usize;
                    pkt.truncate(at.max(ETH_HLEN + IPV4_HLEN + 4));
                    pkt
                } else {
                    pkt
                }
            }
            Class::NotIpv4 => self.not_ipv4(rng),
        };
        (class, pkt)
    }

    fn maybe_mutate(&self, rng: &mut Rng, pkt: Vec<u8>) -> Vec<u8> {
        if rng.chance(45) {
            mutate(rng, pkt)
        } else {
            pkt
        }
    }

    fn random_bytes(&self, rng: &mut Rng) -> Vec<u8> {
        let len = rng.below(MAX_FRAME as u64 + 1) as usize;
        let mut pkt = rng.bytes(len);
        // Half of them get far enough to be read as IPv4 TCP/UDP.
        if rng.chance(50) && len >= ETH_HLEN {
            pkt[12..14].copy_from_slice(&[0x08, 0x00]);
            if len > ETH_HLEN {
                pkt[ETH_HLEN] = 0x40 | (pkt[ETH_HLEN] & 0x0f);
            }
            if len > ETH_HLEN + 9 {
                pkt[ETH_HLEN + 9] = *rng.pick(&[proto::TCP, proto::UDP]);
            }
            if len > ETH_HLEN + 7 && rng.chance(70) {
                pkt[ETH_HLEN + 6] &= 0xe0; // first fragment
                pkt[ETH_HLEN + 7] = 0;
            }
        }
        pkt
    }

    fn to_frontend(&self, rng: &mut Rng) -> Tuple {
        let (dst, dport, proto) = *rng.pick(&self.world.frontend_list);
        let mut t = Tuple {
            src: client_addr(rng),
            sport: client_port(rng),
            dst,
            dport,
            proto,
        };
        match rng.below(10) {
            // An unused port of a cluster IP.
            0 => {
                t.dst = rng.pick(SPECS).vip;
                t.dport = rng.next() as u16;
            }
            // The other protocol.
            1 => t.proto = proto::TCP + proto::UDP - t.proto,
            _ => {}
        }
        t
    }

    fn not_service(&self, rng: &mut Rng) -> Tuple {
        let proto = *rng.pick(&[proto::TCP, proto::UDP]);
        let (dst, dport) = match rng.below(10) {
            // Straight to an endpoint, not through the service.
            0..3 => {
                let spec = rng.pick(SPECS);
                match spec.endpoints {
                    [] => (REMOTE_A, 8080),
                    eps => {
                        let (a, p, _) = rng.pick(eps);
                        (*a, *p)
                    }
                }
            }
            3..7 => (random_addr(rng), rng.next() as u16),
            // The node, or an external / LB IP, on a port that is no frontend.
            _ => {
                let addr = *rng.pick(&[NODE, Ipv4Addr::new(198, 18, 3, 31), LB_IP, LOCAL_LB_IP]);
                (addr, rng.next() as u16)
            }
        };
        Tuple {
            src: client_addr(rng),
            sport: client_port(rng),
            dst,
            dport,
            proto,
        }
    }

    /// An ICMP error quoting a service flow's headers, before or after translation.
    fn icmp_error(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let (client, translated) = match model.forward_keys.is_empty() {
            false => {
                let t = *rng.pick(&model.forward_keys);
                (t, model.forwards[&t])
            }
            true => {
                let t = self.to_frontend(rng);
                (
                    t,
                    Tuple {
                        src: NODE,
                        sport: 61000,
                        dst: REMOTE_A,
                        dport: 8080,
                        proto: t.proto,
                    },
                )
            }
        };
        match rng.below(4) {
            // The backend answers the translated packet with an error.
            0 => icmp_frame(rng, translated.dst, translated.src, translated),
            // A router on the way to the backend does.
            1 => icmp_frame(rng, PEER_NODE, translated.src, translated),
            // A router on the way back to the client, about the translated reply.
            2 => icmp_frame(
                rng,
                PEER_NODE,
                client.dst,
                Tuple {
                    src: client.dst,
                    sport: client.dport,
                    dst: client.src,
                    dport: client.sport,
                    proto: client.proto,
                },
            ),
            // The client's side, about its request.
            _ => icmp_frame(rng, client.src, client.dst, client),
        }
    }

    fn not_ipv4(&self, rng: &mut Rng) -> Vec<u8> {
        match rng.below(6) {
            // A service request behind an 802.1Q tag, or two (QinQ).
            0 | 1 => {
                let t = self.to_frontend(rng);
                let mut pkt = l4_frame(rng, t);
                let tci = rng.next() as u16 & 0x0fff;
                let mut tag = vec![0x81, 0x00];
                tag.extend(tci.to_be_bytes());
                if rng.chance(50) {
                    let mut outer = vec![0x88, 0xa8];
                    outer.extend(rng.bytes(2));
                    outer.extend(tag);
                    tag = outer;
                }
                pkt.splice(12..12, tag);
                pkt
            }
            // IPv6 with garbage, sometimes a plausible header.
            2 | 3 => {
                let len = ETH_HLEN + rng.below(200) as usize;
                let mut pkt = rng.bytes(len);
                pkt[12..14].copy_from_slice(&[0x86, 0xdd]);
                if rng.chance(50) && pkt.len() >= ETH_HLEN + 40 {
                    pkt[ETH_HLEN] = 0x60;
                    pkt[ETH_HLEN + 6] = *rng.pick(&[proto::TCP, proto::UDP, 58]);
                }
                pkt
            }
            // ARP.
            4 => {
                let mut pkt = rng.bytes(ETH_HLEN + 28);
                pkt[12..14].copy_from_slice(&[0x08, 0x06]);
                pkt
            }
            // Any other ethertype, with a service request behind it.
            _ => {
                let t = self.to_frontend(rng);
                let mut pkt = l4_frame(rng, t);
                let ethertype = loop {
                    let e = rng.next() as u16;
                    if e != 0x0800 {
                        break e;
                    }
                };
                pkt[12..14].copy_from_slice(&ethertype.to_be_bytes());
                pkt
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The oracle.

/// Frames BPF_PROG_TEST_RUN itself refuses (EINVAL): shorter than an
/// Ethernet header, and for TC an IPv4 / IPv6 frame shorter than its
/// network header.
fn kernel_refuses(hook: Hook, pkt: &[u8]) -> bool {
    if pkt.len() < ETH_HLEN {
        return true;
    }
    hook != Hook::Xdp
        && match [pkt[12], pkt[13]] {
            [0x08, 0x00] => pkt.len() < ETH_HLEN + IPV4_HLEN,
            [0x86, 0xdd] => pkt.len() < ETH_HLEN + 40,
            _ => false,
        }
}

/// What an input frame is, read independently of the datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Shorter than an Ethernet header: the kernel refuses to run it.
    Short,
    NotIpv4,
    /// IPv6 that reads as TCP/UDP or as something else the datapath passes
    /// on (no IPv6 service exists in this world, so it is never translated).
    Ipv6,
    /// IPv6 whose fixed header, walked extension headers or L4 header do
    /// not fit, or whose version is not 6.
    Ipv6Malformed,
    /// IPv4 ethertype, but no room for an IPv4 header.
    Ipv4Truncated,
    NotTcpUdp,
    /// A fragment after the first: no ports to look at.
    LaterFragment,
    BadIhl,
    /// The ports or the L4 checksum field lie beyond the frame.
    L4Truncated,
    Handleable(Parsed),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Parsed {
    t: Tuple,
    ihl: usize,
    l4_off: usize,
    csum_off: usize,
    /// Frame offset past the L4 bytes the datapath reads (ports, checksum;
    /// SCTP: the first chunk's header).
    l4_end: usize,
    tcp_flags: u8,
    ttl: u8,
    tot_len: usize,
    version: u8,
}

/// SCTP: the datapath parses its common header and first chunk header. No
/// SCTP service exists in this world, so an SCTP packet is either passed on
/// untouched or, to a cluster IP (no port of it serves SCTP), rejected.
const SCTP: u8 = 132;
const SCTP_L4_NEED: usize = 12 + 4;

impl Shape {
    fn of(pkt: &[u8]) -> Shape {
        if pkt.len() < ETH_HLEN {
            return Shape::Short;
        }
        if pkt[12..14] == [0x86, 0xdd] {
            return Shape::of_ipv6(pkt);
        }
        if pkt[12..14] != [0x08, 0x00] {
            return Shape::NotIpv4;
        }
        if pkt.len() < ETH_HLEN + IPV4_HLEN {
            return Shape::Ipv4Truncated;
        }
        let ip = &pkt[ETH_HLEN..];
        let proto = ip[9];
        if proto != proto::TCP && proto != proto::UDP && proto != SCTP {
            return Shape::NotTcpUdp;
        }
        if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
            return Shape::LaterFragment;
        }
        let ihl = (ip[0] & 0x0f) as usize * 4;
        if ihl < IPV4_HLEN {
            return Shape::BadIhl;
        }
        let l4_off = ETH_HLEN + ihl;
        // SCTP's checksum is a CRC the datapath never rewrites (no SCTP
        // service exists in this world); what it needs is the common header
        // and the first chunk's header.
        let (csum_off, l4_end) = match proto {
            proto::TCP => (l4_off + 16, l4_off + 18),
            proto::UDP => (l4_off + 6, l4_off + 8),
            _ => (l4_off + 8, l4_off + SCTP_L4_NEED),
        };
        if pkt.len() < l4_end {
            return Shape::L4Truncated;
        }
        let l4 = &pkt[l4_off..];
        Shape::Handleable(Parsed {
            t: Tuple {
                src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
                dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
                sport: u16::from_be_bytes([l4[0], l4[1]]),
                dport: u16::from_be_bytes([l4[2], l4[3]]),
                proto,
            },
            ihl,
            l4_off,
            csum_off,
            l4_end,
            tcp_flags: if proto == proto::TCP { l4[13] } else { 0 },
            ttl: ip[8],
            tot_len: u16::from_be_bytes([ip[2], ip[3]]) as usize,
            version: ip[0] >> 4,
        })
    }

    /// An IPv6 frame read as RFC 8200 lays it out: the fixed header, up to
    /// four hop-by-hop / routing / fragment / destination-options headers,
    /// then TCP, UDP or SCTP whose ports and checksum (SCTP: the first
    /// chunk's header) must fit.
    fn of_ipv6(pkt: &[u8]) -> Shape {
        const MAX_EXT_HEADERS: usize = 4;
        if pkt.len() < ETH_HLEN + 40 {
            return Shape::Ipv6Malformed;
        }
        let ip = &pkt[ETH_HLEN..];
        if ip[0] >> 4 != 6 {
            return Shape::Ipv6Malformed;
        }
        let payload_len = u16::from_be_bytes([ip[4], ip[5]]) as usize;
        let mut next = ip[6];
        let mut off = ETH_HLEN + 40;
        let mut walked = 0;
        while next != proto::TCP && next != proto::UDP && next != SCTP {
            if !matches!(next, 0 | 43 | 44 | 60) || walked == MAX_EXT_HEADERS {
                return Shape::Ipv6;
            }
            if off + 4 > pkt.len() {
                return Shape::Ipv6Malformed;
            }
            let hdr = &pkt[off..off + 4];
            if next == 44 && (u16::from_be_bytes([hdr[2], hdr[3]]) & 0xfff8 != 0 || hdr[1] != 0) {
                return Shape::Ipv6;
            }
            next = hdr[0];
            off += (hdr[1] as usize + 1) * 8;
            walked += 1;
        }
        let l4_need = match next {
            proto::TCP => 18,
            SCTP => SCTP_L4_NEED,
            _ => 8,
        };
        let tot_len = if payload_len == 0 {
            0
        } else {
            payload_len + 40
        };
        if (tot_len != 0 && tot_len < off - ETH_HLEN + l4_need) || off + l4_need > pkt.len() {
            return Shape::Ipv6Malformed;
        }
        Shape::Ipv6
    }

    /// Frames the datapath may drop as malformed instead of passing them on.
    fn malformed(&self) -> bool {
        matches!(
            self,
            Shape::Ipv4Truncated | Shape::BadIhl | Shape::L4Truncated | Shape::Ipv6Malformed
        )
    }
}

impl Parsed {
    fn tuple_at(&self, pkt: &[u8]) -> Tuple {
        let ip = &pkt[ETH_HLEN..];
        let l4 = &pkt[self.l4_off..];
        Tuple {
            src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            sport: u16::from_be_bytes([l4[0], l4[1]]),
            dport: u16::from_be_bytes([l4[2], l4[3]]),
            proto: self.t.proto,
        }
    }

    fn ip_valid(&self, pkt: &[u8]) -> bool {
        packet::checksum(&[&pkt[ETH_HLEN..ETH_HLEN + self.ihl]]) == 0
    }

    /// Whether the L4 checksum covers a well-defined range of the frame.
    fn l4_sane(&self, pkt: &[u8]) -> bool {
        self.tot_len >= self.l4_end - ETH_HLEN && ETH_HLEN + self.tot_len <= pkt.len()
    }

    fn l4_valid(&self, pkt: &[u8]) -> bool {
        let ip = &pkt[ETH_HLEN..];
        let l4 = &ip[self.ihl..self.tot_len];
        if self.t.proto == proto::UDP && pkt[self.csum_off..self.csum_off + 2] == [0, 0] {
            return true;
        }
        let mut pseudo = [0u8; 12];
        pseudo[0..8].copy_from_slice(&ip[12..20]);
        pseudo[9] = self.t.proto;
        pseudo[10..12].copy_from_slice(&(l4.len() as u16).to_be_bytes());
        packet::checksum(&[&pseudo, l4]) == 0
    }

    /// Headers the datapath drops as malformed, as ip_rcv would: not
    /// version 4, or a total length (0: BIG TCP, unknown) too short for the
    /// IP header and the L4 ports and checksum.
    fn header_unfit(&self) -> bool {
        self.version != 4 || (self.tot_len != 0 && self.tot_len < self.l4_end - ETH_HLEN)
    }

    /// Why the kernel's IPv4 input (ip_rcv) would drop this packet, if it would.
    fn kernel_drops(&self, pkt: &[u8]) -> Option<&'static str> {
        if self.version != 4 {
            Some("version")
        } else if !self.ip_valid(pkt) {
            Some("header checksum")
        } else if self.tot_len < self.ihl || ETH_HLEN + self.tot_len > pkt.len() {
            Some("total length")
        } else {
            None
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Judged {
    Forwarded,
    Reply,
    Rejected,
    Dropped,
    Passed,
    Refused,
}

#[derive(Default)]
struct Stats {
    packets: u64,
    verdicts: BTreeMap<String, u64>,
    results: BTreeMap<Judged, u64>,
    classes: BTreeMap<Class, u64>,
    followups: u64,
    followup_results: BTreeMap<Judged, u64>,
    /// New flows that took a live flow's reply tuple (REPLY_TUPLE_CLASH_KNOWN).
    known_clashes: u64,
    first_known_clash: Option<String>,
    /// New masqueraded flows given a closed flow's reply tuple.
    taken_over: u64,
    tcp_flag_combinations: BTreeSet<u8>,
    /// Translated although the kernel's IPv4 input checks would drop it, by reason.
    translated_invalid_header: BTreeMap<&'static str, u64>,
}

struct Violation {
    index: u64,
    hook: Hook,
    class: Class,
    what: String,
    input: Vec<u8>,
    verdict: Option<i32>,
    output: Vec<u8>,
}

struct Oracle<'a> {
    world: &'a World,
    model: Model,
    /// The ports of IPv4 datagrams whose first fragment (more to follow)
    /// the datapath parsed, by (source, destination, identification,
    /// protocol): their later fragments may follow their flow (`FRAGMENTS`).
    fragments: HashMap<(Ipv4Addr, Ipv4Addr, u16, u8), (u16, u16)>,
    stats: Stats,
    violations: Vec<Violation>,
    violation_count: u64,
    by_invariant: BTreeMap<String, u64>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn verdict_name(hook: Hook, v: i32) -> String {
    match (hook, v) {
        (Hook::Xdp, XDP_DROP) => "DROP".into(),
        (Hook::Xdp, XDP_PASS) => "PASS".into(),
        (Hook::Xdp, XDP_TX) => "TX".into(),
        (Hook::Xdp, v) => format!("xdp:{v}"),
        (_, TC_ACT_OK) => "OK".into(),
        (_, TC_ACT_SHOT) => "SHOT".into(),
        (_, TC_ACT_REDIRECT) => "REDIRECT".into(),
        (_, v) => format!("tc:{v}"),
    }
}

fn is_drop(hook: Hook, v: i32) -> bool {
    v == if hook == Hook::Xdp {
        XDP_DROP
    } else {
        TC_ACT_SHOT
    }
}

fn is_pass(hook: Hook, v: i32) -> bool {
    v == if hook == Hook::Xdp {
        XDP_PASS
    } else {
        TC_ACT_OK
    }
}

fn valid_action(hook: Hook, v: i32) -> bool {
    match hook {
        Hook::Xdp => matches!(v, XDP_DROP | XDP_PASS | XDP_TX),
        _ => matches!(v, TC_ACT_OK | TC_ACT_SHOT | TC_ACT_REDIRECT),
    }
}

impl<'a> Oracle<'a> {
    fn new(world: &'a World) -> Self {
        Oracle {
            world,
            model: Model::default(),
            fragments: HashMap::new(),
            stats: Stats::default(),
            violations: Vec::new(),
            violation_count: 0,
            by_invariant: BTreeMap::new(),
        }
    }

    /// Runs one packet through `hook` (and, after XDP_PASS, through
    /// `tc_from_netdev` as the kernel would) and judges the outcome.
    fn run(&mut self, fx: &Fixture, hook: Hook, index: u64, class: Class, input: &[u8]) {
        self.stats.packets += 1;
        *self.stats.classes.entry(class).or_default() += 1;
        let shape = Shape::of(input);
        if let Shape::Handleable(p) = shape
            && p.t.proto == proto::TCP
        {
            self.stats.tcp_flag_combinations.insert(p.tcp_flags);
        }
        let outcome = fx.run(hook, input);
        let verdict = outcome.as_ref().ok().map(|o| o.verdict);
        let key = match verdict {
            Some(v) => verdict_name(hook, v),
            None => "refused".into(),
        };
        *self.stats.verdicts.entry(key).or_default() += 1;
        let judged = match &outcome {
            Err(_) if kernel_refuses(hook, input) => Ok(Judged::Refused),
            Err(e) => Err(format!("[action] the test run failed: {e:#}")),
            Ok(out) => self.judge(hook, shape, input, out),
        };
        match judged {
            Ok(r) => {
                *self.stats.results.entry(r).or_default() += 1;
                let passed_up = hook == Hook::Xdp
                    && r == Judged::Passed
                    && matches!(shape, Shape::Handleable(_));
                if passed_up {
                    self.stats.followups += 1;
                    let after = fx.run(Hook::FromNetdev, input);
                    let judged = match &after {
                        Err(e) => Err(format!("[action] the test run failed: {e:#}")),
                        Ok(out) => self.judge(Hook::FromNetdev, shape, input, out),
                    };
                    match judged {
                        Ok(r) => *self.stats.followup_results.entry(r).or_default() += 1,
                        Err(what) => {
                            let what = format!("after XDP_PASS: {what}");
                            self.violation(index, Hook::FromNetdev, class, what, input, after.ok());
                        }
                    }
                }
            }
            Err(what) => {
                self.violation(index, hook, class, what, input, outcome.ok());
            }
        }
    }

    /// A later IPv4 fragment of a datagram whose first fragment was seen, of
    /// a live flow, may leave as its flow does: its addresses translated (the
    /// header checksum still valid), TTL and MACs as any packet sent on, every
    /// other byte untouched. `None`: no such flow; the untouched rule judges it.
    fn later_fragment(&self, input: &[u8], out: &Outcome) -> Option<Result<Judged, String>> {
        let ip = &input[ETH_HLEN..];
        let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
        let (src, dst, proto) = (addr(12), addr(16), ip[9]);
        let id = u16::from_be_bytes([ip[4], ip[5]]);
        let &(sport, dport) = self.fragments.get(&(src, dst, id, proto))?;
        let t = Tuple {
            src,
            sport,
            dst,
            dport,
            proto,
        };
        let (to, judged) = match (self.model.forwards.get(&t), self.model.replies.get(&t)) {
            (Some(to), _) => (*to, Judged::Forwarded),
            (_, Some(to)) => (*to, Judged::Reply),
            _ => return None,
        };
        let ihl = (ip[0] & 0x0f) as usize * 4;
        let o = &out.packet;
        if o.len() != input.len() || ihl < IPV4_HLEN || ETH_HLEN + ihl > o.len() {
            return Some(Err(format!("[fragment] later fragment of {t} reshaped")));
        }
        let o4 = &o[ETH_HLEN..];
        let kept = o4[..8] == ip[..8] && o4[9] == ip[9] && o4[20..] == ip[20..];
        let addressed = o4[12..16] == to.src.octets() && o4[16..20] == to.dst.octets();
        let valid = |h: &[u8]| packet::checksum(&[&h[..ihl]]) == 0;
        if kept && addressed && valid(ip) == valid(o4) {
            Some(Ok(judged))
        } else {
            Some(Err(format!(
                "[fragment] later fragment of {t} not translated as its flow ({to})"
            )))
        }
    }

    fn violation(
        &mut self,
        index: u64,
        hook: Hook,
        class: Class,
        what: String,
        input: &[u8],
        out: Option<Outcome>,
    ) {
        self.violation_count += 1;
        let invariant = what
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or("?", |(tag, _)| tag)
            .to_string();
        let seen = self.by_invariant.entry(invariant).or_default();
        *seen += 1;
        if *seen <= KEPT_PER_INVARIANT {
            self.violations.push(Violation {
                index,
                hook,
                class,
                what,
                input: input.to_vec(),
                verdict: out.as_ref().map(|o| o.verdict),
                output: out.map(|o| o.packet).unwrap_or_default(),
            });
        }
    }

    fn judge(
        &mut self,
        hook: Hook,
        shape: Shape,
        input: &[u8],
        out: &Outcome,
    ) -> Result<Judged, String> {
        let v = out.verdict;
        if !valid_action(hook, v) {
            return Err(format!("[action] invalid action {v}"));
        }
        let unchanged = out.packet == input;
        if let Shape::Handleable(p) = shape
            && input[ETH_HLEN + 6] & 0x20 != 0
        {
            let id = u16::from_be_bytes([input[ETH_HLEN + 4], input[ETH_HLEN + 5]]);
            (self.fragments).insert((p.t.src, p.t.dst, id, p.t.proto), (p.t.sport, p.t.dport));
        }
        if shape == Shape::LaterFragment
            && !unchanged
            && let Some(judged) = self.later_fragment(input, out)
        {
            return judged;
        }
        let Shape::Handleable(p) = shape else {
            if is_drop(hook, v) && shape.malformed() {
                return Ok(Judged::Dropped);
            }
            if !unchanged {
                return Err(format!("[untouched] {shape:?} frame modified"));
            }
            if !is_pass(hook, v) {
                return Err(format!("[untouched] {shape:?} frame not passed on"));
            }
            return Ok(Judged::Passed);
        };
        // The datapath notes a FIN or RST when it finds the packet's flow,
        // before it may still drop the packet (a header it cannot rewrite).
        if let Some(to) = self.model.forwards.get(&p.t).copied() {
            self.model.note_closing(to.reversed(), p.tcp_flags, true);
        }
        if self.model.replies.contains_key(&p.t) {
            self.model.note_closing(p.t, p.tcp_flags, false);
        }
        if is_drop(hook, v) && p.header_unfit() {
            return Ok(Judged::Dropped);
        }
        let t = p.t;
        let fe = self.world.frontend(&t);
        let unused_port = fe.is_none() && self.world.cluster_ips.contains(&t.dst);
        let reply = self.model.replies.get(&t).copied();

        if is_drop(hook, v) {
            if reply.is_some() {
                return Err(format!("[reply] dropped the reply {t} of a live flow"));
            }
            // A SYN of a live flow is dropped only when it would open a new
            // one in its place (the old one finished) and that failed: the
            // old flow is gone.
            let opens = p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
            if t.proto == proto::TCP && opens {
                self.model.forget(&t);
            }
            return match fe {
                Some((spec, kind)) => self.drop_allowed(hook, &p, input, spec, kind),
                None if unused_port => self.reject_may_fail(hook, &p, input),
                None => Err(format!(
                    "[untouched] dropped {t}, for no service and no flow"
                )),
            }
            .map(|()| Judged::Dropped);
        }
        if unchanged {
            if !is_pass(hook, v) {
                return Err("[untouched] an untouched packet was sent on".into());
            }
            if hook != Hook::Xdp {
                if reply.is_some() {
                    return Err(format!(
                        "[reply] the reply {t} of a live flow passed untranslated"
                    ));
                }
                if fe.is_some() || unused_port {
                    return Err(format!(
                        "[forward] {t} is service traffic but passed untranslated"
                    ));
                }
            }
            return Ok(Judged::Passed);
        }
        if hook == Hook::Xdp && v == XDP_PASS {
            return Err("[rewrite] XDP passed a modified frame up the stack".into());
        }
        if let Some(r) = self.reject(hook, &p, input, out, fe, unused_port, reply.is_some())? {
            return Ok(r);
        }
        self.check_rewrite(hook, &p, input, out)?;
        if let Some(reason) = p.kernel_drops(input) {
            *self
                .stats
                .translated_invalid_header
                .entry(reason)
                .or_default() += 1;
        }
        let o = p.tuple_at(&out.packet);
        if let Some(mut want) = reply {
            if self
                .model
                .taken_back
                .get(&t)
                .is_some_and(|m| m.contains(&o))
            {
                self.model.replies.insert(t, o);
                want = o;
            }
            self.model.taken_back.remove(&t);
            if o != want {
                return Err(format!(
                    "[reply] the reply {t} left as {o}, its flow says {want}"
                ));
            }
            // The oracle's own view, whatever the model says.
            let Some((spec, _)) = self.world.frontend(&want.reversed()) else {
                return Err(format!(
                    "[reply] the reply {t} left from {o}, which is no frontend"
                ));
            };
            if !SPECS[spec]
                .endpoints
                .iter()
                .any(|(a, pt, _)| (*a, *pt) == (t.src, t.sport))
            {
                return Err(format!(
                    "[reply] {t} reverse-translated, but not from an endpoint of {}",
                    SPECS[spec].name
                ));
            }
            self.model.note_closing(t, p.tcp_flags, false);
            return Ok(Judged::Reply);
        }
        let Some((spec, kind)) = fe else {
            return Err(format!(
                "[forward] {t} rewritten to {o}, but it is neither for a service nor a reply of a live flow"
            ));
        };
        self.check_forward(&p, spec, kind, o)?;
        Ok(Judged::Forwarded)
    }

    /// Drops of a well-formed packet to a frontend: only the reasons the
    /// service's definition gives (or a reject that cannot be built).
    fn drop_allowed(
        &self,
        hook: Hook,
        p: &Parsed,
        input: &[u8],
        spec: usize,
        kind: Kind,
    ) -> Result<(), String> {
        let t = p.t;
        let s = &SPECS[spec];
        if s.endpoints.is_empty() {
            return self.reject_may_fail(hook, p, input);
        }
        if self.world.range_denies(spec, kind, t.src) {
            return Ok(());
        }
        let backends = self.world.backends(spec, kind, t.src);
        if backends.is_empty() {
            return Ok(());
        }
        // A port claim may fail where masqueraded flows crowd the ports:
        // for a masqueraded flow, or one from the masquerade address itself
        // that needs a port of its own.
        let crowded = |&(a, port): &(Ipv4Addr, u16)| {
            let claims = self.world.masquerades(spec, kind, t.src, a)
                || (t.src == NODE && self.model.clash(&t, (a, port)).is_some());
            let masqueraded = self.model.masqueraded.get(&(a, port, t.proto));
            claims && masqueraded.copied().unwrap_or(0) >= SNAT_PRESSURE
        };
        if backends.iter().any(crowded) {
            return Ok(());
        }
        let why = backends
            .iter()
            .map(|&(a, port)| {
                let masqueraded = self.model.masqueraded.get(&(a, port, t.proto));
                format!(
                    "{a}:{port}: {} masqueraded flows, reply tuple taken by {:?}",
                    masqueraded.copied().unwrap_or(0),
                    self.model.clash(&t, (a, port)).map(|m| m.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(format!(
            "[drop] dropped {t}, though service {} has endpoints for it ({why})",
            s.name
        ))
    }

    /// A reject the datapath may give up on (then it drops): not for a
    /// reset, nor with IP options, nor without a whole TCP header.
    fn reject_may_fail(&self, hook: Hook, p: &Parsed, input: &[u8]) -> Result<(), String> {
        if hook == Hook::Xdp {
            return Err(format!(
                "[drop] XDP dropped {}, which TC should reject",
                p.t
            ));
        }
        let tcp = p.t.proto == proto::TCP;
        if p.ihl != IPV4_HLEN
            || (tcp && (p.tcp_flags & tcp_flags::RST != 0 || input.len() < p.l4_off + 20))
        {
            return Ok(());
        }
        Err(format!(
            "[drop] dropped {}, which should have been rejected",
            p.t
        ))
    }

    /// `Some` when `out` is a reject the datapath built; checks it is allowed and well made.
    #[allow(clippy::too_many_arguments)]
    fn reject(
        &self,
        hook: Hook,
        p: &Parsed,
        input: &[u8],
        out: &Outcome,
        fe: Option<(usize, Kind)>,
        unused_port: bool,
        live_reply: bool,
    ) -> Result<Option<Judged>, String> {
        let o = &out.packet;
        if o.len() < ETH_HLEN + IPV4_HLEN + 8 || o[12..14] != [0x08, 0x00] {
            return Ok(None);
        }
        let ip = &o[ETH_HLEN..];
        let (src, dst) = (
            Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        );
        let t = p.t;
        if (src, dst) != (t.dst, t.src) {
            return Ok(None);
        }
        let l4 = &ip[((ip[0] & 0x0f) as usize * 4).min(ip.len())..];
        let rst = ip[9] == proto::TCP
            && l4.len() >= 14
            && l4[13] & tcp_flags::RST != 0
            && u16::from_be_bytes([l4[0], l4[1]]) == t.dport
            && u16::from_be_bytes([l4[2], l4[3]]) == t.sport;
        let icmp = ip[9] == proto::ICMP;
        if !rst && !icmp {
            return Ok(None);
        }
        // It is a reject: was one due?
        if hook == Hook::Xdp {
            return Err("[reject] XDP built a reject".into());
        }
        if out.verdict != TC_ACT_REDIRECT {
            return Err("[reject] a reject not sent back out".into());
        }
        let for_empty = fe.is_some_and(|(s, _)| SPECS[s].endpoints.is_empty());
        if !(for_empty || unused_port) || live_reply {
            return Err(format!(
                "[reject] rejected {t}, which has endpoints or a flow"
            ));
        }
        if t.proto == proto::TCP && p.tcp_flags & tcp_flags::RST != 0 {
            return Err(format!("[reject] answered the reset {t}"));
        }
        if p.ihl != IPV4_HLEN {
            return Err("[reject] rejected a packet with IP options".into());
        }
        // Well made: MACs swapped, a plain IPv4 header, valid checksums.
        if o[0..6] != input[6..12] || o[6..12] != input[0..6] {
            return Err("[reject] reject: MACs not swapped".into());
        }
        if ip[0] != 0x45 || packet::checksum(&[&ip[..IPV4_HLEN]]) != 0 {
            return Err("[reject] reject: bad IPv4 header".into());
        }
        let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        if t.proto == proto::TCP {
            if o.len() != ETH_HLEN + IPV4_HLEN + 20 || tot != 40 || !rst || !checksums_valid(o) {
                return Err("[reject] reject: malformed TCP reset".into());
            }
            let req = &input[p.l4_off..];
            let seq = u32::from_be_bytes([req[4], req[5], req[6], req[7]]);
            let ack = u32::from_be_bytes([req[8], req[9], req[10], req[11]]);
            let doff = (req[12] >> 4) as usize * 4;
            let payload = p.tot_len.saturating_sub(IPV4_HLEN + doff) as u32;
            let (want_seq, want_ack, want_flags) = if p.tcp_flags & tcp_flags::ACK != 0 {
                (ack, 0, tcp_flags::RST)
            } else {
                let consumed = payload
                    + u32::from(p.tcp_flags & tcp_flags::SYN != 0)
                    + u32::from(p.tcp_flags & tcp_flags::FIN != 0);
                (
                    0,
                    seq.wrapping_add(consumed),
                    tcp_flags::RST | tcp_flags::ACK,
                )
            };
            let got_seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
            let got_ack = u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]);
            if (got_seq, got_ack, l4[13]) != (want_seq, want_ack, want_flags) {
                return Err(format!(
                    "[reject] reject: RST seq/ack/flags {got_seq}/{got_ack}/{:#x}, want {want_seq}/{want_ack}/{want_flags:#x}",
                    l4[13]
                ));
            }
        } else {
            let icmp = &ip[IPV4_HLEN..];
            if o.len() != ETH_HLEN + IPV4_HLEN + 8 + IPV4_HLEN + 8
                || tot != o.len() - ETH_HLEN
                || icmp[0..2] != [3, 3]
                || packet::checksum(&[icmp]) != 0
                || icmp[8..] != input[ETH_HLEN..ETH_HLEN + IPV4_HLEN + 8]
            {
                return Err("[reject] reject: malformed ICMP port unreachable".into());
            }
        }
        Ok(Some(Judged::Rejected))
    }

    /// A translated frame: same length, only addresses, ports, checksums,
    /// TTL and (when sent on) MACs changed, checksums as valid as before.
    fn check_rewrite(
        &self,
        hook: Hook,
        p: &Parsed,
        input: &[u8],
        out: &Outcome,
    ) -> Result<(), String> {
        let o = &out.packet;
        if o.len() != input.len() {
            return Err(format!(
                "[rewrite] length changed from {} to {}",
                input.len(),
                o.len()
            ));
        }
        let ip = ETH_HLEN;
        let may_change = |i: usize| {
            i < 12
                || i == ip + 8
                || (ip + 10..ip + 20).contains(&i)
                || (p.l4_off..p.l4_off + 4).contains(&i)
                || (p.csum_off..p.csum_off + 2).contains(&i)
        };
        if let Some(i) = (0..o.len()).find(|&i| o[i] != input[i] && !may_change(i)) {
            return Err(format!("[rewrite] byte {i} changed"));
        }
        let sent = matches!(
            (hook, out.verdict),
            (Hook::Xdp, XDP_TX) | (Hook::FromPod | Hook::FromNetdev, TC_ACT_REDIRECT)
        );
        let (ttl_in, ttl_out) = (input[ip + 8], o[ip + 8]);
        if sent {
            if ttl_in <= 1 || ttl_out != ttl_in - 1 {
                return Err(format!("[rewrite] sent on with TTL {ttl_in} -> {ttl_out}"));
            }
            let macs_kept = o[0..12] == input[0..12];
            let smac_ok = o[6..12] == EXT_MAC || (hook != Hook::Xdp && o[6..12] == POD_MAC);
            let dmac_ok = NEIGHBOURS.iter().any(|(_, mac, _)| o[0..6] == *mac);
            let next_hop = smac_ok && dmac_ok;
            // bpf_redirect_neigh (TC) fills the MACs in later.
            if !(next_hop || (macs_kept && hook != Hook::Xdp)) {
                return Err("[rewrite] sent on with MACs of no next hop".into());
            }
        } else if ttl_out != ttl_in || o[0..12] != input[0..12] {
            return Err("[rewrite] TTL or MACs changed on a packet left to the stack".into());
        }
        if p.ip_valid(input) != p.ip_valid(o) {
            return Err("[rewrite] IPv4 header checksum validity changed".into());
        }
        if p.l4_sane(input) {
            if p.l4_valid(input) != p.l4_valid(o) {
                return Err("[rewrite] L4 checksum validity changed".into());
            }
            if p.ip_valid(input) && p.l4_valid(input) && !checksums_valid(o) {
                return Err("[rewrite] checksums no longer verify".into());
            }
        }
        if p.t.proto == proto::UDP
            && input[p.csum_off..p.csum_off + 2] == [0, 0]
            && o[p.csum_off..p.csum_off + 2] != [0, 0]
        {
            return Err("[rewrite] a UDP packet without checksum got one".into());
        }
        Ok(())
    }

    /// A new or established flow to frontend `kind` of `spec`, leaving as `o`.
    fn check_forward(
        &mut self,
        p: &Parsed,
        spec: usize,
        kind: Kind,
        o: Tuple,
    ) -> Result<(), String> {
        let t = p.t;
        let name = SPECS[spec].name;
        if self.world.range_denies(spec, kind, t.src) {
            return Err(format!(
                "[forward] forwarded {t} from outside the source ranges of {name}"
            ));
        }
        let backends = self.world.backends(spec, kind, t.src);
        if !backends.contains(&(o.dst, o.dport)) {
            return Err(format!(
                "[forward] {t} sent to {}:{}, not one of {name}'s endpoints {backends:?}",
                o.dst, o.dport
            ));
        }
        match self.model.forwards.get(&t) {
            // Established: judged when it was created.
            Some(prev) if *prev == o => {
                let key = o.reversed();
                let syn = p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
                if syn && p.tcp_flags & (tcp_flags::FIN | tcp_flags::RST) == 0 {
                    // Reopens a finished flow, or leaves an open one open.
                    self.model.closing.remove(&key);
                }
                if REPLY_TUPLE_CLASH_KNOWN
                    && t.proto == proto::TCP
                    && syn
                    && self.model.replies.get(&key) != Some(&t.reversed())
                {
                    let maybe = self.model.taken_back.entry(key).or_default();
                    if !maybe.contains(&t.reversed()) {
                        maybe.push(t.reversed());
                    }
                }
                return Ok(());
            }
            Some(prev) => {
                let syn = p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
                if !(t.proto == proto::TCP && syn) {
                    return Err(format!(
                        "[forward] the live flow {t} moved from {prev} to {o}"
                    ));
                }
                // A new connection on the tuple: the old flow went first.
                self.model.forget(&t);
                self.model.forward_keys.push(t);
            }
            None => self.model.forward_keys.push(t),
        }
        let masq = self.world.masquerades(spec, kind, t.src, o.dst);
        // Without masquerade the client keeps its address, and its port
        // unless another live flow's replies already come back on the
        // flow's reply tuple (then, as the kernel's NAT, a port of its own).
        let clash = self.model.clash(&t, (o.dst, o.dport)).is_some();
        let snat_port = (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&o.sport);
        let src_ok = if masq {
            o.src == NODE && snat_port
        } else if o.sport == t.sport {
            o.src == t.src
        } else {
            o.src == t.src && clash && snat_port
        };
        if !src_ok {
            return Err(format!(
                "[forward] {t} left as {o}: masquerade expected {masq}, reply tuple taken {clash}"
            ));
        }
        // A new flow: its reply tuple must not be another live flow's.
        let key = o.reversed();
        let back = t.reversed();
        let was_closed = self.model.may_be_closed(&key);
        let closing_bits = self.model.closing.get(&key).copied().unwrap_or(0);
        self.model.closing.remove(&key);
        if let Some(old) = self.model.replies.get(&key).copied()
            && old != back
            && self.model.forwards.get(&old.reversed()) == Some(&key.reversed())
            && was_closed
            && (masq || clash)
        {
            // A masquerade port claim that found no free tuple took over a
            // closed flow's: its forward half goes with it.
            self.model.forget(&old.reversed());
            self.model.forwards.insert(t, o);
            self.model.replies.insert(key, back);
            self.model.taken_back.remove(&key);
            self.stats.taken_over += 1;
            self.model.note_closing(key, p.tcp_flags, true);
            return Ok(());
        }
        if let Some(old) = self.model.replies.get(&key).copied()
            && old != back
            && self.model.forwards.get(&old.reversed()) == Some(&key.reversed())
        {
            self.model.forwards.insert(t, o);
            self.model.replies.insert(key, back);
            self.model.taken_back.remove(&key);
            let what = format!(
                "[collision] the new flow {t} -> {o} took the reply tuple of the live flow {} -> {} (seen closing: {:#x})",
                old.reversed(),
                key.reversed(),
                closing_bits
            );
            if REPLY_TUPLE_CLASH_KNOWN {
                self.stats.known_clashes += 1;
                self.stats.first_known_clash.get_or_insert(what);
                return Ok(());
            }
            return Err(what);
        }
        self.model.forwards.insert(t, o);
        self.model.taken_back.remove(&key);
        self.model.note_closing(key, p.tcp_flags, true);
        if self.model.replies.insert(key, back).is_none() {
            self.model.reply_keys.push(key);
        }
        if masq {
            *self
                .model
                .masqueraded
                .entry((o.dst, o.dport, o.proto))
                .or_default() += 1;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The node and the programs.

/// Moves this test's thread into a fresh network namespace (gone with the
/// thread): ext0 on the lan, pod0 towards this node's pods. Returns their ifindexes.
fn private_node_namespace() -> (u32, u32) {
    // SAFETY: unshare affects only this thread; child processes inherit it.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip("link set lo up");
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    for (dev, peer, mac, addr) in [
        ("ext0", "lan0", EXT_MAC, format!("{NODE}/24")),
        ("pod0", "pods0", POD_MAC, format!("{POD_GW}/24")),
    ] {
        ip(&format!(
            "link add {dev} address {} type veth peer name {peer}",
            mac_str(mac)
        ));
        ip(&format!("link set {peer} up"));
        ip(&format!("link set {dev} up"));
        ip(&format!("addr add {addr} dev {dev}"));
    }
    for (addr, mac, pod_side) in NEIGHBOURS {
        let dev = if pod_side { "pod0" } else { "ext0" };
        ip(&format!(
            "neigh add {addr} lladdr {} dev {dev} nud permanent",
            mac_str(mac)
        ));
    }
    ip(&format!("route add 198.18.2.0/24 via {PEER_NODE} dev ext0"));
    (ifindex("ext0"), ifindex("pod0"))
}

struct Fixture {
    ebpf: Ebpf,
    _maps: KernelMaps,
    ext: u32,
    pod: u32,
}

impl Fixture {
    fn new(conntrack: u32, specs: &[Spec]) -> Self {
        let (ext, pod) = private_node_namespace();
        let sizes = MapSizes {
            services: 4096,
            backends: 4096,
            conntrack,
            ..MapSizes::default()
        };
        let mut ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
        let (mut maps, _stats) = KernelMaps::take(&mut ebpf).unwrap();
        // Flows never expire during a run: the oracle's model keeps them all.
        let config = DatapathConfig {
            tcp_established_ns: HOUR_NS,
            tcp_closing_ns: HOUR_NS,
            udp_ns: HOUR_NS,
            udp_stream_ns: HOUR_NS,
            tcp_syn_sent_ns: HOUR_NS,
            tcp_time_wait_ns: HOUR_NS,
            tcp_close_ns: HOUR_NS,
            masquerade_addr_be: u32::from(NODE).to_be(),
            flags: flags::DETECT_LOCAL_BY_CIDR,
            snat_port_min: SNAT_PORT_MIN,
            snat_port_max: SNAT_PORT_MAX,
            snat_port_min2: 0,
            snat_port_max2: 0,
            host_netns_cookie: 0,
        };
        let facts = NodeFacts {
            config,
            config6: Default::default(),
            local_pod_cidrs: [POD_CIDR.parse().unwrap()].into(),
            service_cidrs: Default::default(),
            ifaces: [
                (
                    ext,
                    IfaceInfo {
                        flags: iface::EXTERNAL,
                    },
                ),
                (
                    pod,
                    IfaceInfo {
                        flags: iface::LOCAL_POD,
                    },
                ),
            ]
            .into(),
            addresses: NodeAddresses {
                primary: Some(NODE),
                node_ports: vec![NODE],
                localhost_node_ports: false,
                host: Default::default(),
            },
            addresses6: Default::default(),
            external_interfaces: [("ext0".to_string(), ext)].into(),
        };
        NodeProgrammer::new().apply(&facts, &mut maps).unwrap();
        let state = DesiredState {
            services: specs
                .iter()
                .map(|s| {
                    let d = s.desired();
                    (d.name.clone(), d)
                })
                .collect(),
            ..DesiredState::default()
        };
        let mut programmer = Programmer::new();
        programmer
            .set_node_addresses(&facts.addresses, &facts.addresses6, &state, &mut maps)
            .unwrap();
        programmer.sync(&state, &mut maps).unwrap();
        Fixture {
            ebpf,
            _maps: maps,
            ext,
            pod,
        }
    }

    fn run(&self, hook: Hook, pkt: &[u8]) -> anyhow::Result<Outcome> {
        let ifindex = if hook == Hook::FromPod {
            self.pod
        } else {
            self.ext
        };
        test_run::run(&self.ebpf, hook, pkt, ifindex, 1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim().replace('_', "");
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        }
        Err(_) => default,
    }
}

fn program_name(hook: Hook) -> &'static str {
    match hook {
        Hook::FromPod => "tc_from_pod",
        Hook::FromNetdev => "tc_from_netdev",
        Hook::Xdp => "xdp_from_netdev",
        Hook::FromHost => "tc_from_host",
    }
}

fn fuzz(hook: Hook) {
    let packets = env_u64(PACKETS_VAR, DEFAULT_PACKETS);
    let seed = env_u64(SEED_VAR, DEFAULT_SEED);
    // Room for every flow of the run (two entries each) without eviction.
    let conntrack = (packets.next_power_of_two() as u32).clamp(1 << 16, 1 << 21);
    let fx = Fixture::new(conntrack, SPECS);
    let world = World::new();
    let generator = Generator { world: &world };
    let mut oracle = Oracle::new(&world);
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    for index in 0..packets {
        let (class, pkt) = generator.next(&mut rng, &oracle.model);
        oracle.run(&fx, hook, index, class, &pkt);
    }
    let elapsed = start.elapsed();
    report(hook, seed, &oracle, elapsed);
}

fn report(hook: Hook, seed: u64, oracle: &Oracle, elapsed: std::time::Duration) {
    let s = &oracle.stats;
    let list = |m: &mut dyn Iterator<Item = (String, u64)>| {
        m.map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let r = |k| s.results.get(&k).copied().unwrap_or(0);
    let followups = match hook {
        Hook::Xdp => format!(
            "; then tc_from_netdev on the {} XDP_PASS of TCP/UDP [{}]",
            s.followups,
            list(
                &mut s
                    .followup_results
                    .iter()
                    .map(|(k, v)| (format!("{k:?}").to_lowercase(), *v))
            )
        ),
        _ => String::new(),
    };
    println!(
        "fuzz {}: {} packets, verdicts [{}]; forwarded {}, replies {}, rejected {}, dropped {}, passed {}, refused by the kernel {}{followups}; \
         {} flows ({} on a closed flow's reply tuple), {}/256 TCP flag combinations, translated although ip_rcv would drop them [{}]; {} violations; {:.1} s (seed {seed:#x})",
        program_name(hook),
        s.packets,
        list(&mut s.verdicts.iter().map(|(k, v)| (k.clone(), *v))),
        r(Judged::Forwarded),
        r(Judged::Reply),
        r(Judged::Rejected),
        r(Judged::Dropped),
        r(Judged::Passed),
        r(Judged::Refused),
        oracle.model.forwards.len(),
        s.taken_over,
        s.tcp_flag_combinations.len(),
        list(
            &mut s
                .translated_invalid_header
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
        ),
        oracle.violation_count,
        elapsed.as_secs_f64(),
    );
    if let Some(first) = &s.first_known_clash {
        println!(
            "fuzz {}: known bug, not failed: {} new flows took a live flow's reply tuple, the first: {first}",
            program_name(hook),
            s.known_clashes
        );
    }
    if oracle.violation_count > 0 {
        let mut msg = format!(
            "{} invariant violations in {} ({:?}), the first of each:\n",
            oracle.violation_count,
            program_name(hook),
            oracle.by_invariant,
        );
        for v in &oracle.violations {
            msg += &format!(
                "  #{} ({:?}, {}): {}\n    in : {}\n    out: {} {}\n",
                v.index,
                v.class,
                program_name(v.hook),
                v.what,
                hex(&v.input),
                v.verdict
                    .map_or("error".into(), |x| verdict_name(v.hook, x)),
                hex(&v.output),
            );
        }
        panic!("{msg}");
    }
}

#[test]
fn fuzz_tc_from_pod() {
    fuzz(Hook::FromPod);
}

#[test]
fn fuzz_tc_from_netdev() {
    fuzz(Hook::FromNetdev);
}

#[test]
fn fuzz_xdp_from_netdev() {
    fuzz(Hook::Xdp);
}

// ---------------------------------------------------------------------------
// Regression cases the fuzzer found, minimised.

fn send(fx: &Fixture, hook: Hook, t: Tuple, flags: u8) -> Tuple {
    let frame = Frame {
        src: t.src.into(),
        dst: t.dst.into(),
        sport: t.sport,
        dport: t.dport,
        proto: t.proto,
    };
    let mut pkt = frame.build(b"q");
    if t.proto == proto::TCP {
        pkt[ETH_HLEN + IPV4_HLEN + 13] = flags;
        packet::fix_checksums(&mut pkt);
    }
    let out = fx.run(hook, &pkt).expect("BPF_PROG_TEST_RUN");
    assert!(
        matches!(out.verdict, TC_ACT_OK | TC_ACT_REDIRECT),
        "{t}: verdict {}",
        out.verdict
    );
    assert!(checksums_valid(&out.packet), "{t}: checksums");
    let f = Frame::parse(&out.packet).unwrap();
    let v4 = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(a) => a,
        std::net::IpAddr::V6(a) => panic!("{t}: left as IPv6 {a}"),
    };
    Tuple {
        src: v4(f.src),
        sport: f.sport,
        dst: v4(f.dst),
        dport: f.dport,
        proto: f.proto,
    }
}

/// One client port reaching one endpoint through two frontends, neither
/// masqueraded: both flows would have the same reply tuple (endpoint ->
/// client:port). The second flow overwrites the first's reply state, so
/// the first connection's replies come back from the second frontend (and
/// the client refuses them). What is expected: as the kernel's NAT picks a
/// unique tuple, the second flow keeps the client's address but gets a
/// source port of its own. (A fix doing that, 9d72f69 with the new_flow
/// part of fd71e21, was taken back out: tests/kernel/datapath_frontends.rs's
/// external_traffic_policy_local_keeps_the_client_address sends one client
/// port to three frontends of one service and expects the port kept.)
fn one_client_port_two_frontends(specs: &[Spec], first: Tuple, second: Tuple) {
    let backend = (specs[0].endpoints[0].0, specs[0].endpoints[0].1);
    for hook in [Hook::FromPod, Hook::FromNetdev] {
        let fx = Fixture::new(1 << 12, specs);
        let syn = tcp_flags::SYN;
        let a = send(&fx, hook, first, syn);
        assert_eq!(
            a,
            Tuple {
                dst: backend.0,
                dport: backend.1,
                ..first
            },
            "{hook:?}"
        );
        let b = send(&fx, hook, second, syn);
        assert_eq!(
            (b.src, b.dst, b.dport),
            (second.src, backend.0, backend.1),
            "{hook:?}"
        );
        let synack = tcp_flags::SYN | tcp_flags::ACK;
        let back_a = send(&fx, hook, a.reversed(), synack);
        assert_eq!(back_a, first.reversed(), "{hook:?}: the first flow's reply");
        assert_ne!(
            b.sport, a.sport,
            "{hook:?}: the second flow needs a reply tuple of its own"
        );
        assert!(
            (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&b.sport),
            "{hook:?}: {b}"
        );
        let back_b = send(&fx, hook, b.reversed(), synack);
        assert_eq!(
            back_b,
            second.reversed(),
            "{hook:?}: the second flow's reply"
        );
        // Both stay on their own tuples.
        assert_eq!(send(&fx, hook, first, tcp_flags::ACK), a, "{hook:?}");
        assert_eq!(send(&fx, hook, second, tcp_flags::ACK), b, "{hook:?}");
    }
}

/// As the fuzzer found it (xdp_from_netdev run #2798, then tc_from_pod and
/// tc_from_netdev): a pod of this node to the cluster IP, then from the
/// same port to the LB IP of an externalTrafficPolicy Local service (a
/// local client short-circuits the policy, unmasqueraded).
#[test]
fn regression_a_pod_port_to_the_cluster_ip_and_lb_ip_of_one_service() {
    const SPECS: &[Spec] = &[Spec {
        node_port: Some(30083),
        lb_ip: Some(LOCAL_LB_IP),
        etp_local: true,
        ..Spec::cluster_ip(
            "local",
            Protocol::Tcp,
            LOCAL_VIP,
            80,
            &[(REMOTE_A, 9090, false)],
        )
    }];
    let first = Tuple {
        src: LOCAL_POD,
        sport: 40038,
        dst: LOCAL_VIP,
        dport: 80,
        proto: proto::TCP,
    };
    let second = Tuple {
        dst: LOCAL_LB_IP,
        ..first
    };
    one_client_port_two_frontends(SPECS, first, second);
}

/// The everyday form: two Services selecting the same pods, a pod
/// reaching both from one source port.
#[test]
fn regression_a_pod_port_to_two_services_on_one_endpoint() {
    const ENDPOINT: &[(Ipv4Addr, u16, bool)] = &[(LOCAL_A, 8080, true)];
    const WEB: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 20);
    const ALIAS: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 21);
    const SPECS: &[Spec] = &[
        Spec::cluster_ip("web", Protocol::Tcp, WEB, 80, ENDPOINT),
        Spec::cluster_ip("web-alias", Protocol::Tcp, ALIAS, 80, ENDPOINT),
    ];
    let first = Tuple {
        src: LOCAL_POD,
        sport: 40000,
        dst: WEB,
        dport: 80,
        proto: proto::TCP,
    };
    let second = Tuple {
        dst: ALIAS,
        ..first
    };
    one_client_port_two_frontends(SPECS, first, second);
}

/// Found by the fuzzer in CI: an IPv6 frame whose SCTP header stops inside
/// its first chunk header; the datapath drops it as malformed, which the
/// oracle must allow (it once took SCTP for a protocol nobody parses).
#[test]
fn regression_truncated_ipv6_sctp_may_be_dropped() {
    let hex = "dcd5adbc99e5b592b9d4f7a986dd62e69a9419e08404b1501d8d4c85a2e8b1c122aee4377f917679f48f0355a2b2602853165e51a7cb74412bbf39dd5f0dfd63209d9f39db";
    let frame: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(frame[20], SCTP, "next header");
    assert!(Shape::of(&frame).malformed());
    // The same frame with its chunk header whole is not malformed.
    let mut whole = frame.clone();
    whole.extend_from_slice(&[0, 0]);
    whole[18..20].copy_from_slice(&16u16.to_be_bytes());
    assert!(!Shape::of(&whole).malformed());
}

/// Found by the fuzzer in CI (tc_from_netdev #19213, tc_from_pod #19514):
/// SCTP to port 80 of a cluster IP whose ports serve only TCP and UDP is
/// rejected, as upstream's `cluster-ips` reject rule does for any protocol;
/// the oracle once required every SCTP packet to pass untouched. Elsewhere
/// SCTP still passes untouched.
#[test]
fn regression_sctp_to_an_unserved_cluster_ip_port_is_rejected() {
    let fx = Fixture::new(1 << 12, SPECS);
    let world = World::new();
    let mut oracle = Oracle::new(&world);
    let to = |dst: Ipv4Addr| {
        Frame {
            src: Ipv4Addr::new(198, 18, 9, 9).into(),
            dst: dst.into(),
            sport: 40039,
            dport: 80,
            proto: proto::SCTP,
        }
        .build(&[])
    };
    let to_vip = to(EMPTY_VIP);
    let elsewhere = to(Ipv4Addr::new(198, 18, 200, 1));
    for (index, hook) in [Hook::FromPod, Hook::FromNetdev, Hook::Xdp]
        .into_iter()
        .enumerate()
    {
        for pkt in [&to_vip, &elsewhere] {
            oracle.run(&fx, hook, index as u64, Class::ToFrontend, pkt);
        }
    }
    let violations: Vec<String> = oracle.violations.iter().map(|v| v.what.clone()).collect();
    assert!(violations.is_empty(), "{violations:#?}");
    let r = |k| oracle.stats.results.get(&k).copied().unwrap_or(0);
    // tc_from_pod, tc_from_netdev, and tc_from_netdev after XDP_PASS.
    assert_eq!(
        r(Judged::Rejected)
            + oracle
                .stats
                .followup_results
                .get(&Judged::Rejected)
                .copied()
                .unwrap_or(0),
        3
    );
    // XDP passes both up; TC passes the one for no cluster IP.
    assert_eq!(r(Judged::Passed), 4);
}
