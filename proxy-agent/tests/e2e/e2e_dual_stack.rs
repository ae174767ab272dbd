//! IPv6 and dual-stack end to end: the real agent binary programs
//! dual-stack Services (two `clusterIPs`, a NodePort, external IPs and
//! load-balancer IPs of both families, an EndpointSlice per family) from
//! manifest files, and real TCP and UDP reach every frontend kind over both
//! families at once, from a pod and from the external client, in native
//! XDP, generic XDP and TC-only modes: externalTrafficPolicy Cluster
//! masquerades to the node's address of the family, Local keeps the
//! client's; `explain --online` answers IPv6 packets from the agent's
//! pinned IPv6 maps. Addresses from 198.18.0.0/15 and 2001:db8::/32. Needs root.

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
    let name = format!("{service}-{}", address_type.to_lowercase());
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: demo\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {address_type}\nports:\n  - {{name: http, protocol: TCP, port: 8080}}\n  - {{name: dns, protocol: UDP, port: 8080}}\nendpoints:\n"
    );
    for ip in ips {
        s.push_str(&format!(
            "  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
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
    dual_stack_end_to_end("auto", "Generic");
}

#[test]
fn dual_stack_services_through_native_xdp() {
    dual_stack_end_to_end("native", "Native");
}

#[test]
fn dual_stack_services_through_tc_only() {
    dual_stack_end_to_end("disabled", "None");
}
