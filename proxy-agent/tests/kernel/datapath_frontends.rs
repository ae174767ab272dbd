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
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::IpNet;
use proxy_agent::{
    cli::packet::{Frame, tcp_flags},
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName, SessionAffinity},
    modes::ebpf::{
        self,
        family::AgentFamily,
        maps::NodeMaps,
        node::{NodeAddresses, NodeAddressesOf},
        test_run::Hook,
    },
};
use proxy_common::{
    Counter, DatapathConfig, DatapathConfig6, IfaceInfo, V6,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP, XDP_PASS, XDP_TX},
    config::{flags, iface},
};

use crate::tester::{
    Datapath, In, Out::*, Step, counters, ifindex, in_both_families, ip, mac_str, pkt, rst, send,
    stay_on_this_cpu, syn, tcp_data, tcp_segment, with_ttl,
};
use Hook::{FromNetdev, FromPod, Xdp};

/// A node's addresses, its neighbours' and its services' in one family.
pub(crate) struct Net {
    pub node: IpAddr,
    pub peer_node: IpAddr,
    pub client: IpAddr,
    pub other_client: IpAddr,
    pub local_pod: IpAddr,
    pub local_backend: IpAddr,
    pub remote_backend: IpAddr,
    /// The cluster IP of most ClusterIP scenarios.
    pub cluster_ip: IpAddr,
    /// This node's pods.
    pub pod_cidr: &'static str,
    /// The peer node's pods, routed through it.
    pub remote_pods: &'static str,
    /// The prefix length of the lan the node, the peer and the client share.
    pub lan_prefix: u8,
    /// The cluster's service CIDR: every service address here is inside it.
    pub service_cidr: &'static str,
    /// The datapath's flag for detect-local by CIDR in this family.
    pub detect_local_by_cidr: u32,
    /// Service address `n` (cluster IPs).
    pub service_at: fn(u8) -> IpAddr,
    /// Address `n` of the lan's external range (LB and external IPs).
    pub external_at: fn(u8) -> IpAddr,
}

impl Net {
    pub fn service(&self, n: u8) -> IpAddr {
        (self.service_at)(n)
    }

    pub fn external(&self, n: u8) -> IpAddr {
        (self.external_at)(n)
    }
}

const fn v4(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, c, d))
}

const fn v6(net: u16, host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net, 0, 0, 0, 0, host))
}

pub(crate) const IPV4: Net = Net {
    node: v4(0, 1),
    peer_node: v4(0, 2),
    client: v4(0, 100),
    other_client: v4(0, 101),
    local_pod: v4(1, 11),
    local_backend: v4(1, 10),
    remote_backend: v4(2, 10),
    cluster_ip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 14)),
    pod_cidr: "198.18.1.0/24",
    remote_pods: "198.18.2.0/24",
    lan_prefix: 24,
    service_cidr: "198.19.0.0/16",
    detect_local_by_cidr: flags::DETECT_LOCAL_BY_CIDR,
    service_at: |n| IpAddr::V4(Ipv4Addr::new(198, 19, 0, n)),
    external_at: |n| v4(3, n),
};

pub(crate) const IPV6: Net = Net {
    node: v6(0, 1),
    peer_node: v6(0, 2),
    client: v6(0, 0x100),
    other_client: v6(0, 0x101),
    local_pod: v6(1, 0x11),
    local_backend: v6(1, 0x10),
    remote_backend: v6(2, 0x10),
    cluster_ip: v6(0xffff, 0x14),
    pod_cidr: "2001:db8:1::/64",
    remote_pods: "2001:db8:2::/64",
    lan_prefix: 64,
    service_cidr: "2001:db8:ffff::/64",
    detect_local_by_cidr: flags::DETECT_LOCAL_BY_CIDR6,
    service_at: |n| v6(0xffff, n.into()),
    external_at: |n| v6(3, n.into()),
};

in_both_families!(
    nodeport_from_outside_through_xdp_is_balanced_masqueraded_and_sent_back_out,
    nodeport_from_outside_through_tc_is_redirected_by_the_fib,
    gso_packets_are_redirected_when_their_segments_fit_the_route,
    established_packets_go_by_their_flows_cached_next_hop_which_the_fib_refreshes,
    new_flows_share_their_destinations_next_hop_while_routing_is_by_destination,
    new_flows_ask_the_fib_when_routing_may_depend_on_more,
    a_flow_refreshing_its_next_hop_asks_the_fib_not_its_destinations_cache,
    external_traffic_policy_local_drops_without_a_local_endpoint_but_pods_short_circuit,
    external_traffic_policy_local_keeps_the_client_address,
    load_balancer_source_ranges_apply_to_lb_ips_only,
    no_endpoints_are_rejected_with_rst_and_icmp_for_every_frontend_kind,
    unused_port_of_a_cluster_ip_is_rejected_and_a_reset_is_never_answered,
    hairpin_and_cluster_ip_masquerade_follow_the_local_detector,
    masquerade_all_masquerades_pod_traffic_to_cluster_ips,
    conntrack_timeouts_from_the_config_expire_flows,
    forwarded_packets_at_ttl_one_are_left_to_the_kernel,
    internal_traffic_policy_local_uses_only_this_nodes_endpoints,
    interface_based_local_detection_decides_cluster_ip_masquerade,
    a_masquerade_port_is_never_taken_from_a_live_flow,
    a_closed_flows_masquerade_port_is_taken_over_when_no_other_is_free,
    masquerade_ports_come_from_both_ranges_of_the_config,
    traffic_to_an_unallocated_address_of_a_service_cidr_is_dropped,
    affinity_keeps_to_the_endpoints_the_traffic_policy_allows,
    xdp_passes_to_tc_what_its_filter_does_not_name,
    xdp_passes_a_reply_to_a_masquerade_port_of_another_address_when_unfiltered,
);

