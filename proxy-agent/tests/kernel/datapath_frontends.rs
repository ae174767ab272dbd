//! The real programs in the real kernel, for every frontend kind and rule of
//! the service datapath: NodePort / LB / external IP / ClusterIP, traffic
//! policies, masquerade, source ranges, reject packets, FIB redirect, XDP
//! and conntrack timeouts. Packets go through BPF_PROG_TEST_RUN; verdicts
//! and output bytes are checked. Each test runs in a network namespace of
//! its own thread (unshare), holding just the routes the FIB lookups need,
//! so nothing is sent anywhere and nothing outlives the test. Needs root.
//!
//! Each test is a [`Scenario`]: the node's datapath configuration and
//! services, then a table of packets (hook, packet in, verdict, checks on the
//! packet out) and counters, played by [`Datapath::play`].

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use ipnet::IpNet;
use proxy_agent::{
    cli::packet::Frame,
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{self, maps::NodeMaps, node::NodeAddresses, test_run::Hook},
};
use proxy_common::{
    Counter, DatapathConfig, IfaceInfo,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP, XDP_PASS, XDP_TX},
    config::{flags, iface},
};

use crate::tester::{
    Datapath, In, Out::*, Step, counters, ifindex, ip, mac_str, pkt, rst, send, syn, with_ttl,
};
use Hook::{FromNetdev, FromPod, Xdp};

const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER_NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
const LOCAL_BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const REMOTE_BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
/// The cluster IP of most ClusterIP scenarios.
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 14);
const POD_CIDR: &str = "198.18.1.0/24";
const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
const TARGET: u16 = 8080;
/// Pod runs arrive on this interface (the namespace's loopback).
const POD_IFINDEX: u32 = 1;

/// Moves this test's thread into a fresh network namespace (gone when the
/// thread ends) with a one-armed node: `ext0` on the lan with the peer node
/// and the client as permanent neighbours, and a route to the peer's pods.
fn private_node_namespace() -> u32 {
    // SAFETY: unshare affects only this thread; child processes inherit it.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip("link set lo up");
    // /proc/sys/net follows the reading thread's namespace.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    ip(&format!(
        "link add ext0 address {} type veth peer name lan0",
        mac_str(NODE_MAC)
    ));
    ip("link set lan0 up");
    ip("link set ext0 up");
    ip(&format!("addr add {NODE}/24 dev ext0"));
    ip(&format!(
        "neigh add {PEER_NODE} lladdr {} dev ext0 nud permanent",
        mac_str(PEER_MAC)
    ));
    ip(&format!(
        "neigh add {CLIENT} lladdr {} dev ext0 nud permanent",
        mac_str(CLIENT_MAC)
    ));
    ip(&format!("route add 198.18.2.0/24 via {PEER_NODE} dev ext0"));
    ifindex("ext0")
}

/// A node, its services, and the packets that go through it.
struct Scenario {
    config: DatapathConfig,
    services: Vec<DesiredService>,
    steps: Vec<Step>,
}

impl Scenario {
    fn run(self) {
        let mut node = node(self.config);
        node.program(self.services);
        node.play(self.steps);
    }
}

/// The datapath of a node in a namespace of this test's thread, loaded with
/// `config`, with its pod CIDR and address.
fn node(config: DatapathConfig) -> Datapath {
    let ext = private_node_namespace();
    // Small maps: these tests run in parallel and need a few entries each.
    let sizes = ebpf::MapSizes {
        services: 4096,
        backends: 4096,
        conntrack: 4096,
    };
    let ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
    let mut dp = Datapath::new(ebpf, POD_IFINDEX, ext);
    dp.maps.put_config(&config).unwrap();
    dp.maps
        .put_local_pod_cidr(POD_CIDR.parse::<IpNet>().unwrap())
        .unwrap();
    dp.programmer
        .set_node_addresses(
            &NodeAddresses {
                primary: Some(NODE),
                node_ports: vec![NODE],
                localhost_node_ports: false,
                host: Default::default(),
            },
            &Default::default(),
            &DesiredState::default(),
            &mut dp.maps,
        )
        .unwrap();
    dp
}

/// Masquerade to the node, with `flags`.
fn masquerading(flags: u32) -> DatapathConfig {
    DatapathConfig {
        masquerade_addr_be: u32::from(NODE).to_be(),
        flags,
        ..DatapathConfig::default()
    }
}

