//! IPv6 and dual-stack end to end: the real agent binary programs
//! dual-stack Services (two `clusterIPs`, a NodePort, external IPs and
//! load-balancer IPs of both families, an EndpointSlice per family) from
//! manifest files, and real TCP and UDP reach every frontend kind over both
//! families at once, from a pod and from the external client, in native
//! XDP, generic XDP and TC-only modes: externalTrafficPolicy Cluster
//! masquerades to the node's address of the family, Local keeps the
//! client's; `explain --online` answers IPv6 packets from the agent's
//! pinned IPv6 maps. Then the two-node cluster in both families: IPv6
//! across nodes (pod to cluster IP, outside to either node's NodePort, by
//! XDP_TX where XDP runs), eTP Local, hairpin. Addresses from
//! 198.18.0.0/15 and 2001:db8::/32. Needs root.

use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use crate::{
    cleanup_common::BpfFs,
    sock_client::{self, Op, Outcome, Place},
    support::{Agent, wait_for},
};
use testbed::{
    EXTERNAL_CLIENT_IP, EXTERNAL_CLIENT_IP6, NODE_EXTERNAL_IP, NODE_EXTERNAL_IP6, Testbed, netns,
    servers,
};

const VIP4: &str = "198.19.0.20";
const VIP6: &str = "2001:db8:ffff::20";
const NODE_PORT: u16 = 30_620;
/// The eTP Local service.
const KEEP_VIP4: &str = "198.19.0.21";
const KEEP_VIP6: &str = "2001:db8:ffff::21";
const KEEP_NODE_PORT: u16 = 30_621;
/// External and load-balancer IPs, routed to the node by the external
/// client's default routes.
const EXTERNAL_IPS: [&str; 2] = ["2001:db8:200::30", "198.19.200.30"];
const LB_IPS: [&str; 2] = ["2001:db8:200::31", "198.19.200.31"];
const KEEP_LB_IPS: [&str; 2] = ["2001:db8:200::32", "198.19.200.32"];
const BACKENDS: [&str; 3] = ["web-0", "web-1", "web-2"];
const TIMEOUT: Duration = Duration::from_secs(2);

fn service_yaml(
    name: &str,
    vips: (&str, &str),
    node_port: u16,
    policy: &str,
    external_ips: &[&str],
    lb_ips: &[&str],
) -> String {
    let (vip6, vip4) = vips;
    let list = |ips: &[&str]| {
        ips.iter()
            .map(|ip| format!("\"{ip}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ingress = lb_ips
        .iter()
        .map(|ip| format!("{{ip: \"{ip}\"}}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: demo}}
spec:
  type: LoadBalancer
  externalTrafficPolicy: {policy}
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIP: {vip6}
  clusterIPs: [{vip6}, {vip4}]
  externalIPs: [{}]
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {node_port}}}
    - {{name: dns, protocol: UDP, port: 80, targetPort: 8080, nodePort: {node_port}}}
status:
  loadBalancer:
    ingress: [{ingress}]
"#,
        list(external_ips)
    )
}

/// This node, with an InternalIP of each family: the primary IPs that
/// masqueraded traffic leaves with.
fn node_yaml() -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: \"{NODE_EXTERNAL_IP}\"}}\n    - {{type: InternalIP, address: \"{NODE_EXTERNAL_IP6}\"}}\n"
    )
}

/// One EndpointSlice per family, as the EndpointSlice controller writes them.
fn slice_yaml(service: &str, address_type: &str, ips: &[String]) -> String {
    let on_a: Vec<(String, &str)> = ips.iter().map(|ip| (ip.clone(), "node-a")).collect();
    slice_yaml_on(service, address_type, &on_a)
}