pub(crate) const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub(crate) const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];
pub(crate) const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
pub(crate) const TARGET: u16 = 8080;
/// Pod runs arrive on this interface (the namespace's loopback).
const POD_IFINDEX: u32 = 1;

/// Moves this test's thread into a fresh network namespace (gone when the
/// thread ends) with a one-armed node: `ext0` on the lan with the peer node
/// and the client as permanent neighbours, and a route to the peer's pods.
fn private_node_namespace(net: &Net) -> u32 {
    // SAFETY: unshare affects only this thread; child processes inherit it.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip("link set lo up");
    ip(&format!(
        "link add ext0 address {} type veth peer name lan0",
        mac_str(NODE_MAC)
    ));
    ip("link set lan0 up");
    ip("link set ext0 up");
    // /proc/sys/net follows the reading thread's namespace; without
    // forwarding the FIB helper answers "forwarding disabled".
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1").unwrap();
    // IPv6: no duplicate address detection, so the address is usable at once.
    let nodad = if net.node.is_ipv6() { " nodad" } else { "" };
    ip(&format!(
        "addr add {}/{} dev ext0{nodad}",
        net.node, net.lan_prefix
    ));
    for (neighbour, mac) in [(net.peer_node, PEER_MAC), (net.client, CLIENT_MAC)] {
        ip(&format!(
            "neigh add {neighbour} lladdr {} dev ext0 nud permanent",
            mac_str(mac)
        ));
    }
    ip(&format!(
        "route add {} via {} dev ext0",
        net.remote_pods, net.peer_node
    ));
    ifindex("ext0")
}

/// A node, its services, and the packets that go through it.
pub(crate) struct Scenario<'n> {
    pub net: &'n Net,
    pub config: DatapathConfig,
    pub services: Vec<DesiredService>,
    pub steps: Vec<Step>,
}

impl Scenario<'_> {
    pub fn run(self) {
        let mut node = node(self.net, self.config);
        node.program(self.services);
        node.play(self.steps);
    }
}

/// The datapath of a node in a namespace of this test's thread, loaded with
/// `config`, with its pod CIDR and address of `net`'s family. Masquerading
/// is on in both families when `config` has a masquerade address (IPv4's,
/// see [`masquerading`]): an IPv6 scenario's node also masquerades IPv6 to
/// its IPv6 address, as a dual-stack node does.
fn node(net: &Net, config: DatapathConfig) -> Datapath {
    let ext = private_node_namespace(net);
    // Small maps: these tests run in parallel and need a few entries each.
    let sizes = ebpf::MapSizes {
        services: 4096,
        backends: 4096,
        conntrack: 4096,
        ..ebpf::MapSizes::default()
    };
    let ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
    let mut dp = Datapath::new(ebpf, POD_IFINDEX, ext);
    dp.maps.put_config(&config).unwrap();
    let mut addresses4 = NodeAddresses {
        primary: None,
        node_ports: vec![],
        localhost_node_ports: false,
        host: Default::default(),
    };
    let mut addresses6 = NodeAddressesOf::<V6> {
        primary: None,
        node_ports: vec![],
        localhost_node_ports: false,
        host: Default::default(),
    };
    match net.node {
        IpAddr::V4(node) => {
            addresses4.primary = Some(node);
            addresses4.node_ports = vec![node];
        }
        IpAddr::V6(node) => {
            addresses6.primary = Some(node);
            addresses6.node_ports = vec![node];
            if config.masquerade_addr_be != 0 {
                let config6 = DatapathConfig6 {
                    masquerade_addr_be: V6::to_be(node),
                };
                dp.maps.put_config6(&config6).unwrap();
            }
        }
    }
    dp.maps
        .put_local_pod_cidr(net.pod_cidr.parse::<IpNet>().unwrap())
        .unwrap();
    dp.programmer
        .set_node_addresses(
            &addresses4,
            &addresses6,
            &DesiredState::default(),
            &mut dp.maps,
        )
        .unwrap();
    dp
}

/// Masquerade to the node, with `flags`. The IPv4 address is always the
/// IPv4 node's: an IPv6 scenario whose packets left with it would fail.
fn masquerading(flags: u32) -> DatapathConfig {
    let IpAddr::V4(node) = IPV4.node else {
        unreachable!()
    };
    DatapathConfig {
        masquerade_addr_be: u32::from(node).to_be(),
        flags,
        ..DatapathConfig::default()
    }
}

/// Masquerade to the node, pods detected by the pod CIDR.
pub(crate) fn standard(net: &Net) -> DatapathConfig {
    masquerading(net.detect_local_by_cidr)
}

pub(crate) fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "e2e".into(),
        name: name.into(),
        port_name: protocol.to_string().into(),
        protocol,
    }
}

pub(crate) fn endpoint(ip: IpAddr, local: bool) -> Endpoint {
    Endpoint {
        is_local: local,
        ..Endpoint::new(ip, TARGET)
    }
}