/// Masquerade to the node, pods detected by the pod CIDR.
fn standard() -> DatapathConfig {
    masquerading(flags::DETECT_LOCAL_BY_CIDR)
}

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "e2e".into(),
        name: name.into(),
        port_name: protocol.to_string(),
        protocol,
    }
}

fn endpoint(ip: Ipv4Addr, local: bool) -> Endpoint {
    Endpoint {
        is_local: local,
        ..Endpoint::new(IpAddr::V4(ip), TARGET)
    }
}

/// An externally reachable service port: NodePort `node_port` plus the given LB and external IPs.
fn external(
    name: &str,
    protocol: Protocol,
    vip: Ipv4Addr,
    node_port: u16,
    endpoints: Vec<Endpoint>,
) -> DesiredService {
    let local: Vec<Endpoint> = endpoints.iter().filter(|e| e.is_local).cloned().collect();
    DesiredService {
        node_port: Some(node_port),
        local_endpoints: local,
        ..DesiredService::cluster_ip(spn(name, protocol), vec![IpAddr::V4(vip)], 80, endpoints)
    }
}

/// A ClusterIP service port `vip:port` of `protocol`.
fn cluster_ip(
    name: &str,
    protocol: Protocol,
    vip: Ipv4Addr,
    port: u16,
    endpoints: Vec<Endpoint>,
) -> DesiredService {
    DesiredService::cluster_ip(spn(name, protocol), vec![IpAddr::V4(vip)], port, endpoints)
}

/// CLUSTER_IP:80/TCP to the remote backend.
fn web() -> DesiredService {
    cluster_ip(
        "web",
        Protocol::Tcp,
        CLUSTER_IP,
        80,
        vec![endpoint(REMOTE_BACKEND, false)],
    )
}

/// NodePort 30080 (and 198.19.0.10:80) to the remote backend.
fn remote(protocol: Protocol) -> DesiredService {
    external(
        "remote",
        protocol,
        Ipv4Addr::new(198, 19, 0, 10),
        30080,
        vec![endpoint(REMOTE_BACKEND, false)],
    )
}

#[test]
fn nodeport_from_outside_through_xdp_is_balanced_masqueraded_and_sent_back_out() {
    Scenario {
        config: standard(),
        services: vec![remote(Protocol::Tcp)],
        steps: vec![
            // eTP Cluster masquerades to the node; one-armed node: back out of
            // ext0, to the peer node as next hop.
            send(
                Xdp,
                syn(CLIENT, 40000, NODE, 30080),
                XDP_TX,
                [
                    To(REMOTE_BACKEND, TARGET),
                    Src(NODE),
                    MasqueradePort,
                    EthDst(PEER_MAC),
                    EthSrc(NODE_MAC),
                    Ttl(63),
                ],
            ),
            // The backend's reply: reverse SNAT and DNAT.
            send(
                Xdp,
                In::Reply(b""),
                XDP_TX,
                [
                    Is(Frame::tcp(NODE, 30080, CLIENT, 40000)),
                    EthDst(CLIENT_MAC),
                ],
            ),
            counters([(Counter::XdpTx, 2), (Counter::Masqueraded, 1)]),
        ],
    }
    .run();
}

#[test]
fn nodeport_from_outside_through_tc_is_redirected_by_the_fib() {
    Scenario {
        config: standard(),
        services: vec![remote(Protocol::Udp)],
        steps: vec![
            send(
                FromNetdev,
                pkt(Frame::udp(CLIENT, 40000, NODE, 30080), b"hello"),
                TC_ACT_REDIRECT,
                [
                    Src(NODE),
                    To(REMOTE_BACKEND, TARGET),
                    EthDst(PEER_MAC),
                    Ttl(63),
                ],
            ),
            send(
                FromNetdev,
                In::Reply(b"hi"),
                TC_ACT_REDIRECT,
                [Is(Frame::udp(NODE, 30080, CLIENT, 40000))],
            ),
            counters([(Counter::FibRedirect, 2)]),
        ],
    }
    .run();
}

