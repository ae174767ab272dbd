//! End to end in a two-node testbed: both nodes run the real agent binary
//! against the same manifests; an external client, pods on both nodes and
//! real TCP/UDP exercise every way a packet reaches a Service (NodePort, LB
//! IP, external IP, ClusterIP), traffic policies, masquerade, source ranges,
//! reject, hairpin and the XDP fast path. Needs root.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use crate::support::Agent;
use testbed::{
    clients::{ConnectOutcome, UdpOutcome, tcp_connect_outcome, udp_outcome},
    cluster::{Cluster, NodeId},
    netns,
    servers::IdentityServer,
};

const TIMEOUT: Duration = Duration::from_millis(800);
const BACKEND_PORT: u16 = 8080;
/// Load-balancer and external IPs live here; the client routes them to a node.
const LB_NET: &str = "198.18.3.0/24";

const REMOTE_NODEPORT: u16 = 30080;
const LOCAL_NODEPORT: u16 = 30081;
const EMPTY_NODEPORT: u16 = 30082;
const REMOTE_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 20);
const REMOTE_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 30);
const LOCAL_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 21);
const LOCAL_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 31);
const EMPTY_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 22);
const EMPTY_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 32);
const RANGED_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 23);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 12);
const HAIRPIN_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 14);
const ITP_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 15);
const ITP_REMOTE_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 16);
const ALLOWED_EXTRA: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const DENIED_SOURCE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);

pub(crate) fn node_yaml(name: &str, ip: Ipv4Addr, pod_cidr: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec: {{podCIDR: {pod_cidr}, podCIDRs: [{pod_cidr}]}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {ip}}}\n"
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn service_yaml(
    name: &str,
    cluster_ip: &str,
    node_port: Option<u16>,
    policy: &str,
    lb: Option<Ipv4Addr>,
    external_ip: Option<Ipv4Addr>,
    ranges: &[&str],
) -> String {
    let kind = if lb.is_some() {
        "LoadBalancer"
    } else if node_port.is_some() {
        "NodePort"
    } else {
        "ClusterIP"
    };
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  type: {kind}\n  clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n"
    );
    if kind != "ClusterIP" {
        s.push_str(&format!("  externalTrafficPolicy: {policy}\n"));
    }
    let np = node_port
        .map(|p| format!(", nodePort: {p}"))
        .unwrap_or_default();
    s.push_str(&format!(
        "  ports:\n    - {{name: tcp, protocol: TCP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n    - {{name: udp, protocol: UDP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n"
    ));
    if let Some(ip) = external_ip {
        s.push_str(&format!("  externalIPs: [{ip}]\n"));
    }
    if !ranges.is_empty() {
        s.push_str(&format!(
            "  loadBalancerSourceRanges: [{}]\n",
            ranges.join(", ")
        ));
    }
    if let Some(ip) = lb {
        s.push_str(&format!(
            "status:\n  loadBalancer:\n    ingress: [{{ip: {ip}}}]\n"
        ));
    }
    s
}

pub(crate) fn slice_yaml(service: &str, endpoints: &[(Ipv4Addr, &str)]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n  namespace: e2e\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports:\n  - {{name: tcp, protocol: TCP, port: {BACKEND_PORT}}}\n  - {{name: udp, protocol: UDP, port: {BACKEND_PORT}}}\nendpoints:\n"
    );
    if endpoints.is_empty() {
        s = s.replace("endpoints:\n", "endpoints: []\n");
    }
    for (ip, node) in endpoints {
        s.push_str(&format!(
            "  - addresses: [{ip}]\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
        ));
    }
    s
}

struct Scene {
    cluster: Cluster,
    servers: Vec<IdentityServer>,
    agents: Vec<Agent>,
    _dir: tempfile::TempDir,
}

impl Scene {
    fn server(&self, name: &str) -> &IdentityServer {
        let i = ["web-a", "web-b"].iter().position(|n| *n == name).unwrap();
        &self.servers[i]
    }

    fn client_ns(&self) -> String {
        self.cluster.client().ns.clone()
    }

    fn node_ip(&self, id: NodeId) -> Ipv4Addr {
        self.cluster.node(id).ip
    }

    fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|a| a.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// Sends the client's traffic for the LB/external-IP range through `via`.
    fn route_lb_via(&self, via: NodeId) {
        let gw = self.node_ip(via).to_string();
        netns::ip(
            Some(&self.client_ns()),
            &["route", "replace", LB_NET, "via", &gw],
        )
        .unwrap();
    }
}