/// The same with each endpoint on its node.
fn slice_yaml_on(service: &str, address_type: &str, endpoints: &[(String, &str)]) -> String {
    let name = format!("{service}-{}", address_type.to_lowercase());
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: demo\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {address_type}\nports:\n  - {{name: http, protocol: TCP, port: 8080}}\n  - {{name: dns, protocol: UDP, port: 8080}}\nendpoints:\n"
    );
    for (ip, node) in endpoints {
        s.push_str(&format!(
            "  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
        ));
    }
    s
}

/// `count` TCP connections and UDP requests from `ns` to `target`: the
/// identities reached; every UDP reply must come from `target`.
fn exercise(ns: &str, target: SocketAddr, count: usize) -> BTreeMap<String, usize> {
    netns::run_in(ns, move || {
        let mut hits = BTreeMap::new();
        for _ in 0..count {
            let id = servers::tcp_identity(target, TIMEOUT)
                .unwrap_or_else(|e| panic!("TCP to {target}: {e:#}"));
            *hits.entry(id).or_insert(0) += 1;
            let (id, from) = servers::udp_identity(target, TIMEOUT)
                .unwrap_or_else(|e| panic!("UDP to {target}: {e:#}"));
            assert_eq!(from, target, "the UDP reply must come from {target}");
            *hits.entry(id).or_insert(0) += 1;
        }
        hits
    })
    .unwrap()
}

/// TCP from `ns` to `target` until it answers.
fn wait_answers(ns: &str, target: SocketAddr) {
    let ns = ns.to_owned();
    wait_for(
        Duration::from_secs(20),
        &format!("{target} to answer"),
        || {
            netns::run_in(&ns, move || {
                servers::tcp_identity(target, Duration::from_millis(300)).ok()
            })
            .unwrap()
        },
    );
}

/// The source addresses the backends saw since the last call.
fn sources(servers: &[servers::IdentityServer]) -> Vec<IpAddr> {
    let mut all = Vec::new();
    for s in servers {
        all.extend(s.seen.tcp.lock().unwrap().iter().map(|p| p.ip()));
        all.extend(s.seen.udp.lock().unwrap().iter().map(|p| p.ip()));
        s.clear_seen();
    }
    all
}