/// An externally reachable service port: NodePort `node_port` plus the given LB and external IPs.
pub(crate) fn external(
    name: &str,
    protocol: Protocol,
    vip: IpAddr,
    node_port: u16,
    endpoints: Vec<Endpoint>,
) -> DesiredService {
    let local: Vec<Endpoint> = endpoints.iter().filter(|e| e.is_local).cloned().collect();
    DesiredService {
        node_port: Some(node_port),
        local_endpoints: local,
        ..DesiredService::cluster_ip(spn(name, protocol), vec![vip], 80, endpoints)
    }
}

/// A ClusterIP service port `vip:port` of `protocol`.
pub(crate) fn cluster_ip(
    name: &str,
    protocol: Protocol,
    vip: IpAddr,
    port: u16,
    endpoints: Vec<Endpoint>,
) -> DesiredService {
    DesiredService::cluster_ip(spn(name, protocol), vec![vip], port, endpoints)
}

/// The cluster IP:80/TCP to the remote backend.
fn web(net: &Net) -> DesiredService {
    cluster_ip(
        "web",
        Protocol::Tcp,
        net.cluster_ip,
        80,
        vec![endpoint(net.remote_backend, false)],
    )
}

/// NodePort 30080 (and service address 10:80) to the remote backend.
fn remote(net: &Net, protocol: Protocol) -> DesiredService {
    external(
        "remote",
        protocol,
        net.service(10),
        30080,
        vec![endpoint(net.remote_backend, false)],
    )
}

fn nodeport_from_outside_through_xdp_is_balanced_masqueraded_and_sent_back_out(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Tcp)],
        steps: vec![
            // eTP Cluster masquerades to the node; one-armed node: back out of
            // ext0, to the peer node as next hop.
            send(
                Xdp,
                syn(net.client, 40000, net.node, 30080),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    Src(net.node),
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
                    Is(Frame::tcp(net.node, 30080, net.client, 40000)),
                    EthDst(CLIENT_MAC),
                ],
            ),
            counters([(Counter::XdpTx, 2), (Counter::Masqueraded, 1)]),
        ],
    }
    .run();
}

fn nodeport_from_outside_through_tc_is_redirected_by_the_fib(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            send(
                FromNetdev,
                pkt(Frame::udp(net.client, 40000, net.node, 30080), b"hello"),
                TC_ACT_REDIRECT,
                [
                    Src(net.node),
                    To(net.remote_backend, TARGET),
                    EthDst(PEER_MAC),
                    Ttl(63),
                ],
            ),
            send(
                FromNetdev,
                In::Reply(b"hi"),
                TC_ACT_REDIRECT,
                [Is(Frame::udp(net.node, 30080, net.client, 40000))],
            ),
            counters([(Counter::FibRedirect, 2)]),
        ],
    }
    .run();
}

/// A GSO packet (GRO's on a NIC, a local socket's bulk TCP) is longer than
/// the route's MTU but leaves in segments that fit: it is redirected as they
/// are, not left to the stack's forwarding path. A datagram as long that is
/// not GSO is the stack's (fragmentation needed).
fn gso_packets_are_redirected_when_their_segments_fit_the_route(net: &Net) {
    const SEGMENT: u32 = 1400;
    let data = || {
        let frame = Frame::tcp(net.client, 40000, net.node, 30080);
        tcp_data(frame, tcp_flags::ACK, &[7u8; 2 * SEGMENT as usize])
    };
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Tcp)],
        steps: vec![
            send(
                FromNetdev,
                syn(net.client, 40000, net.node, 30080),
                TC_ACT_REDIRECT,
                [To(net.remote_backend, TARGET)],
            ),
            send(
                FromNetdev,
                In::Gso(data(), SEGMENT),
                TC_ACT_REDIRECT,
                [To(net.remote_backend, TARGET), EthDst(PEER_MAC), Ttl(63)],
            ),
            counters([(Counter::FibRedirect, 2), (Counter::FibPass, 0)]),
            send(
                FromNetdev,
                In::Bytes(data()),
                TC_ACT_OK,
                [To(net.remote_backend, TARGET)],
            ),
            counters([(Counter::FibRedirect, 2), (Counter::FibPass, 1)]),
        ],
    }
    .run();
}

/// The peer node's MAC after [`new_peer_mac`].
const NEW_PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x23];

fn new_peer_mac(peer: IpAddr) {
    ip(&format!(
        "neigh replace {peer} lladdr {} dev ext0 nud permanent",
        mac_str(NEW_PEER_MAC)
    ));
}