#[test]
fn external_traffic_policy_local_drops_without_a_local_endpoint_but_pods_short_circuit() {
    Scenario {
        config: standard(),
        services: vec![DesiredService {
            external_policy_local: true,
            ..external(
                "local",
                Protocol::Tcp,
                Ipv4Addr::new(198, 19, 0, 11),
                30081,
                vec![endpoint(REMOTE_BACKEND, false)],
            )
        }],
        steps: vec![
            send(Xdp, syn(CLIENT, 40000, NODE, 30081), XDP_DROP, []),
            send(FromNetdev, syn(CLIENT, 40000, NODE, 30081), TC_ACT_SHOT, []),
            counters([(Counter::DropNoLocalEndpoints, 2)]),
            // No masquerade for short-circuited pod traffic.
            send(
                FromPod,
                syn(LOCAL_POD, 40001, NODE, 30081),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(LOCAL_POD, 40001, REMOTE_BACKEND, TARGET))],
            ),
        ],
    }
    .run();
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address() {
    let lb = Ipv4Addr::new(198, 18, 3, 21);
    let eip = Ipv4Addr::new(198, 18, 3, 31);
    let frontends = [(NODE, 30081), (lb, 80), (eip, 80)];
    Scenario {
        config: standard(),
        services: vec![DesiredService {
            external_policy_local: true,
            load_balancer_ips: vec![IpAddr::V4(lb)],
            external_ips: vec![IpAddr::V4(eip)],
            ..external(
                "local",
                Protocol::Tcp,
                Ipv4Addr::new(198, 19, 0, 11),
                30081,
                vec![
                    endpoint(LOCAL_BACKEND, true),
                    endpoint(REMOTE_BACKEND, false),
                ],
            )
        }],
        // One client port per frontend: the three flows end at one endpoint,
        // so a shared port would give them one reply tuple (and the second
        // flow a port of its own, as the kernel's NAT does).
        steps: frontends
            .into_iter()
            .zip(40000u16..)
            .flat_map(|((dst, port), sport)| {
                [
                    // XDP only finishes frames that leave where they came in;
                    // this one is left untouched for TC, which finds the flow
                    // XDP created.
                    send(Xdp, syn(CLIENT, sport, dst, port), XDP_PASS, [Unchanged]),
                    send(
                        FromNetdev,
                        syn(CLIENT, sport, dst, port),
                        TC_ACT_OK,
                        [Is(Frame::tcp(CLIENT, sport, LOCAL_BACKEND, TARGET))],
                    ),
                ]
            })
            .chain([counters([(Counter::NewFlow, 3), (Counter::Established, 3)])])
            .collect(),
    }
    .run();
}

#[test]
fn load_balancer_source_ranges_apply_to_lb_ips_only() {
    let lb = Ipv4Addr::new(198, 18, 3, 23);
    Scenario {
        config: standard(),
        services: vec![DesiredService {
            load_balancer_ips: vec![IpAddr::V4(lb)],
            load_balancer_source_ranges: vec!["198.18.0.100/32".parse().unwrap()],
            ..external(
                "ranged",
                Protocol::Tcp,
                Ipv4Addr::new(198, 19, 0, 13),
                30083,
                vec![endpoint(REMOTE_BACKEND, false)],
            )
        }],
        steps: vec![
            send(
                FromNetdev,
                syn(CLIENT, 40000, lb, 80),
                TC_ACT_REDIRECT,
                [Dst(REMOTE_BACKEND)],
            ),
            send(
                FromNetdev,
                syn(OTHER_CLIENT, 40000, lb, 80),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSourceRange, 1)]),
            // Node ports ignore source ranges.
            send(
                FromNetdev,
                syn(OTHER_CLIENT, 40001, NODE, 30083),
                TC_ACT_REDIRECT,
                [Dst(REMOTE_BACKEND)],
            ),
        ],
    }
    .run();
}

