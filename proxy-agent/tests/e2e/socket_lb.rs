//! Socket-level balancing in the real kernel: the cgroup socket programs
//! attached to a child cgroup this test creates (never the root), clients in
//! child processes inside that cgroup and the testbed's node namespace (the
//! host, to the hooks), real TCP and UDP to identity servers in pod
//! namespaces. No TC program is attached: whatever reaches a backend was
//! pointed there by the socket hooks alone. Needs root.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use ipnet::IpNet;
use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        self, KernelMaps, Programmer,
        maps::NodeMaps,
        node::{NodeAddresses, NodeAddressesOf},
        sockets::{SocketHooks, netns_cookie},
        stale_sockets::forget_and_terminate,
    },
};
use proxy_common::{Counter, DatapathConfig, V6, config::flags};
use testbed::{
    Cni, NODE_EXTERNAL_IP, NODE_EXTERNAL_IP6, ROUTED_GATEWAY, Testbed, netns,
    servers::IdentityServer,
};

use crate::{
    sock_client::{self, Op, Outcome, Place, UdpStream},
    support::TestCgroup,
};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const EMPTY_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 11);
const ITP_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 12);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 1);
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 1);
const GUARDED_LB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 2);
const NODE_PORT: u16 = 30080;
const EMPTY_NODE_PORT: u16 = 30081;
const TARGET: u16 = 8080;
/// The IPv6 addresses of the same services, in a dual-stack fixture.
const CLUSTER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x10);
const EMPTY_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x11);
const ITP_LOCAL_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x12);
const GUARDED_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x13);
const EXTERNAL_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 1, 0, 0, 0, 1);
const LB_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 2, 0, 0, 0, 1);
const GUARDED_LB_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 2, 0, 0, 0, 2);

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "e2e".into(),
        name: name.into(),
        port_name: protocol.to_string().into(),
        protocol,
    }
}

fn endpoint(ip: impl Into<IpAddr>, local: bool) -> Endpoint {
    Endpoint {
        is_local: local,
        ..Endpoint::new(ip.into(), TARGET)
    }
}