fn established_packets_go_by_their_flows_cached_next_hop_which_the_fib_refreshes(net: &Net) {
    let request = |payload: &[u8]| pkt(Frame::udp(net.client, 40000, net.node, 30080), payload);
    let cached = |n| counters([(Counter::NextHopCached, n)]);
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            // The new flow asks the FIB; its next packet asks again and fills
            // the entry's cache; the third goes by the cache.
            send(Xdp, request(b"a"), XDP_TX, [EthDst(PEER_MAC)]),
            send(Xdp, request(b"b"), XDP_TX, [EthDst(PEER_MAC)]),
            cached(0),
            send(
                Xdp,
                request(b"c"),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    EthDst(PEER_MAC),
                    EthSrc(NODE_MAC),
                    Ttl(63),
                ],
            ),
            cached(1),
            // TC finds the same entry (the same arrival interface).
            send(
                FromNetdev,
                request(b"d"),
                TC_ACT_REDIRECT,
                [To(net.remote_backend, TARGET), EthDst(PEER_MAC), Ttl(63)],
            ),
            cached(2),
            // Longer than any packet the FIB was asked about: its MTU check
            // is asked again, then the cache knows the length fits.
            send(
                Xdp,
                request(b"a longer payload"),
                XDP_TX,
                [EthDst(PEER_MAC)],
            ),
            cached(2),
            send(
                Xdp,
                request(b"a longer payload"),
                XDP_TX,
                [EthDst(PEER_MAC)],
            ),
            cached(3),
            // The next hop's MAC changes: once the entry's refresh is due
            // (a second), the FIB is asked again and the flow follows it.
            Step::Setup(if net.node.is_ipv4() {
                |_| new_peer_mac(IPV4.peer_node)
            } else {
                |_| new_peer_mac(IPV6.peer_node)
            }),
            Step::Wait(Duration::from_millis(1100)),
            send(Xdp, request(b"e"), XDP_TX, [EthDst(NEW_PEER_MAC)]),
            cached(3),
            send(Xdp, request(b"f"), XDP_TX, [EthDst(NEW_PEER_MAC)]),
            cached(4),
        ],
    }
    .run();
}

/// New flows to the remote backend, each from a client port of its own.
fn new_flow(net: &Net, client_port: u16) -> In {
    pkt(Frame::udp(net.client, client_port, net.node, 30080), b"new")
}

fn new_flows_share_their_destinations_next_hop_while_routing_is_by_destination(net: &Net) {
    let cached = |n| counters([(Counter::NextHopCached, n)]);
    let mut config = standard(net);
    config.flags |= flags::ROUTES_BY_DESTINATION | flags::ROUTES_BY_DESTINATION6;
    Scenario {
        net,
        config,
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            // The cache is per CPU: every packet from this one.
            Step::Setup(|_| stay_on_this_cpu()),
            // The first flow to the backend asks the FIB; the next new
            // flows to it (XDP or TC) take the answer from the cache.
            send(Xdp, new_flow(net, 40000), XDP_TX, [EthDst(PEER_MAC)]),
            cached(0),
            send(
                Xdp,
                new_flow(net, 40001),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    EthDst(PEER_MAC),
                    EthSrc(NODE_MAC),
                    Ttl(63),
                ],
            ),
            cached(1),
            send(
                FromNetdev,
                new_flow(net, 40002),
                TC_ACT_REDIRECT,
                [To(net.remote_backend, TARGET), EthDst(PEER_MAC), Ttl(63)],
            ),
            cached(2),
            // A new flow's own entry has no hop yet: its next packet fills
            // it from the destination's.
            send(Xdp, new_flow(net, 40001), XDP_TX, [EthDst(PEER_MAC)]),
            cached(3),
            // Longer than any packet the FIB was asked about: asked again.
            send(
                Xdp,
                pkt(
                    Frame::udp(net.client, 40003, net.node, 30080),
                    b"a longer payload than the others",
                ),
                XDP_TX,
                [EthDst(PEER_MAC)],
            ),
            cached(3),
            // The next hop's MAC changes: a second later the FIB is asked
            // again, and the new flows after that one follow the new answer.
            Step::Setup(if net.node.is_ipv4() {
                |_| new_peer_mac(IPV4.peer_node)
            } else {
                |_| new_peer_mac(IPV6.peer_node)
            }),
            send(Xdp, new_flow(net, 40004), XDP_TX, [EthDst(PEER_MAC)]),
            cached(4),
            Step::Wait(Duration::from_millis(1100)),
            send(Xdp, new_flow(net, 40005), XDP_TX, [EthDst(NEW_PEER_MAC)]),
            cached(4),
            send(Xdp, new_flow(net, 40006), XDP_TX, [EthDst(NEW_PEER_MAC)]),
            cached(5),
        ],
    }
    .run();
}

fn a_flow_refreshing_its_next_hop_asks_the_fib_not_its_destinations_cache(net: &Net) {
    let mut config = standard(net);
    config.flags |= flags::ROUTES_BY_DESTINATION | flags::ROUTES_BY_DESTINATION6;
    Scenario {
        net,
        config,
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            Step::Setup(|_| stay_on_this_cpu()),
            // Flow A, its own cache filled from the destination's.
            send(Xdp, new_flow(net, 40000), XDP_TX, [EthDst(PEER_MAC)]),
            send(Xdp, new_flow(net, 40000), XDP_TX, [EthDst(PEER_MAC)]),
            Step::Wait(Duration::from_millis(1100)),
            // Flow B asks the FIB: the destination's slot is fresh again,
            // with the old answer, when the next hop's MAC changes.
            send(Xdp, new_flow(net, 40001), XDP_TX, [EthDst(PEER_MAC)]),
            Step::Setup(if net.node.is_ipv4() {
                |_| new_peer_mac(IPV4.peer_node)
            } else {
                |_| new_peer_mac(IPV6.peer_node)
            }),
            // A's refresh is due (idle over a second): it asks the FIB.
            send(Xdp, new_flow(net, 40000), XDP_TX, [EthDst(NEW_PEER_MAC)]),
            // Which refreshed the slot for the next new flow.
            send(Xdp, new_flow(net, 40002), XDP_TX, [EthDst(NEW_PEER_MAC)]),
        ],
    }
    .run();
}