#[test]
fn no_endpoints_are_rejected_with_rst_and_icmp_for_every_frontend_kind() {
    let vip = Ipv4Addr::new(198, 19, 0, 12);
    let lb = Ipv4Addr::new(198, 18, 3, 22);
    let eip = Ipv4Addr::new(198, 18, 3, 32);
    let empty = |protocol| DesiredService {
        load_balancer_ips: vec![IpAddr::V4(lb)],
        external_ips: vec![IpAddr::V4(eip)],
        ..external("empty", protocol, vip, 30082, vec![])
    };
    let frontends = [
        (FromPod, LOCAL_POD, vip, 80),
        (FromNetdev, CLIENT, NODE, 30082),
        (FromNetdev, CLIENT, lb, 80),
        (FromNetdev, CLIENT, eip, 80),
    ];
    Scenario {
        config: standard(),
        services: vec![empty(Protocol::Tcp), empty(Protocol::Udp)],
        steps: frontends
            .into_iter()
            .flat_map(|(hook, src, dst, port)| {
                [
                    // Both sent back out where they came from.
                    send(hook, syn(src, 40000, dst, port), TC_ACT_REDIRECT, [Rst]),
                    send(
                        hook,
                        pkt(Frame::udp(src, 40000, dst, port), b"ping"),
                        TC_ACT_REDIRECT,
                        [PortUnreachable],
                    ),
                ]
            })
            .chain([
                // The XDP program leaves rejects to TC.
                send(Xdp, syn(CLIENT, 40000, NODE, 30082), XDP_PASS, []),
                counters([(Counter::RejectNoEndpoints, 8)]),
            ])
            .collect(),
    }
    .run();
}

#[test]
fn unused_port_of_a_cluster_ip_is_rejected_and_a_reset_is_never_answered() {
    Scenario {
        config: standard(),
        services: vec![web()],
        steps: vec![
            send(
                FromPod,
                syn(LOCAL_POD, 40000, CLUSTER_IP, 81),
                TC_ACT_REDIRECT,
                [Rst],
            ),
            counters([(Counter::RejectUnknownPort, 1)]),
            send(
                FromPod,
                rst(Frame::tcp(LOCAL_POD, 40000, CLUSTER_IP, 81)),
                TC_ACT_SHOT,
                [],
            ),
        ],
    }
    .run();
}

#[test]
fn hairpin_and_cluster_ip_masquerade_follow_the_local_detector() {
    Scenario {
        config: standard(),
        services: vec![cluster_ip(
            "self",
            Protocol::Tcp,
            CLUSTER_IP,
            80,
            vec![endpoint(LOCAL_BACKEND, true)],
        )],
        steps: vec![
            // The endpoint reaching itself is masqueraded so its reply comes
            // back through the node.
            send(
                FromPod,
                syn(LOCAL_BACKEND, 40000, CLUSTER_IP, 80),
                TC_ACT_OK,
                [Src(NODE), To(LOCAL_BACKEND, TARGET), MasqueradePort],
            ),
            send(
                FromPod,
                In::Reply(b""),
                TC_ACT_OK,
                [Is(Frame::tcp(CLUSTER_IP, 80, LOCAL_BACKEND, 40000))],
            ),
            // Another local pod keeps its address; a source outside the pod
            // CIDR is masqueraded.
            send(
                FromPod,
                syn(LOCAL_POD, 40000, CLUSTER_IP, 80),
                TC_ACT_OK,
                [Src(LOCAL_POD)],
            ),
            send(
                FromNetdev,
                syn(CLIENT, 40000, CLUSTER_IP, 80),
                TC_ACT_OK,
                [Src(NODE)],
            ),
        ],
    }
    .run();
}

#[test]
fn masquerade_all_masquerades_pod_traffic_to_cluster_ips() {
    Scenario {
        config: masquerading(flags::DETECT_LOCAL_BY_CIDR | flags::MASQUERADE_ALL),
        services: vec![web()],
        steps: vec![send(
            FromPod,
            syn(LOCAL_POD, 40000, CLUSTER_IP, 80),
            TC_ACT_REDIRECT,
            [Src(NODE)],
        )],
    }
    .run();
}

#[test]
fn conntrack_timeouts_from_the_config_expire_flows() {
    let req = || pkt(Frame::udp(LOCAL_POD, 40000, CLUSTER_IP, 53), b"q");
    Scenario {
        config: DatapathConfig {
            udp_ns: 50_000_000,
            udp_stream_ns: 50_000_000,
            ..DatapathConfig::default()
        },
        services: vec![cluster_ip(
            "dns",
            Protocol::Udp,
            CLUSTER_IP,
            53,
            vec![endpoint(REMOTE_BACKEND, false)],
        )],
        steps: vec![
            send(FromPod, req(), TC_ACT_REDIRECT, []),
            send(FromPod, req(), TC_ACT_REDIRECT, []),
            counters([(Counter::NewFlow, 1), (Counter::Established, 1)]),
            Step::Wait(Duration::from_millis(120)),
            // The idle flow expired after udpTimeout.
            send(FromPod, req(), TC_ACT_REDIRECT, []),
            counters([(Counter::NewFlow, 2)]),
        ],
    }
    .run();
}