/// The node with two pods serving their names on TCP and UDP 8080, the
/// datapath loaded with its socket programs on a cgroup of the test's own.
struct Fixture {
    tb: Testbed,
    _servers: Vec<IdentityServer>,
    _ebpf: aya::Ebpf,
    maps: KernelMaps,
    stats: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    programmer: Programmer,
    hooks: Option<SocketHooks>,
    cgroup: TestCgroup,
    config: DatapathConfig,
    state: DesiredState,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        Self::build(tag, false)
    }

    /// The same in both families: pods, servers, node addresses and every
    /// service also in IPv6.
    fn new_dual_stack(tag: &str) -> Self {
        Self::build(tag, true)
    }

    fn build(tag: &str, dual_stack: bool) -> Self {
        let pods = ["pod-a", "pod-b"];
        let tb = if dual_stack {
            Testbed::new_dual_stack(&pods)
        } else {
            Testbed::new(Cni::Routed, &pods)
        }
        .expect("testbed");
        let servers = tb
            .pods
            .iter()
            .map(|p| {
                if dual_stack {
                    IdentityServer::start_dual_stack(&p.ns, &p.name, TARGET)
                } else {
                    IdentityServer::start(&p.ns, &p.name, TARGET)
                }
                .expect("server")
            })
            .collect();
        let mut ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
        ebpf::load_socket_programs(&mut ebpf).expect("the socket programs load");
        let (mut maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        let cookie = netns::run_in(&tb.node_ns, netns_cookie)
            .unwrap()
            .expect("SO_NETNS_COOKIE");
        let config = DatapathConfig {
            masquerade_addr_be: u32::from(NODE_EXTERNAL_IP).to_be(),
            flags: flags::SOCKET_LB_HOST,
            host_netns_cookie: cookie,
            ..DatapathConfig::default()
        };
        maps.put_config(&config).unwrap();
        let cgroup = TestCgroup::new(tag).expect("a test cgroup");
        let hooks = SocketHooks::attach(&mut ebpf, &cgroup.path, None).expect("attach the hooks");
        let mut fixture = Fixture {
            tb,
            _servers: servers,
            _ebpf: ebpf,
            maps,
            stats,
            programmer: Programmer::new(),
            hooks: Some(hooks),
            cgroup,
            config,
            state: DesiredState::default(),
        };
        fixture.node_addresses(true);
        fixture.program(services(&fixture.tb));
        fixture
    }

    fn node_addresses(&mut self, localhost_node_ports: bool) {
        let node = NodeAddresses {
            primary: Some(NODE_EXTERNAL_IP),
            node_ports: vec![ROUTED_GATEWAY, NODE_EXTERNAL_IP],
            localhost_node_ports,
            host: [ROUTED_GATEWAY, NODE_EXTERNAL_IP].into(),
        };
        let dual_stack = self.tb.pods[0].ip6.is_some();
        let node6 = NodeAddressesOf::<V6> {
            primary: dual_stack.then_some(NODE_EXTERNAL_IP6),
            node_ports: dual_stack
                .then_some(NODE_EXTERNAL_IP6)
                .into_iter()
                .collect(),
            localhost_node_ports: false,
            host: dual_stack
                .then_some(NODE_EXTERNAL_IP6)
                .into_iter()
                .collect(),
        };
        self.programmer
            .set_node_addresses(&node, &node6, &self.state, &mut self.maps)
            .unwrap();
    }

    fn program(&mut self, services: Vec<DesiredService>) {
        self.state = DesiredState {
            services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
            ..DesiredState::default()
        };
        self.programmer.sync(&self.state, &mut self.maps).unwrap();
    }

    fn set_flags(&mut self, flags: u32) {
        self.config.flags = flags;
        self.maps.put_config(&self.config).unwrap();
    }

    /// Clients of the node itself.
    fn host(&self) -> Place {
        Place {
            cgroup: self.cgroup.path.clone(),
            netns: self.tb.node_ns.clone(),
        }
    }

    /// Clients in a pod's namespace (still in the test cgroup).
    fn pod(&self, name: &str) -> Place {
        Place {
            cgroup: self.cgroup.path.clone(),
            netns: self.tb.pod(name).ns.clone(),
        }
    }

    fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The links go before the cgroup does.
        self.hooks.take();
    }
}

/// web (TCP and UDP): ClusterIP, NodePort, external IP, LB IP, to both pods;
/// empty: no endpoints; itp-local: internalTrafficPolicy Local, pod-a local;
/// guarded: an LB IP whose source ranges hold no node address.
fn services(tb: &Testbed) -> Vec<DesiredService> {
    services_with_web_on(tb, &["pod-a", "pod-b"])
}