fn new_flows_ask_the_fib_when_routing_may_depend_on_more(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            Step::Setup(|_| stay_on_this_cpu()),
            send(Xdp, new_flow(net, 40000), XDP_TX, [EthDst(PEER_MAC)]),
            send(Xdp, new_flow(net, 40001), XDP_TX, [EthDst(PEER_MAC)]),
            send(
                FromNetdev,
                new_flow(net, 40002),
                TC_ACT_REDIRECT,
                [EthDst(PEER_MAC)],
            ),
            counters([(Counter::NextHopCached, 0)]),
        ],
    }
    .run();
}

fn external_traffic_policy_local_drops_without_a_local_endpoint_but_pods_short_circuit(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![DesiredService {
            external_policy_local: true,
            ..external(
                "local",
                Protocol::Tcp,
                net.service(11),
                30081,
                vec![endpoint(net.remote_backend, false)],
            )
        }],
        steps: vec![
            send(Xdp, syn(net.client, 40000, net.node, 30081), XDP_DROP, []),
            send(
                FromNetdev,
                syn(net.client, 40000, net.node, 30081),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropNoLocalEndpoints, 2)]),
            // No masquerade for short-circuited pod traffic.
            send(
                FromPod,
                syn(net.local_pod, 40001, net.node, 30081),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(
                    net.local_pod,
                    40001,
                    net.remote_backend,
                    TARGET,
                ))],
            ),
        ],
    }
    .run();
}

fn external_traffic_policy_local_keeps_the_client_address(net: &Net) {
    let lb = net.external(21);
    let eip = net.external(31);
    let frontends = [(net.node, 30081), (lb, 80), (eip, 80)];
    Scenario {
        net,
        config: standard(net),
        services: vec![DesiredService {
            external_policy_local: true,
            load_balancer_ips: vec![lb],
            external_ips: vec![eip],
            ..external(
                "local",
                Protocol::Tcp,
                net.service(11),
                30081,
                vec![
                    endpoint(net.local_backend, true),
                    endpoint(net.remote_backend, false),
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
                    send(
                        Xdp,
                        syn(net.client, sport, dst, port),
                        XDP_PASS,
                        [Unchanged],
                    ),
                    send(
                        FromNetdev,
                        syn(net.client, sport, dst, port),
                        TC_ACT_OK,
                        [Is(Frame::tcp(net.client, sport, net.local_backend, TARGET))],
                    ),
                ]
            })
            .chain([counters([(Counter::NewFlow, 3), (Counter::Established, 3)])])
            .collect(),
    }
    .run();
}

fn load_balancer_source_ranges_apply_to_lb_ips_only(net: &Net) {
    let lb = net.external(23);
    Scenario {
        net,
        config: standard(net),
        services: vec![DesiredService {
            load_balancer_ips: vec![lb],
            load_balancer_source_ranges: vec![IpNet::from(net.client)],
            ..external(
                "ranged",
                Protocol::Tcp,
                net.service(13),
                30083,
                vec![endpoint(net.remote_backend, false)],
            )
        }],
        steps: vec![
            send(
                FromNetdev,
                syn(net.client, 40000, lb, 80),
                TC_ACT_REDIRECT,
                [Dst(net.remote_backend)],
            ),
            send(
                FromNetdev,
                syn(net.other_client, 40000, lb, 80),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSourceRange, 1)]),
            // Node ports ignore source ranges.
            send(
                FromNetdev,
                syn(net.other_client, 40001, net.node, 30083),
                TC_ACT_REDIRECT,
                [Dst(net.remote_backend)],
            ),
        ],
    }
    .run();
}

fn no_endpoints_are_rejected_with_rst_and_icmp_for_every_frontend_kind(net: &Net) {
    let vip = net.service(12);
    let lb = net.external(22);
    let eip = net.external(32);
    let empty = |protocol| DesiredService {
        load_balancer_ips: vec![lb],
        external_ips: vec![eip],
        ..external("empty", protocol, vip, 30082, vec![])
    };
    let frontends = [
        (FromPod, net.local_pod, vip, 80),
        (FromNetdev, net.client, net.node, 30082),
        (FromNetdev, net.client, lb, 80),
        (FromNetdev, net.client, eip, 80),
    ];
    Scenario {
        net,
        config: standard(net),
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
                send(Xdp, syn(net.client, 40000, net.node, 30082), XDP_PASS, []),
                counters([(Counter::RejectNoEndpoints, 8)]),
            ])
            .collect(),
    }
    .run();
}

fn unused_port_of_a_cluster_ip_is_rejected_and_a_reset_is_never_answered(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![web(net)],
        steps: vec![
            send(
                FromPod,
                syn(net.local_pod, 40000, net.cluster_ip, 81),
                TC_ACT_REDIRECT,
                [Rst],
            ),
            counters([(Counter::RejectUnknownPort, 1)]),
            send(
                FromPod,
                rst(Frame::tcp(net.local_pod, 40000, net.cluster_ip, 81)),
                TC_ACT_SHOT,
                [],
            ),
        ],
    }
    .run();
}