fn dual_stack_end_to_end(xdp_mode: &str, expect_logged: &str) {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new_dual_stack(&pods).unwrap();
    let servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| {
            servers::IdentityServer::start_dual_stack(&tb.pod(name).ns, name, 8080).unwrap()
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let v4: Vec<String> = BACKENDS.iter().map(|b| tb.pod(b).ip.to_string()).collect();
    let v6: Vec<String> = BACKENDS
        .iter()
        .map(|b| tb.pod(b).ip6.unwrap().to_string())
        .collect();
    let web = service_yaml(
        "web",
        (VIP6, VIP4),
        NODE_PORT,
        "Cluster",
        &EXTERNAL_IPS,
        &LB_IPS,
    );
    let keep = service_yaml(
        "keep",
        (KEEP_VIP6, KEEP_VIP4),
        KEEP_NODE_PORT,
        "Local",
        &[],
        &KEEP_LB_IPS,
    );
    fs::write(dir.path().join("services.yaml"), format!("{web}---{keep}")).unwrap();
    fs::write(dir.path().join("node.yaml"), node_yaml()).unwrap();
    for service in ["web", "keep"] {
        for (family, ips) in [("IPv4", &v4), ("IPv6", &v6)] {
            let file = dir.path().join(format!("{service}-{family}.yaml"));
            fs::write(file, slice_yaml(service, family, ips)).unwrap();
        }
    }
    let bpffs = BpfFs::new();
    let pin_root = bpffs.dir.join("kube-ebpf-proxy");
    let agent = Agent::start_as(
        &tb.node_ns,
        "node-a",
        dir.path(),
        dir.path().join("agent.log"),
        &[
            "--ebpf-xdp-mode",
            xdp_mode,
            "--ebpf-pin-root",
            pin_root.to_str().unwrap(),
            "--ebpf-detach-on-exit",
        ],
    );

    let client = tb.pod("client").ns.clone();
    let (client4, client6) = (tb.pod("client").ip, tb.pod("client").ip6.unwrap());
    let vip6 = SocketAddr::new(VIP6.parse().unwrap(), 80);
    let vip4 = SocketAddr::new(VIP4.parse().unwrap(), 80);
    wait_answers(&client, vip6);
    wait_answers(&client, vip4);
    // Pods are served once their interface is attached, maybe before the
    // external one is: the first sync's report comes after both.
    agent.wait_programs_attached();
    assert!(
        agent.log_text().contains(&format!("xdp={expect_logged}")),
        "the chosen XDP mode is logged\n{}",
        agent.log_text()
    );

    // From a pod, both cluster IPs, both protocols: every backend is
    // reached in each family, from the pod's own address of that family.
    sources(&servers);
    for target in [vip6, vip4] {
        let hits = exercise(&client, target, 45);
        assert_eq!(hits.values().sum::<usize>(), 90, "{target}: {hits:?}");
        for b in BACKENDS {
            assert!(
                hits.get(b).copied().unwrap_or(0) >= 5,
                "{target}: {b} in {hits:?}"
            );
        }
    }
    let seen = sources(&servers);
    assert!(
        seen.contains(&IpAddr::V6(client6)) && seen.contains(&IpAddr::V4(client4)),
        "each family's connections come from the pod's address of that family: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|p| *p == IpAddr::V6(client6) || *p == IpAddr::V4(client4)),
        "no connection crossed families, none was masqueraded: {seen:?}"
    );

    // The node's own sockets (socket-level balancing, the IPv6 hooks): a
    // connect or send to an IPv6 cluster IP goes to an IPv6 backend, and
    // getpeername / recvmsg show the cluster IP. The node has no route to
    // the service range: only the hooks can make these succeed.
    let host = Place {
        cgroup: agent
            .cgroup
            .as_ref()
            .expect("the agent's test cgroup")
            .path
            .clone(),
        netns: tb.node_ns.clone(),
    };
    for op in [Op::Tcp, Op::Udp, Op::UdpConnected] {
        match sock_client::run(&host, op, vip6) {
            Outcome::Answered { identity, peer } => {
                assert!(BACKENDS.contains(&identity.as_str()), "{op:?}: {identity}");
                assert_eq!(peer, vip6, "{op:?}: the application sees the cluster IP");
            }
            other => panic!(
                "{op:?} from the node to {vip6}: {other:?}\n{}",
                agent.log_text()
            ),
        }
    }
    sources(&servers);

    // From outside: the NodePort on the node's addresses, the external IPs
    // and the LB IPs of both families. eTP Cluster masquerades to the
    // node's address of the family.
    let ext = tb.external_ns.clone();
    let node = [IpAddr::V6(NODE_EXTERNAL_IP6), IpAddr::V4(NODE_EXTERNAL_IP)];
    let mut targets: Vec<SocketAddr> = node
        .iter()
        .map(|ip| SocketAddr::new(*ip, NODE_PORT))
        .collect();
    targets.extend(
        EXTERNAL_IPS
            .iter()
            .chain(&LB_IPS)
            .map(|ip| SocketAddr::new(ip.parse().unwrap(), 80)),
    );
    for target in targets {
        wait_answers(&ext, target);
        let hits = exercise(&ext, target, 15);
        assert_eq!(hits.values().sum::<usize>(), 30, "{target}: {hits:?}");
        assert!(hits.len() >= 2, "{target}: balanced: {hits:?}");
        let seen = sources(&servers);
        let node_of_family = if target.is_ipv6() { node[0] } else { node[1] };
        assert!(
            seen.iter().all(|p| *p == node_of_family),
            "{target}: eTP Cluster masquerades to {node_of_family}: {seen:?}"
        );
    }

    // A ServiceCIDR appears: from then on, traffic from a pod to an address
    // of it that no service holds is dropped (and counted), in both families.
    let events = |name: &str| datapath_events(&tb.node_ns, name);
    let before = events("drop_unallocated_cluster_ip");
    fs::write(
        dir.path().join("service-cidr.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec:\n  cidrs: [198.19.0.0/24, \"2001:db8:ffff::/112\"]\n",
    )
    .unwrap();
    let unallocated = [
        SocketAddr::new("2001:db8:ffff::99".parse().unwrap(), 80),
        SocketAddr::new("198.19.0.99".parse().unwrap(), 80),
    ];
    wait_for(
        Duration::from_secs(20),
        "connections to unallocated cluster IPs to be dropped",
        || {
            for target in unallocated {
                let _ = netns::run_in(&client, move || {
                    servers::tcp_identity(target, Duration::from_millis(200))
                });
            }
            (events("drop_unallocated_cluster_ip") >= before + 2).then_some(())
        },
    );
    // Allocated cluster IPs still answer.
    wait_answers(&client, vip6);
    sources(&servers);

    // `explain --online` reads the IPv6 maps the agent pinned: an IPv6
    // packet from the pod to the IPv6 cluster IP, and one from outside to
    // the node's IPv6 NodePort, masqueraded to the node's IPv6.
    let pin_dir = pin_root.join(format!("v{}/maps", proxy_common::ABI_VERSION));
    let v6_backends: Vec<String> = v6.iter().map(|ip| format!("[{ip}]:8080")).collect();
    let from_pod = explain_online(
        &tb.node_ns,
        &pin_dir,
        &["tcp", &client6.to_string(), VIP6, "80", "pod"],
    );
    assert_eq!(from_pod["verdict"], "forwarded", "{from_pod:#}");
    assert!(
        v6_backends.contains(&from_pod["endpoint"].as_str().unwrap().to_string()),
        "{from_pod:#}"
    );
    assert_eq!(from_pod["frontend"]["kind"], "ClusterIP");
    let from_outside = explain_online(
        &tb.node_ns,
        &pin_dir,
        &[
            "udp",
            &EXTERNAL_CLIENT_IP6.to_string(),
            &NODE_EXTERNAL_IP6.to_string(),
            &NODE_PORT.to_string(),
            "outside",
        ],
    );
    assert_eq!(from_outside["verdict"], "forwarded", "{from_outside:#}");
    assert_eq!(from_outside["masqueraded"], true, "{from_outside:#}");
    let source: SocketAddr = from_outside["source"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        source.ip(),
        IpAddr::V6(NODE_EXTERNAL_IP6),
        "{from_outside:#}"
    );

    // eTP Local (every endpoint is on this node): the client's own address stays.
    let mut keep_targets: Vec<SocketAddr> = node
        .iter()
        .map(|ip| SocketAddr::new(*ip, KEEP_NODE_PORT))
        .collect();
    keep_targets.extend(
        KEEP_LB_IPS
            .iter()
            .map(|ip| SocketAddr::new(ip.parse().unwrap(), 80)),
    );
    for target in keep_targets {
        wait_answers(&ext, target);
        let hits = exercise(&ext, target, 10);
        assert_eq!(hits.values().sum::<usize>(), 20, "{target}: {hits:?}");
        let seen = sources(&servers);
        let client_of_family = if target.is_ipv6() {
            IpAddr::V6(EXTERNAL_CLIENT_IP6)
        } else {
            IpAddr::V4(EXTERNAL_CLIENT_IP)
        };
        assert!(
            seen.iter().all(|p| *p == client_of_family),
            "{target}: eTP Local keeps {client_of_family}: {seen:?}"
        );
    }
    drop(agent);
}

/// `proxy-agent explain --online` in the node's namespace for
/// `[proto, src, dst, dport, from]`, as JSON.
fn explain_online(ns: &str, pin_dir: &std::path::Path, packet: &[&str; 5]) -> serde_json::Value {
    let [proto, src, dst, dport, from] = packet;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_proxy-agent")])
        .args(["explain", "--online", "--output", "json", "--pin-dir"])
        .arg(pin_dir)
        .args(["--proto", proto, "--src", src, "--dst", dst])
        .args(["--dport", dport, "--from", from])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "explain --online {packet:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn dual_stack_services_through_generic_xdp() {
    dual_stack_end_to_end("generic", "Generic");
}

#[test]
fn dual_stack_services_through_native_xdp() {
    dual_stack_end_to_end("native", "Native");
}

#[test]
fn dual_stack_services_through_tc_only() {
    dual_stack_end_to_end("disabled", "None");
}

/// Two dual-stack nodes, both running the agent: IPv6 crosses nodes from a
/// pod to a cluster IP, from outside to either node's IPv6 NodePort
/// (masqueraded to that node's IPv6; on node A in the XDP modes the
/// answer leaves by `XDP_TX`, the endpoint being behind the other node),
/// eTP Local keeps the client's IPv6 on the endpoint's node and drops on
/// the other, and a pod reaching itself through its IPv6 cluster IP is
/// masqueraded to its node's IPv6 (hairpin). IPv4 is served beside it.
fn two_dual_stack_nodes(xdp_mode: &str) {
    use testbed::cluster::{CLIENT_IP6, Cluster, NodeId};

    let mut cluster = Cluster::new_dual_stack().unwrap();
    let web_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
    let web_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
    let client_a = cluster.add_pod(NodeId::A, "client-a").unwrap();
    let servers: Vec<_> = [&web_a, &web_b]
        .iter()
        .map(|p| servers::IdentityServer::start_dual_stack(&p.ns, &p.name, 8080).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, text: String| fs::write(dir.path().join(file), text).unwrap();
    let nodes: Vec<String> = NodeId::ALL
        .iter()
        .map(|&id| {
            let n = cluster.node(id);
            format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: node-{id}}}\nspec:\n  podCIDR: {}\n  podCIDRs: [{}, \"{}\"]\nstatus:\n  addresses:\n    - {{type: InternalIP, address: \"{}\"}}\n    - {{type: InternalIP, address: \"{}\"}}\n",
                n.pod_cidr,
                n.pod_cidr,
                n.pod_cidr6.as_ref().unwrap(),
                n.ip,
                n.ip6.unwrap()
            )
        })
        .collect();
    write("nodes.yaml", nodes.join("---\n"));
    let (remote, local, hairpin) = (30_680, 30_681, 30_682);
    for (name, vips, node_port, policy, on) in [
        (
            "remote",
            ("2001:db8:ffff::30", "198.19.0.30"),
            remote,
            "Cluster",
            &web_b,
        ),
        (
            "local",
            ("2001:db8:ffff::31", "198.19.0.31"),
            local,
            "Local",
            &web_b,
        ),
        (
            "hairpin",
            ("2001:db8:ffff::32", "198.19.0.32"),
            hairpin,
            "Cluster",
            &web_a,
        ),
    ] {
        write(
            &format!("{name}.yaml"),
            service_yaml(name, vips, node_port, policy, &[], &[]),
        );
        let node = if on.name == "web-a" {
            "node-a"
        } else {
            "node-b"
        };
        for (family, ip) in [
            ("IPv4", on.ip.to_string()),
            ("IPv6", on.ip6.unwrap().to_string()),
        ] {
            write(
                &format!("{name}-{family}.yaml"),
                slice_yaml_on(name, family, &[(ip, node)]),
            );
        }
    }
    let agents: Vec<Agent> = NodeId::ALL
        .iter()
        .map(|&id| {
            Agent::start_as(
                &cluster.node(id).ns,
                &format!("node-{id}"),
                dir.path(),
                dir.path().join(format!("node-{id}.log")),
                &[
                    "--detect-local-mode",
                    "NodeCIDR",
                    "--ebpf-xdp-mode",
                    xdp_mode,
                ],
            )
        })
        .collect();
    let logs = || {
        agents
            .iter()
            .map(|a| a.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let (node_a6, node_b6) = (
        IpAddr::V6(cluster.node(NodeId::A).ip6.unwrap()),
        IpAddr::V6(cluster.node(NodeId::B).ip6.unwrap()),
    );
    let client = cluster.client().ns.clone();
    wait_answers(&client, SocketAddr::new(node_a6, remote));
    wait_answers(&client, SocketAddr::new(node_b6, remote));
    sources(&servers);

    // Every target reaches only `backend`, seen from `source`.
    let check = |ns: &str, target: SocketAddr, backend: &str, source: IpAddr| {
        let hits = exercise(ns, target, 5);
        assert_eq!(
            hits.keys().collect::<Vec<_>>(),
            [backend],
            "{target}: {hits:?}\n{}",
            logs()
        );
        let seen = sources(&servers);
        assert!(
            !seen.is_empty() && seen.iter().all(|s| *s == source),
            "{target}: seen from {seen:?}, expected {source}"
        );
    };
    let pod_a6 = IpAddr::V6(client_a.ip6.unwrap());
    let remote_vip6 = SocketAddr::new("2001:db8:ffff::30".parse().unwrap(), 80);
    check(&client_a.ns, remote_vip6, "web-b", pod_a6);
    let xdp_tx_a = || xdp_tx(&cluster.node(NodeId::A).ns);
    let before = xdp_tx_a();
    check(&client, SocketAddr::new(node_a6, remote), "web-b", node_a6);
    let sent_back_by_xdp = xdp_tx_a() - before;
    if xdp_mode == "disabled" {
        assert_eq!(sent_back_by_xdp, 0, "no XDP program in TC-only mode");
    } else {
        // 5 TCP connections and 5 UDP exchanges, each way through node A.
        assert!(
            sent_back_by_xdp >= 20,
            "IPv6 NodePort traffic to the other node leaves by XDP_TX: {sent_back_by_xdp}"
        );
    }
    check(&client, SocketAddr::new(node_b6, remote), "web-b", node_b6);
    let node_a4 = IpAddr::V4(cluster.node(NodeId::A).ip);
    check(&client, SocketAddr::new(node_a4, remote), "web-b", node_a4);
    check(
        &client,
        SocketAddr::new(node_b6, local),
        "web-b",
        IpAddr::V6(CLIENT_IP6),
    );
    let dropped = netns::run_in(&client, move || {
        servers::tcp_identity(SocketAddr::new(node_a6, local), Duration::from_millis(500))
    })
    .unwrap();
    assert!(
        dropped.is_err(),
        "eTP Local without an endpoint on node A drops: {dropped:?}"
    );
    let hairpin_vip6 = SocketAddr::new("2001:db8:ffff::32".parse().unwrap(), 80);
    check(&web_a.ns, hairpin_vip6, "web-a", node_a6);
    drop(agents);
}

/// The node agent's `xdp_tx` datapath events, from its metrics endpoint.
fn xdp_tx(node_ns: &str) -> u64 {
    datapath_events(node_ns, "xdp_tx")
}

/// The node agent's datapath events named `event`, from its metrics endpoint.
fn datapath_events(node_ns: &str, event: &str) -> u64 {
    let reply = netns::run_in(node_ns, || {
        crate::http_client::get("127.0.0.1:10249".parse().unwrap(), "/metrics")
    })
    .unwrap()
    .expect("the agent's metrics");
    let prefix = format!("kubeproxy_ebpf_datapath_events_total{{event=\"{event}\"}} ");
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[test]
fn two_dual_stack_nodes_through_native_xdp() {
    two_dual_stack_nodes("native");
}

#[test]
fn two_dual_stack_nodes_through_tc_only() {
    two_dual_stack_nodes("disabled");
}

#[test]
fn two_dual_stack_nodes_through_generic_xdp() {
    two_dual_stack_nodes("generic");
}