/// [`services`] with web's endpoints on `web_pods` only.
fn services_with_web_on(tb: &Testbed, web_pods: &[&str]) -> Vec<DesiredService> {
    let dual_stack = tb.pods[0].ip6.is_some();
    // The IPv4 address, and the IPv6 one in a dual-stack fixture.
    let both = |v4: Ipv4Addr, v6: Ipv6Addr| -> Vec<IpAddr> {
        std::iter::once(IpAddr::V4(v4))
            .chain(dual_stack.then_some(IpAddr::V6(v6)))
            .collect()
    };
    // A pod's endpoints, one per address it has.
    let endpoints_of = |pod: &str, local: bool| -> Vec<Endpoint> {
        let p = tb.pod(pod);
        std::iter::once(IpAddr::V4(p.ip))
            .chain(p.ip6.map(IpAddr::V6))
            .map(|ip| endpoint(ip, local))
            .collect()
    };
    let web_endpoints: Vec<Endpoint> = web_pods
        .iter()
        .flat_map(|p| endpoints_of(p, true))
        .collect();
    let web = |protocol| DesiredService {
        node_port: Some(NODE_PORT),
        external_ips: both(EXTERNAL_IP, EXTERNAL_IP6),
        load_balancer_ips: both(LB_IP, LB_IP6),
        ..DesiredService::cluster_ip(
            spn("web", protocol),
            both(CLUSTER_IP, CLUSTER_IP6),
            80,
            web_endpoints.clone(),
        )
    };
    let empty = |protocol| DesiredService {
        node_port: Some(EMPTY_NODE_PORT),
        ..DesiredService::cluster_ip(
            spn("empty", protocol),
            both(EMPTY_IP, EMPTY_IP6),
            80,
            vec![],
        )
    };
    let a = endpoints_of("pod-a", true);
    let itp_local = DesiredService {
        internal_policy_local: true,
        local_endpoints: a.clone(),
        ..DesiredService::cluster_ip(
            spn("itp-local", Protocol::Tcp),
            both(ITP_LOCAL_IP, ITP_LOCAL_IP6),
            80,
            [a.clone(), endpoints_of("pod-b", false)].concat(),
        )
    };
    let guarded = DesiredService {
        load_balancer_ips: both(GUARDED_LB_IP, GUARDED_LB_IP6),
        load_balancer_source_ranges: vec![
            "198.18.200.0/24".parse::<IpNet>().unwrap(),
            "2001:db8:200::/64".parse::<IpNet>().unwrap(),
        ],
        ..DesiredService::cluster_ip(
            spn("guarded", Protocol::Tcp),
            both(Ipv4Addr::new(198, 19, 0, 13), GUARDED_IP6),
            80,
            a,
        )
    };
    vec![
        web(Protocol::Tcp),
        web(Protocol::Udp),
        empty(Protocol::Tcp),
        empty(Protocol::Udp),
        itp_local,
        guarded,
    ]
}

fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The identities `tries` clients got, failing on anything but an answer
/// shown as coming from `dst`.
fn identities(place: &Place, op: Op, dst: SocketAddr, tries: usize) -> BTreeSet<String> {
    (0..tries)
        .map(|_| match sock_client::run(place, op, dst) {
            Outcome::Answered { identity, peer } => {
                assert_eq!(
                    peer, dst,
                    "{op:?} to {dst}: the application sees the service address"
                );
                identity
            }
            other => panic!("{op:?} to {dst}: {other:?}"),
        })
        .collect()
}

fn assert_refused_at_once(place: &Place, op: Op, dst: SocketAddr) {
    match sock_client::run(place, op, dst) {
        Outcome::Refused { elapsed } => assert!(
            elapsed < Duration::from_millis(200),
            "{op:?} to {dst}: refused, but only after {elapsed:?}"
        ),
        other => panic!("{op:?} to {dst}: expected connection refused, got {other:?}"),
    }
}

#[test]
fn host_clients_reach_every_frontend_kind_over_tcp_and_udp_and_see_the_service_address() {
    let f = Fixture::new("frontends");
    let host = f.host();
    // Both of two random picks: 24 tries miss one once in 2^23 runs.
    let both: BTreeSet<String> = ["pod-a".to_string(), "pod-b".to_string()].into();
    assert_eq!(identities(&host, Op::Tcp, at(CLUSTER_IP, 80), 24), both);
    for dst in [
        at(ROUTED_GATEWAY, NODE_PORT),
        at(NODE_EXTERNAL_IP, NODE_PORT),
        at(Ipv4Addr::LOCALHOST, NODE_PORT),
        at(EXTERNAL_IP, 80),
        at(LB_IP, 80),
    ] {
        let got = identities(&host, Op::Tcp, dst, 3);
        assert!(got.is_subset(&both) && !got.is_empty(), "{dst}: {got:?}");
    }
    for op in [Op::Udp, Op::UdpConnected] {
        assert_eq!(
            identities(&host, op, at(CLUSTER_IP, 80), 24),
            both,
            "{op:?}"
        );
        for dst in [
            at(NODE_EXTERNAL_IP, NODE_PORT),
            at(Ipv4Addr::LOCALHOST, NODE_PORT),
            at(LB_IP, 80),
        ] {
            assert!(!identities(&host, op, dst, 2).is_empty(), "{op:?} {dst}");
        }
    }
    assert!(f.counter(Counter::SockTranslated) >= 16 * 3 + 15 + 12);
    assert!(f.counter(Counter::SockReverse) > 0);
    assert_eq!(
        f.counter(Counter::NewFlow),
        0,
        "no per-packet NAT was involved"
    );
}