fn hairpin_and_cluster_ip_masquerade_follow_the_local_detector(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![cluster_ip(
            "self",
            Protocol::Tcp,
            net.cluster_ip,
            80,
            vec![endpoint(net.local_backend, true)],
        )],
        steps: vec![
            // The endpoint reaching itself is masqueraded so its reply comes
            // back through the node.
            send(
                FromPod,
                syn(net.local_backend, 40000, net.cluster_ip, 80),
                TC_ACT_OK,
                [Src(net.node), To(net.local_backend, TARGET), MasqueradePort],
            ),
            send(
                FromPod,
                In::Reply(b""),
                TC_ACT_OK,
                [Is(Frame::tcp(net.cluster_ip, 80, net.local_backend, 40000))],
            ),
            // Another local pod keeps its address; a source outside the pod
            // CIDR is masqueraded.
            send(
                FromPod,
                syn(net.local_pod, 40000, net.cluster_ip, 80),
                TC_ACT_OK,
                [Src(net.local_pod)],
            ),
            send(
                FromNetdev,
                syn(net.client, 40000, net.cluster_ip, 80),
                TC_ACT_OK,
                [Src(net.node)],
            ),
        ],
    }
    .run();
}

fn masquerade_all_masquerades_pod_traffic_to_cluster_ips(net: &Net) {
    Scenario {
        net,
        config: masquerading(net.detect_local_by_cidr | flags::MASQUERADE_ALL),
        services: vec![web(net)],
        steps: vec![send(
            FromPod,
            syn(net.local_pod, 40000, net.cluster_ip, 80),
            TC_ACT_REDIRECT,
            [Src(net.node)],
        )],
    }
    .run();
}

fn conntrack_timeouts_from_the_config_expire_flows(net: &Net) {
    let req = || pkt(Frame::udp(net.local_pod, 40000, net.cluster_ip, 53), b"q");
    Scenario {
        net,
        config: DatapathConfig {
            udp_ns: 50_000_000,
            udp_stream_ns: 50_000_000,
            ..DatapathConfig::default()
        },
        services: vec![cluster_ip(
            "dns",
            Protocol::Udp,
            net.cluster_ip,
            53,
            vec![endpoint(net.remote_backend, false)],
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

fn forwarded_packets_at_ttl_one_are_left_to_the_kernel(net: &Net) {
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Tcp)],
        steps: vec![
            // The stack sends time-exceeded.
            send(
                FromNetdev,
                with_ttl(Frame::tcp(net.client, 40000, net.node, 30080), 1),
                TC_ACT_OK,
                [Ttl(1)],
            ),
        ],
    }
    .run();
}

fn internal_traffic_policy_local_uses_only_this_nodes_endpoints(net: &Net) {
    let vip = net.service(15);
    let other_vip = net.service(16);
    let local = DesiredService {
        internal_policy_local: true,
        local_endpoints: vec![endpoint(net.local_backend, true)],
        ..cluster_ip(
            "itp",
            Protocol::Tcp,
            vip,
            80,
            vec![
                endpoint(net.local_backend, true),
                endpoint(net.remote_backend, false),
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
            vec![endpoint(net.remote_backend, false)],
        )
    };
    Scenario {
        net,
        config: standard(net),
        services: vec![local, remote_only],
        steps: (40000..40020)
            // Only the local endpoint.
            .map(|sport| {
                send(
                    FromPod,
                    syn(net.local_pod, sport, vip, 80),
                    TC_ACT_OK,
                    [Dst(net.local_backend)],
                )
            })
            .chain([
                // Endpoints only elsewhere: dropped, not rejected.
                send(
                    FromPod,
                    syn(net.local_pod, 40000, other_vip, 80),
                    TC_ACT_SHOT,
                    [],
                ),
                counters([(Counter::DropNoLocalEndpoints, 1)]),
            ])
            .collect(),
    }
    .run();
}

fn interface_based_local_detection_decides_cluster_ip_masquerade(net: &Net) {
    Scenario {
        net,
        config: masquerading(flags::DETECT_LOCAL_BY_INTERFACE),
        services: vec![web(net)],
        steps: vec![
            // The interface pod runs arrive on is not yet a pod interface.
            send(
                FromPod,
                syn(net.local_pod, 40000, net.cluster_ip, 80),
                TC_ACT_REDIRECT,
                [Src(net.node)],
            ),
            Step::Setup(|dp| {
                let pod = IfaceInfo {
                    flags: iface::LOCAL_POD,
                };
                dp.maps.put_iface(POD_IFINDEX, &pod).unwrap();
            }),
            send(
                FromPod,
                syn(net.local_pod, 40001, net.cluster_ip, 80),
                TC_ACT_REDIRECT,
                [Src(net.local_pod)],
            ),
        ],
    }
    .run();
}

fn a_masquerade_port_is_never_taken_from_a_live_flow(net: &Net) {
    Scenario {
        net,
        config: DatapathConfig {
            snat_port_min: 62000,
            snat_port_max: 62000,
            // The flows below stay unanswered: SYN_SENT is their state.
            tcp_syn_sent_ns: 100_000_000,
            ..standard(net)
        },
        services: vec![remote(net, Protocol::Tcp)],
        steps: vec![
            send(
                FromNetdev,
                syn(net.client, 40000, net.node, 30080),
                TC_ACT_REDIRECT,
                [SrcPort(62000)],
            ),
            // The only port is in use.
            send(
                FromNetdev,
                syn(net.other_client, 40000, net.node, 30080),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSnatExhausted, 1)]),
            // Once the first flow has idled out, its port is free again.
            Step::Wait(Duration::from_millis(200)),
            send(
                FromNetdev,
                syn(net.other_client, 40001, net.node, 30080),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(net.node, 62000, net.remote_backend, TARGET))],
            ),
        ],
    }
    .run();
}

