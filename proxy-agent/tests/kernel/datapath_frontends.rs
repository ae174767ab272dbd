//! The real programs in the real kernel, for every frontend kind and rule of
//! the service datapath: NodePort / LB / external IP / ClusterIP, traffic
//! policies, masquerade, source ranges, reject packets, FIB redirect, XDP
//! and conntrack timeouts. Packets go through BPF_PROG_TEST_RUN; verdicts
//! and output bytes are checked. Each test runs in a network namespace of
//! its own thread (unshare), holding just the routes the FIB lookups need,
//! so nothing is sent anywhere and nothing outlives the test. Needs root.

use std::{
    net::{IpAddr, Ipv4Addr},
    process::Command,
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use ipnet::Ipv4Net;
use proxy_agent::{
    cli::packet::{self, Frame, checksums_valid, tcp_flags},
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        self, KernelMaps, Programmer,
        maps::NodeMaps,
        node::NodeAddresses,
        test_run::{self, Hook},
    },
};
use proxy_common::{
    Counter, DatapathConfig,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP, XDP_PASS, XDP_TX},
    config::flags,
};

const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER_NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
const LOCAL_BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const REMOTE_BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
const POD_CIDR: &str = "198.18.1.0/24";
const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
const TARGET: u16 = 8080;

fn ip(args: &str) {
    let status = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .unwrap();
    assert!(status.success(), "ip {args}");
}

/// The ifindex in this thread's namespace (/sys/class/net shows the mounter's).
fn ifindex(name: &str) -> u32 {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {name:?}");
    index
}

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

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