#[test]
fn no_endpoints_and_unknown_ports_are_refused_at_once() {
    let f = Fixture::new("refused");
    let host = f.host();
    for dst in [at(EMPTY_IP, 80), at(NODE_EXTERNAL_IP, EMPTY_NODE_PORT)] {
        assert_refused_at_once(&host, Op::Tcp, dst);
        assert_refused_at_once(&host, Op::Udp, dst);
        assert_refused_at_once(&host, Op::UdpConnected, dst);
    }
    // A port of a cluster IP that is no service port.
    assert_refused_at_once(&host, Op::Tcp, at(CLUSTER_IP, 81));
    assert!(f.counter(Counter::SockRefused) >= 7);
}

#[test]
fn internal_traffic_policy_local_from_the_host_reaches_only_local_endpoints() {
    let f = Fixture::new("itp");
    let got = identities(&f.host(), Op::Tcp, at(ITP_LOCAL_IP, 80), 12);
    assert_eq!(got, ["pod-a".to_string()].into());
}

#[test]
fn source_ranges_without_a_node_address_refuse_the_host() {
    let f = Fixture::new("ranges");
    assert_refused_at_once(&f.host(), Op::Tcp, at(GUARDED_LB_IP, 80));
}

#[test]
fn localhost_node_ports_work_only_when_enabled() {
    let mut f = Fixture::new("localhost");
    let host = f.host();
    let dst = at(Ipv4Addr::LOCALHOST, NODE_PORT);
    assert!(!identities(&host, Op::Tcp, dst, 2).is_empty());
    f.node_addresses(false);
    // Nothing listens on the node's 127.0.0.1:30080: the kernel refuses.
    assert!(matches!(
        sock_client::run(&host, Op::Tcp, dst),
        Outcome::Refused { .. }
    ));
}

#[test]
fn pods_are_balanced_only_when_socket_lb_covers_them() {
    let mut f = Fixture::new("pods");
    let pod = f.pod("pod-b");
    let before = f.counter(Counter::SockTranslated);
    // hostNamespaceOnly: a pod's connect is not the hooks' business (and
    // with no TC program attached here, nothing else serves it).
    let untouched = sock_client::run(&pod, Op::Tcp, at(CLUSTER_IP, 80));
    assert!(untouched.identity().is_none(), "{untouched:?}");
    assert_eq!(f.counter(Counter::SockTranslated), before);

    f.set_flags(flags::SOCKET_LB_HOST | flags::SOCKET_LB_PODS);
    let got = identities(&pod, Op::Tcp, at(CLUSTER_IP, 80), 8);
    assert!(!got.is_empty());
    assert!(f.counter(Counter::SockTranslated) >= before + 8);
}

/// Runs `f` on a thread inside namespace `ns`, borrowing from the caller.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this scoped thread only.
            assert_eq!(
                unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            f()
        })
        .join()
        .unwrap()
    })
}

/// The identity of the next answer within `timeout`, skipping other lines.
fn next_answer(stream: &UdpStream, timeout: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match stream.next(left)? {
            line if line.starts_with("answer ") => {
                return Some(line["answer ".len()..].to_string());
            }
            _ => {}
        }
    }
    None
}