/// As the kernel's NAT when its port search runs out: the reply tuple of a
/// flow that is over (reset, or closed by both ends) goes to a new flow,
/// and the closed flow's forward half goes with it; a half-closed flow
/// keeps its port.
fn a_closed_flows_masquerade_port_is_taken_over_when_no_other_is_free(net: &Net) {
    let first = Frame::tcp(net.client, 40000, net.node, 30080);
    Scenario {
        net,
        config: DatapathConfig {
            snat_port_min: 62000,
            snat_port_max: 62000,
            ..standard(net)
        },
        services: vec![remote(net, Protocol::Tcp)],
        steps: vec![
            send(
                FromNetdev,
                In::Bytes(first.build(b"")),
                TC_ACT_REDIRECT,
                [SrcPort(62000)],
            ),
            // Half closed: its port stays its own.
            send(
                FromNetdev,
                In::Bytes(tcp_segment(first, tcp_flags::FIN | tcp_flags::ACK)),
                TC_ACT_REDIRECT,
                [SrcPort(62000)],
            ),
            send(
                FromNetdev,
                syn(net.other_client, 40001, net.node, 30080),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSnatExhausted, 1)]),
            // Reset: the next flow takes the port over.
            send(FromNetdev, rst(first), TC_ACT_REDIRECT, [SrcPort(62000)]),
            send(
                FromNetdev,
                syn(net.other_client, 40001, net.node, 30080),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(net.node, 62000, net.remote_backend, TARGET))],
            ),
            // The backend's answer on that tuple is the new flow's.
            send(
                FromNetdev,
                In::Bytes(tcp_segment(
                    Frame::tcp(net.remote_backend, TARGET, net.node, 62000),
                    tcp_flags::SYN | tcp_flags::ACK,
                )),
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(net.node, 30080, net.other_client, 40001))],
            ),
            // The reset flow's forward half went with its port: a late
            // segment of it is a flow of its own, for which no port is left.
            send(
                FromNetdev,
                In::Bytes(tcp_segment(first, tcp_flags::ACK)),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropSnatExhausted, 2)]),
        ],
    }
    .run();
}

/// The node's free ports come in two runs (with Linux's defaults 1024-29999
/// and 61000-65535): masqueraded flows take ports from both, never the same
/// one twice while its flow lives, and none outside them.
fn masquerade_ports_come_from_both_ranges_of_the_config(net: &Net) {
    let (first, second) = (62_000..=62_999u16, 2_000..=2_999u16);
    let mut node = node(
        net,
        DatapathConfig {
            snat_port_min: *first.start(),
            snat_port_max: *first.end(),
            snat_port_min2: *second.start(),
            snat_port_max2: *second.end(),
            tcp_syn_sent_ns: 60_000_000_000,
            ..standard(net)
        },
    );
    node.program(vec![remote(net, Protocol::Tcp)]);
    let mut ports = std::collections::BTreeSet::new();
    for client_port in 40_000..40_060u16 {
        let In::Bytes(packet) = syn(net.client, client_port, net.node, 30080) else {
            unreachable!("a SYN is bytes");
        };
        let out = node.run(FromNetdev, &packet);
        assert_eq!(out.verdict, TC_ACT_REDIRECT, "flow from port {client_port}");
        let port = Frame::parse(&out.packet).expect("a frame").sport;
        assert!(
            first.contains(&port) || second.contains(&port),
            "port {port} is in neither range"
        );
        assert!(ports.insert(port), "port {port} taken twice");
    }
    assert!(ports.iter().any(|p| first.contains(p)), "{ports:?}");
    assert!(ports.iter().any(|p| second.contains(p)), "{ports:?}");
}

/// As upstream's nftables mode: inside a service CIDR, an address no service
/// holds is dropped, from pods and from outside (by XDP already, or by TC
/// where no XDP runs); a cluster IP's unused port is still rejected, and
/// outside the CIDRs nothing changes.
fn traffic_to_an_unallocated_address_of_a_service_cidr_is_dropped(net: &Net) {
    let unallocated = net.service(99);
    let elsewhere = net.external(99);
    Scenario {
        net,
        config: standard(net),
        services: vec![web(net)],
        steps: vec![
            send(
                FromPod,
                syn(net.local_pod, 40000, unallocated, 80),
                TC_ACT_OK,
                [Unchanged],
            ),
            Step::Setup(if net.node.is_ipv4() {
                |dp| guard_service_cidr(dp, IPV4.service_cidr)
            } else {
                |dp| guard_service_cidr(dp, IPV6.service_cidr)
            }),
            send(
                FromPod,
                syn(net.local_pod, 40001, unallocated, 80),
                TC_ACT_SHOT,
                [],
            ),
            send(Xdp, syn(net.client, 40002, unallocated, 80), XDP_DROP, []),
            send(
                FromNetdev,
                syn(net.client, 40002, unallocated, 80),
                TC_ACT_SHOT,
                [],
            ),
            counters([(Counter::DropUnallocated, 3)]),
            send(
                FromPod,
                syn(net.local_pod, 40003, net.cluster_ip, 80),
                TC_ACT_REDIRECT,
                [To(net.remote_backend, TARGET)],
            ),
            send(
                FromPod,
                syn(net.local_pod, 40004, net.cluster_ip, 81),
                TC_ACT_REDIRECT,
                [Rst],
            ),
            send(
                FromPod,
                syn(net.local_pod, 40005, elsewhere, 80),
                TC_ACT_OK,
                [Unchanged],
            ),
            counters([
                (Counter::DropUnallocated, 3),
                (Counter::RejectUnknownPort, 1),
            ]),
        ],
    }
    .run();
}