fn scene(xdp_mode: &str) -> Scene {
    let mut cluster = Cluster::new().unwrap();
    let web_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
    let web_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
    cluster.add_pod(NodeId::A, "client-a").unwrap();
    cluster.client_add_address("198.18.0.101/24").unwrap();
    let servers = vec![
        IdentityServer::start(&web_a.ns, "web-a", BACKEND_PORT).unwrap(),
        IdentityServer::start(&web_b.ns, "web-b", BACKEND_PORT).unwrap(),
    ];

    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: String| fs::write(dir.path().join(file), text).unwrap();
    let a = cluster.node(NodeId::A);
    let b = cluster.node(NodeId::B);
    write(
        "nodes.yaml",
        format!(
            "{}---\n{}",
            node_yaml("node-a", a.ip, &a.pod_cidr.to_string()),
            node_yaml("node-b", b.ip, &b.pod_cidr.to_string())
        ),
    );
    let on_b = [(web_b.ip, "node-b")];
    let services = [
        (
            "remote",
            service_yaml(
                "remote",
                "198.19.0.10",
                Some(REMOTE_NODEPORT),
                "Cluster",
                Some(REMOTE_LB),
                Some(REMOTE_EXTERNAL_IP),
                &[],
            ),
            slice_yaml("remote", &on_b),
        ),
        (
            "local",
            service_yaml(
                "local",
                "198.19.0.11",
                Some(LOCAL_NODEPORT),
                "Local",
                Some(LOCAL_LB),
                Some(LOCAL_EXTERNAL_IP),
                &[],
            ),
            slice_yaml("local", &on_b),
        ),
        (
            "empty",
            service_yaml(
                "empty",
                &EMPTY_VIP.to_string(),
                Some(EMPTY_NODEPORT),
                "Cluster",
                Some(EMPTY_LB),
                Some(EMPTY_EXTERNAL_IP),
                &[],
            ),
            slice_yaml("empty", &[]),
        ),
        (
            "ranged",
            service_yaml(
                "ranged",
                "198.19.0.13",
                Some(30083),
                "Cluster",
                Some(RANGED_LB),
                None,
                &["198.18.0.100/32"],
            ),
            slice_yaml("ranged", &on_b),
        ),
        (
            "hairpin",
            service_yaml(
                "hairpin",
                &HAIRPIN_VIP.to_string(),
                None,
                "Cluster",
                None,
                None,
                &[],
            ),
            slice_yaml("hairpin", &[(web_a.ip, "node-a")]),
        ),
    ];
    let itp_local = |svc: String| svc.replace("spec:\n", "spec:\n  internalTrafficPolicy: Local\n");
    let services = services.into_iter().chain([
        (
            "itp",
            itp_local(service_yaml(
                "itp",
                &ITP_VIP.to_string(),
                None,
                "Cluster",
                None,
                None,
                &[],
            )),
            slice_yaml("itp", &[(web_a.ip, "node-a"), (web_b.ip, "node-b")]),
        ),
        (
            "itp-remote",
            itp_local(service_yaml(
                "itp-remote",
                &ITP_REMOTE_VIP.to_string(),
                None,
                "Cluster",
                None,
                None,
                &[],
            )),
            slice_yaml("itp-remote", &on_b),
        ),
    ]);
    for (name, svc, slice) in services {
        write(&format!("{name}-svc.yaml"), svc);
        write(&format!("{name}-slice.yaml"), slice);
    }

    let agents = [(NodeId::A, "node-a"), (NodeId::B, "node-b")]
        .into_iter()
        .map(|(id, name)| {
            Agent::start_as(
                &cluster.node(id).ns,
                name,
                dir.path(),
                dir.path().join(format!("{name}.log")),
                &[
                    "--detect-local-mode",
                    "NodeCIDR",
                    "--ebpf-xdp-mode",
                    xdp_mode,
                ],
            )
        })
        .collect();
    let scene = Scene {
        cluster,
        servers,
        agents,
        _dir: dir,
    };
    let client = scene.client_ns();
    let target = SocketAddrV4::new(scene.node_ip(NodeId::A), REMOTE_NODEPORT);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let outcome = tcp_connect_outcome(&client, None, target, TIMEOUT);
        if outcome.identity().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let mut scene = scene;
            for agent in &mut scene.agents {
                agent.stop();
            }
            let nstat = std::process::Command::new("ip")
                .args(["netns", "exec", &client, "nstat", "-az"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!(
                "NodePort on node A never answered ({outcome:?})\n{}\nclient nstat:\n{nstat}",
                scene.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for agent in &scene.agents {
        agent.wait_programs_attached();
    }
    scene
}

fn tcp(ns: &str, src: Option<Ipv4Addr>, ip: Ipv4Addr, port: u16) -> ConnectOutcome {
    tcp_connect_outcome(ns, src, SocketAddrV4::new(ip, port), TIMEOUT)
}

fn udp(ns: &str, src: Option<Ipv4Addr>, ip: Ipv4Addr, port: u16) -> UdpOutcome {
    udp_outcome(ns, src, SocketAddrV4::new(ip, port), TIMEOUT)
}

fn assert_reaches(scene: &Scene, what: &str, outcome: ConnectOutcome, backend: &str) {
    match outcome {
        ConnectOutcome::Connected { identity, .. } => {
            assert_eq!(identity, backend, "{what}: wrong backend")
        }
        other => panic!(
            "{what}: expected to reach {backend}, got {other:?}\n{}",
            scene.logs()
        ),
    }
}

fn assert_refused_now(scene: &Scene, what: &str, outcome: ConnectOutcome) {
    match outcome {
        ConnectOutcome::Refused { elapsed } => {
            assert!(
                elapsed < Duration::from_millis(500),
                "{what}: refused only after {elapsed:?}"
            )
        }
        other => panic!(
            "{what}: expected connection refused, got {other:?}\n{}",
            scene.logs()
        ),
    }
}

fn assert_timed_out(scene: &Scene, what: &str, outcome: ConnectOutcome) {
    assert!(
        matches!(outcome, ConnectOutcome::TimedOut),
        "{what}: expected a silent drop, got {outcome:?}\n{}",
        scene.logs()
    );
}

/// The sources `backend` saw since the last check.
fn seen(scene: &Scene, backend: &str) -> Vec<Ipv4Addr> {
    let s = scene.server(backend);
    let mut v = s.tcp_sources();
    v.extend(s.udp_sources());
    s.clear_seen();
    v
}

fn external_traffic(xdp_mode: &str, expect_logged: &str) {
    let scene = scene(xdp_mode);
    assert!(
        scene.agents[0]
            .log_text()
            .contains(&format!("xdp={expect_logged}")),
        "the chosen XDP mode is logged\n{}",
        scene.logs()
    );
    let client = scene.client_ns();
    let (a, b) = (scene.node_ip(NodeId::A), scene.node_ip(NodeId::B));
    let client_ip = scene.cluster.client().ip;
    seen(&scene, "web-b");

    // eTP Cluster: node A forwards to node B's pod, masqueraded as node A.
    for _ in 0..20 {
        assert_reaches(
            &scene,
            "NodePort via node A",
            tcp(&client, None, a, REMOTE_NODEPORT),
            "web-b",
        );
    }
    match udp(&client, None, a, REMOTE_NODEPORT) {
        UdpOutcome::Reply { identity, .. } => assert_eq!(identity, "web-b"),
        other => panic!("UDP NodePort via node A: {other:?}\n{}", scene.logs()),
    }
    let sources = seen(&scene, "web-b");
    assert!(
        !sources.is_empty() && sources.iter().all(|s| *s == a),
        "eTP Cluster must masquerade to node A: {sources:?}"
    );

    scene.route_lb_via(NodeId::A);
    assert_reaches(
        &scene,
        "LB IP via node A",
        tcp(&client, None, REMOTE_LB, 80),
        "web-b",
    );
    assert_reaches(
        &scene,
        "external IP via node A",
        tcp(&client, None, REMOTE_EXTERNAL_IP, 80),
        "web-b",
    );
    let sources = seen(&scene, "web-b");
    assert!(
        sources.iter().all(|s| *s == a),
        "LB/external IP with eTP Cluster masquerade: {sources:?}"
    );

    // eTP Local: node A has no local endpoint and drops; node B serves and keeps the client address.
    assert_timed_out(
        &scene,
        "eTP Local NodePort on node A",
        tcp(&client, None, a, LOCAL_NODEPORT),
    );
    assert_timed_out(
        &scene,
        "eTP Local LB IP via node A",
        tcp(&client, None, LOCAL_LB, 80),
    );
    assert_timed_out(
        &scene,
        "eTP Local external IP via node A",
        tcp(&client, None, LOCAL_EXTERNAL_IP, 80),
    );
    assert_reaches(
        &scene,
        "eTP Local NodePort on node B",
        tcp(&client, None, b, LOCAL_NODEPORT),
        "web-b",
    );
    scene.route_lb_via(NodeId::B);
    assert_reaches(
        &scene,
        "eTP Local LB IP via node B",
        tcp(&client, None, LOCAL_LB, 80),
        "web-b",
    );
    assert_reaches(
        &scene,
        "eTP Local external IP via node B",
        tcp(&client, None, LOCAL_EXTERNAL_IP, 80),
        "web-b",
    );
    let sources = seen(&scene, "web-b");
    assert!(
        !sources.is_empty() && sources.iter().all(|s| *s == client_ip),
        "eTP Local preserves the client address: {sources:?}"
    );

    // loadBalancerSourceRanges: 198.18.0.100/32 only.
    scene.route_lb_via(NodeId::A);
    assert_reaches(
        &scene,
        "LB IP from an allowed source",
        tcp(&client, Some(ALLOWED_EXTRA), RANGED_LB, 80),
        "web-b",
    );
    assert_timed_out(
        &scene,
        "LB IP from a denied source",
        tcp(&client, Some(DENIED_SOURCE), RANGED_LB, 80),
    );
    // Upstream does not apply source ranges to node ports.
    assert_reaches(
        &scene,
        "NodePort of a ranged service from a denied source",
        tcp(&client, Some(DENIED_SOURCE), a, 30083),
        "web-b",
    );

    // No endpoints: refused at once, for every frontend kind.
    assert_refused_now(
        &scene,
        "NodePort without endpoints",
        tcp(&client, None, a, EMPTY_NODEPORT),
    );
    assert_refused_now(
        &scene,
        "LB IP without endpoints",
        tcp(&client, None, EMPTY_LB, 80),
    );
    assert_refused_now(
        &scene,
        "external IP without endpoints",
        tcp(&client, None, EMPTY_EXTERNAL_IP, 80),
    );
    assert!(
        matches!(udp(&client, None, a, EMPTY_NODEPORT), UdpOutcome::Refused),
        "UDP NodePort without endpoints must be refused\n{}",
        scene.logs()
    );
}

#[test]
fn external_clients_through_generic_xdp() {
    external_traffic("generic", "Generic");
}

#[test]
fn external_clients_through_native_xdp() {
    external_traffic("native", "Native");
}

#[test]
fn external_clients_through_tc_only() {
    external_traffic("disabled", "None");
}

#[test]
fn pods_reach_services_on_their_own_node() {
    let scene = scene("auto");
    // On a veth, `auto` leaves XDP out: TC serves the interface, for less.
    let log = scene.agents[0].log_text();
    assert!(
        log.contains("xdp=None") && log.contains("veth: no XDP, TC handles this interface"),
        "auto on a veth attaches no XDP, and says why\n{}",
        scene.logs()
    );
    let client_a = scene.cluster.pod("client-a").ns.clone();
    let web_a = scene.cluster.pod("web-a").clone();
    let a = scene.node_ip(NodeId::A);
    seen(&scene, "web-b");

    // A pod reaching a NodePort on its own node.
    assert_reaches(
        &scene,
        "pod to NodePort on its node",
        tcp(&client_a, None, a, REMOTE_NODEPORT),
        "web-b",
    );
    // eTP Local does not apply to pods of this node: they reach the remote endpoint, unmasqueraded.
    seen(&scene, "web-b");
    assert_reaches(
        &scene,
        "pod to eTP Local NodePort on its node",
        tcp(&client_a, None, a, LOCAL_NODEPORT),
        "web-b",
    );
    let client_ip = scene.cluster.pod("client-a").ip;
    assert_eq!(
        seen(&scene, "web-b"),
        vec![client_ip],
        "short-circuited pod traffic keeps its address"
    );

    // internalTrafficPolicy Local: only this node's endpoint; none here means a drop.
    for _ in 0..10 {
        assert_reaches(
            &scene,
            "iTP Local ClusterIP",
            tcp(&client_a, None, ITP_VIP, 80),
            "web-a",
        );
    }
    assert_timed_out(
        &scene,
        "iTP Local without a local endpoint",
        tcp(&client_a, None, ITP_REMOTE_VIP, 80),
    );

    // ClusterIP without endpoints, and an unused port of a ClusterIP: refused.
    assert_refused_now(
        &scene,
        "ClusterIP without endpoints",
        tcp(&client_a, None, EMPTY_VIP, 80),
    );
    assert!(matches!(
        udp(&client_a, None, EMPTY_VIP, 80),
        UdpOutcome::Refused
    ));
    assert_refused_now(
        &scene,
        "unused port of a ClusterIP",
        tcp(&client_a, None, HAIRPIN_VIP, 81),
    );

    // Hairpin: the only endpoint reaches itself through its service, masqueraded.
    seen(&scene, "web-a");
    assert_reaches(
        &scene,
        "hairpin TCP",
        tcp(&web_a.ns, None, HAIRPIN_VIP, 80),
        "web-a",
    );
    match udp(&web_a.ns, None, HAIRPIN_VIP, 80) {
        UdpOutcome::Reply { identity, .. } => assert_eq!(identity, "web-a"),
        other => panic!("hairpin UDP: {other:?}\n{}", scene.logs()),
    }
    let sources = seen(&scene, "web-a");
    assert!(
        !sources.is_empty() && sources.iter().all(|s| *s == a),
        "hairpin is masqueraded to the node: {sources:?}"
    );
}