#[test]
fn a_connected_udp_client_stops_reaching_a_removed_backend_within_a_second() {
    connected_udp_client_leaves_a_removed_backend(Fixture::new("stale-udp"), at(CLUSTER_IP, 80));
}

#[test]
fn ipv6_a_connected_udp_client_stops_reaching_a_removed_backend_within_a_second() {
    connected_udp_client_leaves_a_removed_backend(
        Fixture::new_dual_stack("stale-udp6"),
        at(CLUSTER_IP6, 80),
    );
}

/// A connected UDP client of the node talks to `service`; one of its two
/// backends leaves; the agent's teardown destroys the client's socket, which
/// reconnects to the other within a second.
fn connected_udp_client_leaves_a_removed_backend(mut f: Fixture, service: SocketAddr) {
    let stream = UdpStream::start(&f.host(), service);
    let first = next_answer(&stream, Duration::from_secs(5)).expect("the client gets answers");
    let kept = if first == "pod-a" { "pod-b" } else { "pod-a" };
    let services = services_with_web_on(&f.tb, &[kept]);
    f.program(services);
    let gone = f.programmer.take_gone_udp();
    assert!(gone.iter().any(|g| g.service == service), "{gone:?}");
    let maps = &mut f.maps;
    let done = in_netns(&f.tb.node_ns, || forget_and_terminate(&gone, maps)).unwrap();
    assert_eq!(
        done.destroyed, 1,
        "the client's connected socket is destroyed"
    );
    // The removed pod still answers here, so a socket left alone would keep
    // getting its answers; after the destruction the client reconnects.
    let removed = std::time::Instant::now();
    let mut saw_failure = false;
    loop {
        let line = stream
            .next(Duration::from_secs(1))
            .expect("the client keeps reporting");
        if line.starts_with("failed") {
            saw_failure = true;
        } else if let Some(identity) = line.strip_prefix("answer ")
            && saw_failure
        {
            assert_eq!(
                identity, kept,
                "after reconnecting, only the kept backend answers"
            );
            break;
        }
        assert!(
            removed.elapsed() < Duration::from_secs(1),
            "the client still talks to {first} a second after it left (last line: {line})"
        );
    }
    for _ in 0..5 {
        assert_eq!(
            next_answer(&stream, Duration::from_secs(1)).as_deref(),
            Some(kept)
        );
    }
}

#[test]
fn ipv6_host_clients_reach_every_frontend_kind_over_tcp_and_udp_and_see_the_service_address() {
    let f = Fixture::new_dual_stack("frontends6");
    let host = f.host();
    // Both of two random picks: 24 tries miss one once in 2^23 runs.
    let both: BTreeSet<String> = ["pod-a".to_string(), "pod-b".to_string()].into();
    for op in [Op::Tcp, Op::Udp, Op::UdpConnected] {
        assert_eq!(
            identities(&host, op, at(CLUSTER_IP6, 80), 24),
            both,
            "{op:?}"
        );
        for dst in [
            at(NODE_EXTERNAL_IP6, NODE_PORT),
            at(EXTERNAL_IP6, 80),
            at(LB_IP6, 80),
        ] {
            let got = identities(&host, op, dst, 3);
            assert!(
                got.is_subset(&both) && !got.is_empty(),
                "{op:?} {dst}: {got:?}"
            );
        }
    }
    // The IPv4 frontends of the same services are served beside them.
    assert_eq!(identities(&host, Op::Tcp, at(CLUSTER_IP, 80), 24), both);
    assert_eq!(
        f.counter(Counter::NewFlow),
        0,
        "no per-packet NAT was involved"
    );
}