/// Session affinity keeps to the endpoints the traffic policy allows: with
/// externalTrafficPolicy Local, an outside client is pinned among this
/// node's endpoints only, through the NodePort and the LB IP alike.
fn affinity_keeps_to_the_endpoints_the_traffic_policy_allows(net: &Net) {
    let lb = net.external(27);
    let frontends = [(net.node, 30087), (lb, 80)];
    Scenario {
        net,
        config: standard(net),
        services: vec![DesiredService {
            external_policy_local: true,
            load_balancer_ips: vec![lb],
            session_affinity: SessionAffinity::ClientIp {
                timeout_seconds: 10_800,
            },
            ..external(
                "sticky-local",
                Protocol::Tcp,
                net.service(17),
                30087,
                vec![
                    endpoint(net.local_backend, true),
                    endpoint(net.remote_backend, false),
                ],
            )
        }],
        steps: (40000u16..40010)
            .zip(frontends.into_iter().cycle())
            .map(|(sport, (dst, port))| {
                send(
                    FromNetdev,
                    syn(net.client, sport, dst, port),
                    TC_ACT_OK,
                    [Is(Frame::tcp(net.client, sport, net.local_backend, TARGET))],
                )
            })
            .chain([counters([
                (Counter::AffinityHit, 9),
                (Counter::NewFlow, 10),
            ])])
            .collect(),
    }
    .run();
}

/// What the node programmer writes for a service CIDR: the prefix, then the
/// flag that turns its lookup on.
/// XDP looks a packet up only when its filter (`proxy_common::filter`)
/// names its destination or source: a flow whose frontend and backend bits
/// are gone is passed on whole to TC, which forwards it as before; a reply
/// to a masquerade port needs no bit.
fn xdp_passes_to_tc_what_its_filter_does_not_name(net: &Net) {
    let request = |payload: &[u8]| pkt(Frame::udp(net.client, 40000, net.node, 30080), payload);
    let forwarded = || {
        [
            To(net.remote_backend, TARGET),
            Src(net.node),
            MasqueradePort,
        ]
    };
    Scenario {
        net,
        config: standard(net),
        services: vec![remote(net, Protocol::Udp)],
        steps: vec![
            send(Xdp, request(b"a"), XDP_TX, forwarded()),
            Step::Setup(clear_filters),
            send(Xdp, request(b"b"), XDP_PASS, [Unchanged]),
            send(FromNetdev, request(b"b"), TC_ACT_REDIRECT, forwarded()),
            send(
                Xdp,
                In::Reply(b""),
                XDP_TX,
                [
                    Is(Frame::udp(net.node, 30080, net.client, 40000)),
                    EthDst(CLIENT_MAC),
                ],
            ),
            // The one established packet counted is TC's: XDP never looked
            // the passed one up.
            counters([(Counter::XdpTx, 2), (Counter::Established, 1)]),
        ],
    }
    .run();
}

/// XDP's filter lets a packet to a masquerade port be looked up by port
/// only at the masquerade address: a flow given a port of its own at the
/// client's address (its reply tuple taken by another flow) has its replies
/// looked up only through the backend's bit, and without it XDP passes them
/// to TC, which translates them.
fn xdp_passes_a_reply_to_a_masquerade_port_of_another_address_when_unfiltered(net: &Net) {
    let other = net.service(12);
    Scenario {
        net,
        // No local detection: cluster IPs reached from outside keep the client's address.
        config: masquerading(0),
        services: vec![
            web(net),
            cluster_ip(
                "other",
                Protocol::Tcp,
                other,
                80,
                vec![endpoint(net.remote_backend, false)],
            ),
        ],
        steps: vec![
            send(
                Xdp,
                syn(net.client, 40000, net.cluster_ip, 80),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    Src(net.client),
                    SrcPort(40000),
                ],
            ),
            // The same client port to the same endpoint through another
            // frontend: the reply tuple is taken, so a port of its own.
            send(
                Xdp,
                syn(net.client, 40000, other, 80),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    Src(net.client),
                    MasqueradePort,
                ],
            ),
            Step::Setup(clear_filters),
            send(Xdp, In::Reply(b""), XDP_PASS, [Unchanged]),
            send(
                FromNetdev,
                In::Again,
                TC_ACT_REDIRECT,
                [Is(Frame::tcp(other, 80, net.client, 40000))],
            ),
            counters([(Counter::NewFlow, 2), (Counter::ReplyNat, 1)]),
        ],
    }
    .run();
}

fn clear_filters(dp: &mut Datapath) {
    for filter in [&mut dp.maps.filter, &mut dp.maps.v6.filter] {
        let filter = filter.as_mut().expect("the agent's maps have the filter");
        for word in 0..proxy_common::filter::FILTER_WORDS {
            assert!(filter.write(word, 0));
        }
    }
}

fn guard_service_cidr(dp: &mut Datapath, cidr: &str) {
    dp.maps.put_service_cidr(cidr.parse().unwrap()).unwrap();
    let mut config = dp.maps.config.get(&0, 0).unwrap();
    config.flags |= flags::SERVICE_CIDRS;
    dp.maps.put_config(&config).unwrap();
}