#[test]
fn forwarded_packets_at_ttl_one_are_left_to_the_kernel() {
    Scenario {
        config: standard(),
        services: vec![remote(Protocol::Tcp)],
        steps: vec![
            // The stack sends time-exceeded.
            send(
                FromNetdev,
                with_ttl(Frame::tcp(CLIENT, 40000, NODE, 30080), 1),
                TC_ACT_OK,
                [Ttl(1)],
            ),
        ],
    }
    .run();
}

#[test]
fn internal_traffic_policy_local_uses_only_this_nodes_endpoints() {
    let vip = Ipv4Addr::new(198, 19, 0, 15);
    let other_vip = Ipv4Addr::new(198, 19, 0, 16);
    let local = DesiredService {
        internal_policy_local: true,
        local_endpoints: vec![endpoint(LOCAL_BACKEND, true)],
        ..cluster_ip(
            "itp",
            Protocol::Tcp,
            vip,
            80,
            vec![
                endpoint(LOCAL_BACKEND, true),
                endpoint(REMOTE_BACKEND, false),
            ],
        )
    };
    let remote_only = DesiredService {
        internal_policy_local: true,
        ..cluster_ip(
            "itp-remote",
            Protocol::Tcp,
            other_vip,
            80,
            vec![endpoint(REMOTE_BACKEND, false)],
        )
    };
    Scenario {
        config: standard(),
        services: vec![local, remote_only],
        steps: (40000..40020)
            // Only the local endpoint.
            .map(|sport| {
                send(
                    FromPod,
                    syn(LOCAL_POD, sport, vip, 80),
                    TC_ACT_OK,
                    [Dst(LOCAL_BACKEND)],
                )
            })
            .chain([
                // Endpoints only elsewhere: dropped, not rejected.
                send(
                    FromPod,
                    syn(LOCAL_POD, 40000, other_vip, 80),
                    TC_ACT_SHOT,
                    [],
                ),
                counters([(Counter::DropNoLocalEndpoints, 1)]),
            ])
            .collect(),
    }
    .run();
}

#[test]
fn interface_based_local_detection_decides_cluster_ip_masquerade() {
    Scenario {
        config: masquerading(flags::DETECT_LOCAL_BY_INTERFACE),
        services: vec![web()],
        steps: vec![
            // The interface pod runs arrive on is not yet a pod interface.
            send(
                FromPod,
                syn(LOCAL_POD, 40000, CLUSTER_IP, 80),
                TC_ACT_REDIRECT,
                [Src(NODE)],
            ),
            Step::Setup(|dp| {
                let pod = IfaceInfo {
                    flags: iface::LOCAL_POD,
                };
                dp.maps.put_iface(POD_IFINDEX, &pod).unwrap();
            }),
            send(
                FromPod,
                syn(LOCAL_POD, 40001, CLUSTER_IP, 80),
                TC_ACT_REDIRECT,
                [Src(LOCAL_POD)],
            ),
        ],
    }
    .run();
}

#[test]
fn a_masquerade_port_is_never_taken_from_a_live_flow() {
    Scenario {
        config: DatapathConfig {
            snat_port_min: 62000,
            snat_port_max: 62000,
            // The flows below stay unanswered: SYN_SENT is their state.
            tcp_syn_sent_ns: 100_000_000,
            ..standard()
        },
        services: vec![remote(Protocol::Tcp)],
        steps: vec![
            send(
                FromNetdev,
                syn(CLIENT, 40000, NODE, 30080),
                TC_ACT_REDIRECT,
                [SrcPort(62000)],
            ),
            // The only port is in use.
            send(
                FromNetdev,
                syn(OTHER_CLIENT, 40000, NODE, 30080),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSnatExhausted, 1)]),
            // Once the first flow has idled out, its port is free again.
            Step::Wait(Duration::from_millis(200)),
            send(
                FromNetdev,
                syn(OTHER_CLIENT, 40001, NODE, 30080),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(NODE, 62000, REMOTE_BACKEND, TARGET))],
            ),
        ],
    }
    .run();
}