struct Node {
    ebpf: Ebpf,
    maps: KernelMaps,
    stats: PerCpuArray<MapData, u64>,
    programmer: Programmer,
    ext: u32,
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

impl Node {
    fn new(config: DatapathConfig) -> Self {
        let ext = private_node_namespace();
        // Small maps: these tests run in parallel and need a few entries each.
        let sizes = ebpf::MapSizes {
            services: 4096,
            backends: 4096,
            conntrack: 4096,
        };
        let mut ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
        let (mut maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        maps.put_config(&config).unwrap();
        maps.put_local_pod_cidr(POD_CIDR.parse::<Ipv4Net>().unwrap())
            .unwrap();
        let mut programmer = Programmer::new();
        programmer
            .set_node_addresses(
                &NodeAddresses {
                    primary: Some(NODE),
                    node_ports: vec![NODE],
                },
                &DesiredState::default(),
                &mut maps,
            )
            .unwrap();
        Self {
            ebpf,
            maps,
            stats,
            programmer,
            ext,
        }
    }

    fn standard() -> Self {
        Self::new(DatapathConfig {
            masquerade_addr_be: u32::from(NODE).to_be(),
            flags: flags::DETECT_LOCAL_BY_CIDR,
            ..DatapathConfig::default()
        })
    }

    fn program(&mut self, services: Vec<DesiredService>) {
        let state = DesiredState {
            services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        };
        self.programmer.sync(&state, &mut self.maps).unwrap();
    }

    fn run(&self, hook: Hook, pkt: &[u8]) -> test_run::Outcome {
        let ifindex = if hook == Hook::FromPod { 1 } else { self.ext };
        test_run::run(&self.ebpf, hook, pkt, ifindex, 1).expect("BPF_PROG_TEST_RUN")
    }

    fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }
}

fn parsed(out: &test_run::Outcome) -> Frame {
    assert!(checksums_valid(&out.packet), "checksums must verify");
    Frame::parse(&out.packet).unwrap()
}

fn ttl(pkt: &[u8]) -> u8 {
    pkt[packet::ETH_HLEN + 8]
}

fn snat_port_in_range(port: u16) {
    assert!((61000..=65535).contains(&port), "masquerade port {port}");
}

#[test]
fn nodeport_from_outside_through_xdp_is_balanced_masqueraded_and_sent_back_out() {
    let mut node = Node::standard();
    node.program(vec![external(
        "remote",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 10),
        30080,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let syn = Frame::tcp(CLIENT, 40000, NODE, 30080).build(b"");
    let out = node.run(Hook::Xdp, &syn);
    assert_eq!(out.verdict, XDP_TX, "one-armed node: back out of ext0");
    let f = parsed(&out);
    assert_eq!((f.dst, f.dport), (REMOTE_BACKEND, TARGET));
    assert_eq!(f.src, NODE, "eTP Cluster masquerades to the node");
    snat_port_in_range(f.sport);
    assert_eq!(&out.packet[0..6], &PEER_MAC, "next hop is the peer node");
    assert_eq!(&out.packet[6..12], &NODE_MAC);
    assert_eq!(ttl(&out.packet), 63);

    let reply = Frame::tcp(REMOTE_BACKEND, TARGET, NODE, f.sport).build(b"");
    let back = node.run(Hook::Xdp, &reply);
    assert_eq!(back.verdict, XDP_TX);
    let b = parsed(&back);
    assert_eq!(
        b,
        Frame::tcp(NODE, 30080, CLIENT, 40000),
        "reverse SNAT and DNAT"
    );
    assert_eq!(&back.packet[0..6], &CLIENT_MAC);
    assert_eq!(node.counter(Counter::XdpTx), 2);
    assert_eq!(node.counter(Counter::Masqueraded), 1);
}

#[test]
fn nodeport_from_outside_through_tc_is_redirected_by_the_fib() {
    let mut node = Node::standard();
    node.program(vec![external(
        "remote",
        Protocol::Udp,
        Ipv4Addr::new(198, 19, 0, 10),
        30080,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let req = Frame::udp(CLIENT, 40000, NODE, 30080).build(b"hello");
    let out = node.run(Hook::FromNetdev, &req);
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    let f = parsed(&out);
    assert_eq!((f.src, f.dst, f.dport), (NODE, REMOTE_BACKEND, TARGET));
    assert_eq!(&out.packet[0..6], &PEER_MAC);
    assert_eq!(ttl(&out.packet), 63);
    let reply = Frame::udp(REMOTE_BACKEND, TARGET, NODE, f.sport).build(b"hi");
    let back = node.run(Hook::FromNetdev, &reply);
    assert_eq!(back.verdict, TC_ACT_REDIRECT);
    assert_eq!(parsed(&back), Frame::udp(NODE, 30080, CLIENT, 40000));
    assert_eq!(node.counter(Counter::FibRedirect), 2);
}

#[test]
fn external_traffic_policy_local_drops_without_a_local_endpoint_but_pods_short_circuit() {
    let mut node = Node::standard();
    let mut svc = external(
        "local",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 11),
        30081,
        vec![endpoint(REMOTE_BACKEND, false)],
    );
    svc.external_policy_local = true;
    node.program(vec![svc]);
    let syn = Frame::tcp(CLIENT, 40000, NODE, 30081).build(b"");
    assert_eq!(node.run(Hook::Xdp, &syn).verdict, XDP_DROP);
    assert_eq!(node.run(Hook::FromNetdev, &syn).verdict, TC_ACT_SHOT);
    assert_eq!(node.counter(Counter::DropNoLocalEndpoints), 2);

    let from_pod = Frame::tcp(LOCAL_POD, 40001, NODE, 30081).build(b"");
    let out = node.run(Hook::FromPod, &from_pod);
    assert_eq!(
        parsed(&out),
        Frame::tcp(LOCAL_POD, 40001, REMOTE_BACKEND, TARGET),
        "no masquerade for short-circuited pod traffic"
    );
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address() {
    let mut node = Node::standard();
    let mut svc = external(
        "local",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 11),
        30081,
        vec![
            endpoint(LOCAL_BACKEND, true),
            endpoint(REMOTE_BACKEND, false),
        ],
    );
    svc.external_policy_local = true;
    svc.load_balancer_ips = vec![IpAddr::V4(Ipv4Addr::new(198, 18, 3, 21))];
    svc.external_ips = vec![IpAddr::V4(Ipv4Addr::new(198, 18, 3, 31))];
    node.program(vec![svc]);
    for (dst, port) in [
        (NODE, 30081),
        (Ipv4Addr::new(198, 18, 3, 21), 80),
        (Ipv4Addr::new(198, 18, 3, 31), 80),
    ] {
        let syn = Frame::tcp(CLIENT, 40000, dst, port).build(b"");
        // XDP only finishes frames that leave where they came in; this one is
        // left untouched for TC, which finds the flow XDP created.
        let passed = node.run(Hook::Xdp, &syn);
        assert_eq!((passed.verdict, &passed.packet), (XDP_PASS, &syn));
        let out = node.run(Hook::FromNetdev, &syn);
        assert_eq!(
            parsed(&out),
            Frame::tcp(CLIENT, 40000, LOCAL_BACKEND, TARGET),
            "to {dst}:{port}"
        );
    }
    assert_eq!(
        (
            node.counter(Counter::NewFlow),
            node.counter(Counter::Established)
        ),
        (3, 3)
    );
}

#[test]
fn load_balancer_source_ranges_apply_to_lb_ips_only() {
    let mut node = Node::standard();
    let mut svc = external(
        "ranged",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 13),
        30083,
        vec![endpoint(REMOTE_BACKEND, false)],
    );
    let lb = Ipv4Addr::new(198, 18, 3, 23);
    svc.load_balancer_ips = vec![IpAddr::V4(lb)];
    svc.load_balancer_source_ranges = vec!["198.18.0.100/32".parse().unwrap()];
    node.program(vec![svc]);
    let allowed = node.run(
        Hook::FromNetdev,
        &Frame::tcp(CLIENT, 40000, lb, 80).build(b""),
    );
    assert_eq!(parsed(&allowed).dst, REMOTE_BACKEND);
    let denied = node.run(
        Hook::FromNetdev,
        &Frame::tcp(OTHER_CLIENT, 40000, lb, 80).build(b""),
    );
    assert_eq!(denied.verdict, TC_ACT_SHOT);
    assert_eq!(node.counter(Counter::DropSourceRange), 1);
    let node_port = node.run(
        Hook::FromNetdev,
        &Frame::tcp(OTHER_CLIENT, 40001, NODE, 30083).build(b""),
    );
    assert_eq!(
        parsed(&node_port).dst,
        REMOTE_BACKEND,
        "node ports ignore source ranges"
    );
}

/// The RST the datapath must answer `syn` with, byte for byte.
fn expected_rst(syn: &[u8], req: &Frame) -> Vec<u8> {
    let mut want = Frame::tcp(req.dst, req.dport, req.src, req.sport).build(b"");
    want[0..6].copy_from_slice(&syn[6..12]);
    want[6..12].copy_from_slice(&syn[0..6]);
    let ip = packet::ETH_HLEN;
    want[ip + 1] = 0;
    want[ip + 4..ip + 6].fill(0); // id
    let tcp = ip + packet::IPV4_HLEN;
    want[tcp + 4..tcp + 8].fill(0); // seq
    want[tcp + 8..tcp + 12].copy_from_slice(&2u32.to_be_bytes()); // SYN seq 1 + 1
    want[tcp + 13] = tcp_flags::RST | tcp_flags::ACK;
    want[tcp + 14..tcp + 16].fill(0); // window
    packet::fix_checksums(&mut want);
    want
}

#[test]
fn no_endpoints_are_rejected_with_rst_and_icmp_for_every_frontend_kind() {
    let mut node = Node::standard();
    let vip = Ipv4Addr::new(198, 19, 0, 12);
    let lb = Ipv4Addr::new(198, 18, 3, 22);
    let eip = Ipv4Addr::new(198, 18, 3, 32);
    let mut services = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let mut svc = external("empty", protocol, vip, 30082, vec![]);
        svc.load_balancer_ips = vec![IpAddr::V4(lb)];
        svc.external_ips = vec![IpAddr::V4(eip)];
        services.push(svc);
    }
    node.program(services);
    let cases = [
        (Hook::FromPod, LOCAL_POD, vip, 80),
        (Hook::FromNetdev, CLIENT, NODE, 30082),
        (Hook::FromNetdev, CLIENT, lb, 80),
        (Hook::FromNetdev, CLIENT, eip, 80),
    ];
    for (hook, src, dst, port) in cases {
        let req = Frame::tcp(src, 40000, dst, port);
        let syn = req.build(b"");
        let out = node.run(hook, &syn);
        assert_eq!(out.verdict, TC_ACT_REDIRECT, "{dst}:{port}: sent back out");
        assert_eq!(out.packet, expected_rst(&syn, &req), "RST to {dst}:{port}");

        let udp = Frame::udp(src, 40000, dst, port).build(b"ping");
        let out = node.run(hook, &udp);
        assert_eq!(out.verdict, TC_ACT_REDIRECT);
        let icmp = &out.packet;
        assert_eq!(icmp.len(), 14 + 20 + 8 + 20 + 8);
        assert_eq!(&icmp[0..6], &udp[6..12]);
        assert_eq!(&icmp[6..12], &udp[0..6]);
        let ip = &icmp[14..34];
        assert_eq!(ip[9], 1, "ICMP");
        assert_eq!(&ip[12..16], &dst.octets());
        assert_eq!(&ip[16..20], &src.octets());
        assert_eq!(packet::checksum(&[ip]), 0, "IP checksum");
        assert_eq!(&icmp[34..36], &[3, 3], "port unreachable");
        assert_eq!(packet::checksum(&[&icmp[34..]]), 0, "ICMP checksum");
        assert_eq!(
            &icmp[42..70],
            &udp[14..42],
            "quotes the original header and 8 bytes"
        );
    }
    // The XDP program leaves rejects to TC.
    let syn = Frame::tcp(CLIENT, 40000, NODE, 30082).build(b"");
    assert_eq!(node.run(Hook::Xdp, &syn).verdict, XDP_PASS);
    assert_eq!(node.counter(Counter::RejectNoEndpoints), 8);
}

#[test]
fn unused_port_of_a_cluster_ip_is_rejected_and_a_reset_is_never_answered() {
    let mut node = Node::standard();
    let vip = Ipv4Addr::new(198, 19, 0, 14);
    node.program(vec![DesiredService::cluster_ip(
        spn("web", Protocol::Tcp),
        vec![IpAddr::V4(vip)],
        80,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let req = Frame::tcp(LOCAL_POD, 40000, vip, 81);
    let syn = req.build(b"");
    let out = node.run(Hook::FromPod, &syn);
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    assert_eq!(out.packet, expected_rst(&syn, &req));
    assert_eq!(node.counter(Counter::RejectUnknownPort), 1);

    let mut rst = syn.clone();
    rst[14 + 20 + 13] = tcp_flags::RST;
    packet::fix_checksums(&mut rst);
    assert_eq!(node.run(Hook::FromPod, &rst).verdict, TC_ACT_SHOT);
}

#[test]
fn hairpin_and_cluster_ip_masquerade_follow_the_local_detector() {
    let mut node = Node::standard();
    let vip = Ipv4Addr::new(198, 19, 0, 14);
    node.program(vec![DesiredService::cluster_ip(
        spn("self", Protocol::Tcp),
        vec![IpAddr::V4(vip)],
        80,
        vec![endpoint(LOCAL_BACKEND, true)],
    )]);
    // The endpoint reaching itself is masqueraded so its reply comes back through the node.
    let out = node.run(
        Hook::FromPod,
        &Frame::tcp(LOCAL_BACKEND, 40000, vip, 80).build(b""),
    );
    let f = parsed(&out);
    assert_eq!((f.src, f.dst, f.dport), (NODE, LOCAL_BACKEND, TARGET));
    snat_port_in_range(f.sport);
    let reply = node.run(
        Hook::FromPod,
        &Frame::tcp(LOCAL_BACKEND, TARGET, NODE, f.sport).build(b""),
    );
    assert_eq!(parsed(&reply), Frame::tcp(vip, 80, LOCAL_BACKEND, 40000));
    // Another local pod keeps its address; a source outside the pod CIDR is masqueraded.
    let out = node.run(
        Hook::FromPod,
        &Frame::tcp(LOCAL_POD, 40000, vip, 80).build(b""),
    );
    assert_eq!(parsed(&out).src, LOCAL_POD);
    let out = node.run(
        Hook::FromNetdev,
        &Frame::tcp(CLIENT, 40000, vip, 80).build(b""),
    );
    assert_eq!(parsed(&out).src, NODE);
}

#[test]
fn masquerade_all_masquerades_pod_traffic_to_cluster_ips() {
    let mut node = Node::new(DatapathConfig {
        masquerade_addr_be: u32::from(NODE).to_be(),
        flags: flags::DETECT_LOCAL_BY_CIDR | flags::MASQUERADE_ALL,
        ..DatapathConfig::default()
    });
    let vip = Ipv4Addr::new(198, 19, 0, 14);
    node.program(vec![DesiredService::cluster_ip(
        spn("web", Protocol::Tcp),
        vec![IpAddr::V4(vip)],
        80,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let out = node.run(
        Hook::FromPod,
        &Frame::tcp(LOCAL_POD, 40000, vip, 80).build(b""),
    );
    assert_eq!(parsed(&out).src, NODE);
}

#[test]
fn conntrack_timeouts_from_the_config_expire_flows() {
    let mut node = Node::new(DatapathConfig {
        udp_ns: 50_000_000,
        udp_stream_ns: 50_000_000,
        ..DatapathConfig::default()
    });
    let vip = Ipv4Addr::new(198, 19, 0, 14);
    node.program(vec![DesiredService::cluster_ip(
        spn("dns", Protocol::Udp),
        vec![IpAddr::V4(vip)],
        53,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let req = Frame::udp(LOCAL_POD, 40000, vip, 53).build(b"q");
    node.run(Hook::FromPod, &req);
    node.run(Hook::FromPod, &req);
    assert_eq!(
        (
            node.counter(Counter::NewFlow),
            node.counter(Counter::Established)
        ),
        (1, 1)
    );
    std::thread::sleep(Duration::from_millis(120));
    node.run(Hook::FromPod, &req);
    assert_eq!(
        node.counter(Counter::NewFlow),
        2,
        "the idle flow expired after udpTimeout"
    );
}

#[test]
fn forwarded_packets_at_ttl_one_are_left_to_the_kernel() {
    let mut node = Node::standard();
    node.program(vec![external(
        "remote",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 10),
        30080,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let mut syn = Frame::tcp(CLIENT, 40000, NODE, 30080).build(b"");
    syn[14 + 8] = 1;
    packet::fix_checksums(&mut syn);
    let out = node.run(Hook::FromNetdev, &syn);
    assert_eq!(out.verdict, TC_ACT_OK, "the stack sends time-exceeded");
    assert_eq!(ttl(&out.packet), 1);
    let _ = TC_ACT_SHOT;
}

#[test]
fn internal_traffic_policy_local_uses_only_this_nodes_endpoints() {
    let mut node = Node::standard();
    let vip = Ipv4Addr::new(198, 19, 0, 15);
    let other_vip = Ipv4Addr::new(198, 19, 0, 16);
    let local = DesiredService {
        internal_policy_local: true,
        local_endpoints: vec![endpoint(LOCAL_BACKEND, true)],
        ..DesiredService::cluster_ip(
            spn("itp", Protocol::Tcp),
            vec![IpAddr::V4(vip)],
            80,
            vec![
                endpoint(LOCAL_BACKEND, true),
                endpoint(REMOTE_BACKEND, false),
            ],
        )
    };
    let remote_only = DesiredService {
        internal_policy_local: true,
        ..DesiredService::cluster_ip(
            spn("itp-remote", Protocol::Tcp),
            vec![IpAddr::V4(other_vip)],
            80,
            vec![endpoint(REMOTE_BACKEND, false)],
        )
    };
    node.program(vec![local, remote_only]);
    for sport in 40000..40020 {
        let out = node.run(
            Hook::FromPod,
            &Frame::tcp(LOCAL_POD, sport, vip, 80).build(b""),
        );
        assert_eq!(parsed(&out).dst, LOCAL_BACKEND, "only the local endpoint");
    }
    let out = node.run(
        Hook::FromPod,
        &Frame::tcp(LOCAL_POD, 40000, other_vip, 80).build(b""),
    );
    assert_eq!(
        out.verdict, TC_ACT_SHOT,
        "endpoints only elsewhere: dropped, not rejected"
    );
    assert_eq!(node.counter(Counter::DropNoLocalEndpoints), 1);
}

#[test]
fn interface_based_local_detection_decides_cluster_ip_masquerade() {
    let mut node = Node::new(DatapathConfig {
        masquerade_addr_be: u32::from(NODE).to_be(),
        flags: flags::DETECT_LOCAL_BY_INTERFACE,
        ..DatapathConfig::default()
    });
    let vip = Ipv4Addr::new(198, 19, 0, 14);
    node.program(vec![DesiredService::cluster_ip(
        spn("web", Protocol::Tcp),
        vec![IpAddr::V4(vip)],
        80,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    // Pod runs arrive on ifindex 1; it is not yet marked as a pod interface.
    let syn = |sport| Frame::tcp(LOCAL_POD, sport, vip, 80).build(b"");
    assert_eq!(parsed(&node.run(Hook::FromPod, &syn(40000))).src, NODE);
    node.maps
        .put_iface(
            1,
            &proxy_common::IfaceInfo {
                flags: proxy_common::config::iface::LOCAL_POD,
            },
        )
        .unwrap();
    assert_eq!(parsed(&node.run(Hook::FromPod, &syn(40001))).src, LOCAL_POD);
}

#[test]
fn a_masquerade_port_is_never_taken_from_a_live_flow() {
    let mut node = Node::new(DatapathConfig {
        masquerade_addr_be: u32::from(NODE).to_be(),
        flags: flags::DETECT_LOCAL_BY_CIDR,
        snat_port_min: 62000,
        snat_port_max: 62000,
        tcp_established_ns: 100_000_000,
        ..DatapathConfig::default()
    });
    node.program(vec![external(
        "remote",
        Protocol::Tcp,
        Ipv4Addr::new(198, 19, 0, 10),
        30080,
        vec![endpoint(REMOTE_BACKEND, false)],
    )]);
    let first = node.run(
        Hook::FromNetdev,
        &Frame::tcp(CLIENT, 40000, NODE, 30080).build(b""),
    );
    assert_eq!(parsed(&first).sport, 62000);
    let second = node.run(
        Hook::FromNetdev,
        &Frame::tcp(OTHER_CLIENT, 40000, NODE, 30080).build(b""),
    );
    assert_eq!(second.verdict, TC_ACT_SHOT, "the only port is in use");
    assert_eq!(node.counter(Counter::DropSnatExhausted), 1);

    // Once the first flow has idled out, its port is free again.
    std::thread::sleep(Duration::from_millis(200));
    let third = node.run(
        Hook::FromNetdev,
        &Frame::tcp(OTHER_CLIENT, 40001, NODE, 30080).build(b""),
    );
    assert_eq!(
        parsed(&third),
        Frame::tcp(NODE, 62000, REMOTE_BACKEND, TARGET)
    );
}