#[test]
fn ipv6_no_endpoints_unknown_ports_and_source_ranges_are_refused_at_once() {
    let f = Fixture::new_dual_stack("refused6");
    let host = f.host();
    for dst in [at(EMPTY_IP6, 80), at(NODE_EXTERNAL_IP6, EMPTY_NODE_PORT)] {
        assert_refused_at_once(&host, Op::Tcp, dst);
        assert_refused_at_once(&host, Op::Udp, dst);
        assert_refused_at_once(&host, Op::UdpConnected, dst);
    }
    assert_refused_at_once(&host, Op::Tcp, at(CLUSTER_IP6, 81));
    assert_refused_at_once(&host, Op::Tcp, at(GUARDED_LB_IP6, 80));
    let got = identities(&host, Op::Tcp, at(ITP_LOCAL_IP6, 80), 12);
    assert_eq!(
        got,
        ["pod-a".to_string()].into(),
        "internalTrafficPolicy Local"
    );
}

#[test]
fn ipv6_pods_are_balanced_only_when_socket_lb_covers_them() {
    let mut f = Fixture::new_dual_stack("pods6");
    let pod = f.pod("pod-b");
    let untouched = sock_client::run(&pod, Op::Tcp, at(CLUSTER_IP6, 80));
    assert!(untouched.identity().is_none(), "{untouched:?}");
    f.set_flags(flags::SOCKET_LB_HOST | flags::SOCKET_LB_PODS);
    let before = f.counter(Counter::SockTranslated);
    for op in [Op::Tcp, Op::Udp] {
        let got = identities(&pod, op, at(CLUSTER_IP6, 80), 8);
        assert!(!got.is_empty(), "{op:?}");
    }
    assert!(f.counter(Counter::SockTranslated) >= before + 16);
}

/// Entries of the socket hooks' maps (both families).
fn socket_entries(f: &Fixture) -> usize {
    f.maps.sockets.keys().count() + f.maps.v6.sockets.keys().count()
}

/// Until the socket maps hold `want` entries, at most two seconds (a
/// killed client's socket is released as its process ends).
fn wait_socket_entries(f: &Fixture, want: usize, why: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while socket_entries(f) != want {
        assert!(
            std::time::Instant::now() < deadline,
            "{why}: the socket maps hold {} entries, not {want}",
            socket_entries(f)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the hooks kept for a socket leaves with it (close, or the end of
/// its process); an open socket keeps it. Without the release hook a node's
/// short connections filled the LRU map with entries of closed sockets.
fn closed_sockets_leave_the_socket_maps(f: Fixture, service: SocketAddr) {
    let host = f.host();
    assert_eq!(socket_entries(&f), 0);
    identities(&host, Op::Tcp, service, 6);
    identities(&host, Op::UdpConnected, service, 6);
    assert_eq!(
        f.counter(Counter::SockTranslated),
        12,
        "every client went through the hooks"
    );
    wait_socket_entries(&f, 0, "12 clients came and went");
    // A live connected UDP socket: its reverse entry (for recvmsg and
    // getpeername) and its choice of backend.
    let stream = UdpStream::start(&host, service);
    next_answer(&stream, Duration::from_secs(5)).expect("the client gets answers");
    assert_eq!(socket_entries(&f), 2, "the open socket keeps both entries");
    drop(stream);
    wait_socket_entries(&f, 0, "the streaming client ended");
    // Unconnected sends keep a choice per service, which the hook cannot
    // find from the socket: those stay until the LRU evicts them.
    identities(&host, Op::Udp, service, 1);
    assert_eq!(socket_entries(&f), 2);
}

#[test]
fn a_closed_sockets_entries_leave_the_socket_maps() {
    closed_sockets_leave_the_socket_maps(Fixture::new("released"), at(CLUSTER_IP, 80));
}

#[test]
fn ipv6_a_closed_sockets_entries_leave_the_socket_maps() {
    closed_sockets_leave_the_socket_maps(Fixture::new_dual_stack("released6"), at(CLUSTER_IP6, 80));
}
