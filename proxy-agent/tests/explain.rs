//! `proxy-agent explain`, the built binary against the real kernel: every
//! frontend kind (ClusterIP, NodePort, LB IP, external IP) and every verdict
//! (forwarded with and without masquerade, dropped and why, rejected with a
//! RST or ICMP, passed through), `--flows`, JSON output, bad input, and the
//! online form reading a running agent's pinned maps in a testbed node.
//! Needs root.
//!
//! Addresses match the two-node testbed (`testbed::cluster`): node A
//! 198.18.0.1 with pods in 198.18.1.0/24, node B 198.18.0.2 with pods in
//! 198.18.2.0/24, the external client 198.18.0.100.

mod support;

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use serde_json::Value;
use support::{Agent, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");
const BACKEND_PORT: u16 = 8080;

const NODE_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const NODE_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const DENIED: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
/// A pod on node A that is no endpoint of anything.
const POD_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
const WEB_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const WEB_B: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
const TRIO: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 1, 21),
    Ipv4Addr::new(198, 18, 2, 21),
    Ipv4Addr::new(198, 18, 2, 22),
];

const REMOTE_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const REMOTE_NODEPORT: u16 = 30080;
const REMOTE_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 20);
const REMOTE_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 30);
const LOCAL_NODEPORT: u16 = 30081;
const LOCAL_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 21);
const LOCAL_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 31);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 12);
const EMPTY_NODEPORT: u16 = 30082;
const EMPTY_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 22);
const EMPTY_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 32);
const RANGED_NODEPORT: u16 = 30083;
const RANGED_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 23);
const HERE_NODEPORT: u16 = 30085;
const TRIO_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 20);

fn node_yaml(name: &str, ip: Ipv4Addr, pod_cidr: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec: {{podCIDR: {pod_cidr}, podCIDRs: [{pod_cidr}]}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {ip}}}\n    - {{type: Hostname, address: {name}}}\n"
    )
}

struct Svc<'a> {
    name: &'a str,
    cluster_ip: Ipv4Addr,
    node_port: Option<u16>,
    local: bool,
    lb: Option<Ipv4Addr>,
    external_ip: Option<Ipv4Addr>,
    ranges: &'a [&'a str],
    endpoints: &'a [(Ipv4Addr, &'a str)],
}

impl Svc<'_> {
    fn yaml(&self) -> String {
        let kind = match (self.lb, self.node_port) {
            (Some(_), _) => "LoadBalancer",
            (None, Some(_)) => "NodePort",
            (None, None) => "ClusterIP",
        };
        let ip = self.cluster_ip;
        let mut s = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: e2e}}\nspec:\n  type: {kind}\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n",
            self.name
        );
        if kind != "ClusterIP" {
            let policy = if self.local { "Local" } else { "Cluster" };
            s.push_str(&format!("  externalTrafficPolicy: {policy}\n"));
        }
        let np = self
            .node_port
            .map(|p| format!(", nodePort: {p}"))
            .unwrap_or_default();
        s.push_str(&format!(
            "  ports:\n    - {{name: tcp, protocol: TCP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n    - {{name: udp, protocol: UDP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n"
        ));
        if let Some(ip) = self.external_ip {
            s.push_str(&format!("  externalIPs: [{ip}]\n"));
        }
        if !self.ranges.is_empty() {
            s.push_str(&format!(
                "  loadBalancerSourceRanges: [{}]\n",
                self.ranges.join(", ")
            ));
        }
        if let Some(ip) = self.lb {
            s.push_str(&format!(
                "status:\n  loadBalancer:\n    ingress: [{{ip: {ip}}}]\n"
            ));
        }
        s
    }

    fn slice_yaml(&self) -> String {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {0}-1\n  namespace: e2e\n  labels: {{kubernetes.io/service-name: {0}}}\naddressType: IPv4\nports:\n  - {{name: tcp, protocol: TCP, port: {BACKEND_PORT}}}\n  - {{name: udp, protocol: UDP, port: {BACKEND_PORT}}}\n",
            self.name
        );
        if self.endpoints.is_empty() {
            s.push_str("endpoints: []\n");
        } else {
            s.push_str("endpoints:\n");
        }
        for (ip, node) in self.endpoints {
            s.push_str(&format!(
                "  - addresses: [{ip}]\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
            ));
        }
        s
    }
}

const CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: NodeCIDR\n";

/// Writes the cluster's Nodes, Services and EndpointSlices into `dir`.
fn write_manifests(dir: &Path) {
    let write = |file: &str, text: String| fs::write(dir.join(file), text).unwrap();
    write(
        "nodes.yaml",
        format!(
            "{}---\n{}",
            node_yaml("node-a", NODE_A, "198.18.1.0/24"),
            node_yaml("node-b", NODE_B, "198.18.2.0/24")
        ),
    );
    let on_b: &[(Ipv4Addr, &str)] = &[(WEB_B, "node-b")];
    let trio: Vec<(Ipv4Addr, &str)> = vec![
        (TRIO[0], "node-a"),
        (TRIO[1], "node-b"),
        (TRIO[2], "node-b"),
    ];
    let base = Svc {
        name: "",
        cluster_ip: Ipv4Addr::UNSPECIFIED,
        node_port: None,
        local: false,
        lb: None,
        external_ip: None,
        ranges: &[],
        endpoints: &[],
    };
    let services = [
        Svc {
            name: "remote",
            cluster_ip: REMOTE_VIP,
            node_port: Some(REMOTE_NODEPORT),
            lb: Some(REMOTE_LB),
            external_ip: Some(REMOTE_EXTERNAL_IP),
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "local",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 11),
            node_port: Some(LOCAL_NODEPORT),
            local: true,
            lb: Some(LOCAL_LB),
            external_ip: Some(LOCAL_EXTERNAL_IP),
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "empty",
            cluster_ip: EMPTY_VIP,
            node_port: Some(EMPTY_NODEPORT),
            lb: Some(EMPTY_LB),
            external_ip: Some(EMPTY_EXTERNAL_IP),
            ..base
        },
        Svc {
            name: "ranged",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 13),
            node_port: Some(RANGED_NODEPORT),
            lb: Some(RANGED_LB),
            ranges: &["198.18.0.100/32"],
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "here",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 15),
            node_port: Some(HERE_NODEPORT),
            local: true,
            endpoints: &[(WEB_A, "node-a"), (WEB_B, "node-b")],
            ..base
        },
        Svc {
            name: "trio",
            cluster_ip: TRIO_VIP,
            endpoints: &trio,
            ..base
        },
    ];
    for svc in &services {
        write(&format!("{}-svc.yaml", svc.name), svc.yaml());
        write(&format!("{}-slice.yaml", svc.name), svc.slice_yaml());
    }
}

/// A manifests directory and a KubeProxyConfiguration for node A.
struct Offline {
    dir: tempfile::TempDir,
}

impl Offline {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_manifests(dir.path());
        fs::write(dir.path().join("config.cfg"), CONFIG).unwrap();
        Offline { dir }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("explain")
            .arg("--manifests")
            .arg(self.dir.path())
            .arg("--config")
            .arg(self.dir.path().join("config.cfg"))
            .args(["--hostname-override", "node-a"])
            .args(args)
            .output()
            .expect("running proxy-agent explain")
    }

    fn text(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "explain {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let text = self.text(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}

/// The packet flags for `proto src:40000 -> dst:dport` from `from`.
fn packet(proto: &str, src: Ipv4Addr, dst: Ipv4Addr, dport: u16, from: &str) -> Vec<String> {
    [
        "--proto",
        proto,
        "--src",
        &src.to_string(),
        "--dst",
        &dst.to_string(),
        "--dport",
        &dport.to_string(),
        "--from",
        from,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn endpoint(ip: Ipv4Addr) -> String {
    SocketAddrV4::new(ip, BACKEND_PORT).to_string()
}

fn source_of(v: &Value) -> SocketAddrV4 {
    v["source"].as_str().unwrap().parse().unwrap()
}

#[track_caller]
fn assert_forwarded(v: &Value, to: Ipv4Addr, masqueraded: bool) {
    assert_eq!(v["verdict"], "forwarded", "{v:#}");
    assert_eq!(v["endpoint"], endpoint(to).as_str(), "{v:#}");
    assert_eq!(v["masqueraded"], masqueraded, "{v:#}");
    assert_eq!(v["flow"], "new", "{v:#}");
}

#[test]
fn cluster_ip_from_a_local_pod_is_forwarded_with_its_own_source() {
    let o = Offline::new();
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 80, "pod")));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["source"], "198.18.1.11:40000");
    assert_eq!(v["mode"], "offline");
    assert_eq!(v["frontend"]["kind"], "ClusterIP");
    assert_eq!(v["frontend"]["service"], "e2e/remote:tcp/TCP");
    assert_eq!(v["frontend"]["endpoints"], 1);
    assert_eq!(
        v["exit"], "fib_redirect",
        "the FIB routes the remote pod via the node's default route"
    );
    assert_eq!(v["steps"][0]["program"], "tc_from_pod");
    assert_eq!(v["steps"][0]["action"], "TC_ACT_REDIRECT");
    assert_eq!(v["counters"]["new_flow"], 1);

    let text = o.text(&refs(&packet("udp", POD_A, REMOTE_VIP, 80, "pod")));
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        "forwarded to endpoint 198.18.2.10:8080, source kept (198.18.1.11:40000)"
    );
    assert!(text.contains("frontend   ClusterIP of e2e/remote:udp/UDP, internalTrafficPolicy Cluster, 1 endpoint\n"), "{text}");
}

#[test]
fn node_port_lb_ip_and_external_ip_from_outside_are_masqueraded_to_the_node() {
    let o = Offline::new();
    for (dst, port, kind) in [
        (NODE_A, REMOTE_NODEPORT, "NodePort"),
        (REMOTE_LB, 80, "LoadBalancer"),
        (REMOTE_EXTERNAL_IP, 80, "ExternalIP"),
    ] {
        for proto in ["tcp", "udp"] {
            let v = o.json(&refs(&packet(proto, CLIENT, dst, port, "outside")));
            assert_forwarded(&v, WEB_B, true);
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["frontend"]["policy_field"], "externalTrafficPolicy");
            assert_eq!(v["frontend"]["policy"], "Cluster");
            let source = source_of(&v);
            assert_eq!(
                *source.ip(),
                NODE_A,
                "eTP Cluster masquerades to the node: {v:#}"
            );
            assert!((61000..=65535).contains(&source.port()), "{v:#}");
            // One-armed node: the endpoint is behind the arrival interface, so XDP finishes the job.
            assert_eq!(v["steps"].as_array().unwrap().len(), 1, "{v:#}");
            assert_eq!(v["steps"][0]["program"], "xdp_from_netdev");
            assert_eq!(v["steps"][0]["action"], "XDP_TX");
            assert_eq!(v["exit"], "xdp_tx");
            assert_eq!(v["counters"]["masqueraded"], 1);
        }
    }
    let text = o.text(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        REMOTE_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with("forwarded to endpoint 198.18.2.10:8080, masqueraded to 198.18.0.1:"),
        "{text}"
    );
    assert!(
        text.contains("  programs   xdp_from_netdev XDP_TX\n"),
        "{text}"
    );
}

#[test]
fn external_traffic_policy_local_drops_outside_traffic_but_local_pods_short_circuit() {
    let o = Offline::new();
    for (dst, port) in [
        (NODE_A, LOCAL_NODEPORT),
        (LOCAL_LB, 80),
        (LOCAL_EXTERNAL_IP, 80),
    ] {
        let v = o.json(&refs(&packet("tcp", CLIENT, dst, port, "outside")));
        assert_eq!(v["verdict"], "dropped", "{v:#}");
        assert_eq!(v["reason"], "drop_no_local_endpoints");
        assert_eq!(v["frontend"]["policy"], "Local");
        assert_eq!(v["frontend"]["endpoints"], 0);
        assert_eq!(v["steps"][0]["action"], "XDP_DROP");
        assert_eq!(v["endpoint"], Value::Null);
    }
    let text = o.text(&refs(&packet(
        "udp",
        CLIENT,
        NODE_A,
        LOCAL_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with("dropped: drop_no_local_endpoints (the traffic policy is Local and this node has no ready endpoint of the service)\n"),
        "{text}"
    );

    // Pods of this node bypass eTP Local and keep their address.
    let v = o.json(&refs(&packet("tcp", POD_A, NODE_A, LOCAL_NODEPORT, "pod")));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["source"], "198.18.1.11:40000");
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_for_a_local_endpoint() {
    let o = Offline::new();
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        HERE_NODEPORT,
        "outside",
    )));
    assert_forwarded(&v, WEB_A, false);
    assert_eq!(v["source"], "198.18.0.100:40000");
    assert_eq!(v["frontend"]["endpoints"], 1, "one endpoint on this node");
    // The endpoint is behind the pod interface: XDP leaves it to TC.
    assert_eq!(v["steps"][0]["action"], "XDP_PASS");
    assert_eq!(v["steps"][1]["program"], "tc_from_netdev");
    assert_eq!(v["steps"][1]["action"], "TC_ACT_REDIRECT");
}

#[test]
fn load_balancer_source_ranges_drop_other_sources_on_lb_ips_only() {
    let o = Offline::new();
    let allowed = o.json(&refs(&packet("tcp", CLIENT, RANGED_LB, 80, "outside")));
    assert_forwarded(&allowed, WEB_B, true);
    assert_eq!(allowed["frontend"]["source_ranges"], true);

    let denied = o.json(&refs(&packet("tcp", DENIED, RANGED_LB, 80, "outside")));
    assert_eq!(denied["verdict"], "dropped", "{denied:#}");
    assert_eq!(denied["reason"], "drop_source_range");
    assert_eq!(
        denied["explanation"],
        "the source is outside the service's loadBalancerSourceRanges"
    );

    let node_port = o.json(&refs(&packet(
        "tcp",
        DENIED,
        NODE_A,
        RANGED_NODEPORT,
        "outside",
    )));
    assert_forwarded(&node_port, WEB_B, true);
}

#[test]
fn services_without_endpoints_are_rejected_for_every_frontend_kind() {
    let o = Offline::new();
    let cases = [
        (POD_A, EMPTY_VIP, 80, "pod", "ClusterIP"),
        (CLIENT, NODE_A, EMPTY_NODEPORT, "outside", "NodePort"),
        (CLIENT, EMPTY_LB, 80, "outside", "LoadBalancer"),
        (CLIENT, EMPTY_EXTERNAL_IP, 80, "outside", "ExternalIP"),
    ];
    for (src, dst, port, from, kind) in cases {
        for (proto, reply) in [("tcp", "tcp_reset"), ("udp", "icmp_port_unreachable")] {
            let v = o.json(&refs(&packet(proto, src, dst, port, from)));
            assert_eq!(v["verdict"], "rejected", "{proto} {dst}:{port}: {v:#}");
            assert_eq!(v["reject"], reply);
            assert_eq!(v["reason"], "reject_no_endpoints");
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["frontend"]["endpoints"], 0);
            let last = v["steps"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(last["action"], "TC_ACT_REDIRECT", "sent back out: {v:#}");
        }
    }
    let text = o.text(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        EMPTY_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with(
            "rejected with a TCP RST: reject_no_endpoints (the service has no endpoints)\n"
        ),
        "{text}"
    );
    let text = o.text(&refs(&packet("udp", POD_A, EMPTY_VIP, 80, "pod")));
    assert!(
        text.starts_with("rejected with an ICMP port unreachable: "),
        "{text}"
    );
}

#[test]
fn an_unused_port_of_a_cluster_ip_is_rejected() {
    let o = Offline::new();
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 81, "pod")));
    assert_eq!(v["verdict"], "rejected", "{v:#}");
    assert_eq!(v["reject"], "tcp_reset");
    assert_eq!(v["reason"], "reject_unknown_port");
    assert_eq!(v["frontend"], Value::Null);
}

#[test]
fn traffic_to_no_service_passes_untouched() {
    let o = Offline::new();
    for (src, dst, port, from) in [
        (POD_A, WEB_B, 8080, "pod"),
        (CLIENT, NODE_A, 22, "outside"),
        (CLIENT, Ipv4Addr::new(198, 18, 9, 9), 80, "outside"),
    ] {
        let v = o.json(&refs(&packet("tcp", src, dst, port, from)));
        assert_eq!(v["verdict"], "passed", "{dst}:{port}: {v:#}");
        assert_eq!(v["frontend"], Value::Null);
        assert_eq!(v["endpoint"], Value::Null);
        let last = v["steps"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["action"], "TC_ACT_OK");
    }
    let text = o.text(&refs(&packet("udp", POD_A, WEB_B, 8080, "pod")));
    assert!(
        text.starts_with("passed through untouched: not service traffic\n"),
        "{text}"
    );
}

#[test]
fn three_hundred_flows_reach_all_three_endpoints() {
    let o = Offline::new();
    let mut args = packet("tcp", POD_A, TRIO_VIP, 80, "pod");
    args.extend(["--flows".into(), "300".into()]);
    let v = o.json(&refs(&args));
    assert_eq!(v["flows"], 300);
    assert_eq!(v["verdicts"]["forwarded"], 300, "{v:#}");
    assert_eq!(v["verdicts"]["dropped"], 0);
    assert_eq!(v["masqueraded"], 0);
    let endpoints = v["endpoints"].as_array().unwrap();
    let reached: Vec<&str> = endpoints
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    let want: Vec<String> = TRIO.iter().map(|ip| endpoint(*ip)).collect();
    assert_eq!(reached, want, "sorted by address");
    for e in endpoints {
        let n = e["flows"].as_u64().unwrap();
        assert!(n >= 50, "a fair share for each: {v:#}");
    }

    let text = o.text(&refs(&args));
    assert!(
        text.starts_with("300 new flows: 300 forwarded to 3 endpoints\n"),
        "{text}"
    );
    for ep in &want {
        assert!(text.contains(&format!("  endpoint   {ep}")), "{text}");
    }
}

#[test]
fn flows_count_drop_reasons_too() {
    let o = Offline::new();
    let mut args = packet("udp", CLIENT, NODE_A, LOCAL_NODEPORT, "outside");
    args.extend([
        "--flows".into(),
        "20".into(),
        "--sport".into(),
        "65530".into(),
    ]);
    let v = o.json(&refs(&args));
    assert_eq!(v["verdicts"]["dropped"], 20, "{v:#}");
    assert_eq!(v["reasons"]["drop_no_local_endpoints"], 20);
    assert_eq!(v["endpoints"], Value::Array(vec![]));
}

#[test]
fn local_addresses_decide_where_node_ports_are_served() {
    let o = Offline::new();
    let extra = Ipv4Addr::new(198, 18, 0, 5);
    // By default the Node object's addresses: 198.18.0.5 is not the node's.
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        extra,
        REMOTE_NODEPORT,
        "outside",
    )));
    assert_eq!(v["verdict"], "passed", "{v:#}");

    let mut args = vec![
        "--local-address".to_string(),
        NODE_A.to_string(),
        "--local-address".into(),
        extra.to_string(),
    ];
    args.extend(packet("tcp", CLIENT, extra, REMOTE_NODEPORT, "outside"));
    let v = o.json(&refs(&args));
    assert_forwarded(&v, WEB_B, true);
    assert_eq!(v["frontend"]["kind"], "NodePort");
    assert_eq!(
        *source_of(&v).ip(),
        NODE_A,
        "the masquerade address stays the Node's InternalIP"
    );
}

#[test]
fn json_output_has_a_stable_shape() {
    let o = Offline::new();
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        REMOTE_NODEPORT,
        "outside",
    )));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = vec![
        "mode",
        "packet",
        "frontend",
        "verdict",
        "endpoint",
        "destination",
        "source",
        "masqueraded",
        "flow",
        "exit",
        "reject",
        "reason",
        "explanation",
        "steps",
        "counters",
    ];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(
        v["packet"],
        serde_json::json!({
            "protocol": "tcp",
            "source": "198.18.0.100:40000",
            "destination": "198.18.0.1:30080",
            "from": "outside",
        })
    );
    let frontend_keys: Vec<&str> = v["frontend"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        frontend_keys.len(),
        6,
        "kind, service, policy_field, policy, endpoints, source_ranges: {frontend_keys:?}"
    );
}

#[track_caller]
fn assert_one_line_error(out: &Output, starts: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(&format!("error: {starts}")),
        "expected `error: {starts}...`, got {stderr}"
    );
}

fn explain_raw(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("explain")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_input_is_one_line_naming_the_flag() {
    let o = Offline::new();
    let good = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    let with = |extra: &[&'static str]| {
        let mut a = refs(&good);
        a.extend(extra);
        a
    };
    assert_one_line_error(&o.run(&with(&["--dport", "x"])), "--dport: given twice");
    let mut a = refs(&good);
    a[7] = "70000";
    assert_one_line_error(&o.run(&a), "--dport: \"70000\" is not a port");
    let mut a = refs(&good);
    a[3] = "198.18.0";
    assert_one_line_error(&o.run(&a), "--src: \"198.18.0\" is not an IPv4 address");
    assert_one_line_error(&o.run(&with(&["--flows", "0"])), "--flows:");
    assert_one_line_error(&o.run(&with(&["--output", "yaml"])), "--output:");
    assert_one_line_error(&o.run(&with(&["--bogus"])), "--bogus: unknown flag");
    assert_one_line_error(
        &explain_raw(&refs(&good)),
        "--manifests: required (or --online",
    );
    assert_one_line_error(
        &explain_raw(&[&["--manifests", "/nonexistent/dir"], &refs(&good)[..]].concat()),
        "--manifests: /nonexistent/dir",
    );
    // No Node object to take addresses from.
    assert_one_line_error(
        &o.run(&[&["--hostname-override", "node-z"], &refs(&good)[..]].concat()),
        "--hostname-override: given twice",
    );
    let out = Command::new(BIN)
        .arg("explain")
        .arg("--manifests")
        .arg(o.dir.path())
        .args(["--hostname-override", "node-z"])
        .args(refs(&good))
        .output()
        .unwrap();
    assert_one_line_error(&out, "--local-address: required");
    // A configuration the agent would refuse.
    let bad_config = o.dir.path().join("bad.cfg");
    fs::write(&bad_config, CONFIG.replace("NodeCIDR", "Sideways")).unwrap();
    let out = Command::new(BIN)
        .arg("explain")
        .arg("--manifests")
        .arg(o.dir.path())
        .arg("--config")
        .arg(&bad_config)
        .args(refs(&good))
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "--config: failed validate: detectLocalMode: Unsupported value: \"Sideways\"",
    );
    assert_one_line_error(
        &explain_raw(&[&["--online", "--pin-dir", "/nonexistent"], &refs(&good)[..]].concat()),
        "--pin-dir: /nonexistent holds no pinned maps",
    );

    let offline_flag_online = [
        &["--online", "--local-address", "192.0.2.1"],
        &refs(&good)[..],
    ];
    assert_one_line_error(
        &explain_raw(&offline_flag_online.concat()),
        "--local-address: not used with --online",
    );

    // Help wins, even over a mistake before it.
    for args in [&["--help"][..], &["--src", "x", "--help"], &["-h"]] {
        let help = explain_raw(args);
        assert!(help.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("proxy-agent explain --online"),
            "{args:?}"
        );
    }
}

#[test]
fn kube_proxy_flags_still_parse_flat_next_to_the_subcommand() {
    // `explain` is only a subcommand in first position; the agent's own
    // parsing is untouched (an unknown flag is still kube-proxy's error).
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let out = Command::new(BIN)
        .args(["--hostname-override", "explain", "--bogus-flag"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("proxy-agent explain"),
        "not taken for the subcommand"
    );
}

// ----- online -----

/// A BPF filesystem mounted on a temporary directory; unmounted on drop.
struct Bpffs {
    dir: tempfile::TempDir,
}

impl Bpffs {
    fn mount() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount -t bpf");
        Bpffs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The agent binary in `ns`, pinning under `root` and removing its pins on a clean exit.
fn pinning_agent(ns: &str, manifests: &Path, log: PathBuf, root: &Path) -> Agent {
    Agent::start_as(
        ns,
        "node-a",
        manifests,
        log,
        &[
            "--detect-local-mode",
            "NodeCIDR",
            "--ebpf-pin-root",
            root.to_str().unwrap(),
            "--ebpf-detach-on-exit",
        ],
    )
}

/// Where an agent pinning under `root` pins its maps.
fn maps_dir(root: &Path) -> PathBuf {
    root.join(format!("v{}/maps", proxy_common::ABI_VERSION))
}

fn online(ns: &str, pin_dir: Option<&Path>, env_dir: Option<&Path>, args: &[String]) -> Output {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, BIN, "explain", "--online"]);
    if let Some(dir) = pin_dir {
        cmd.arg("--pin-dir").arg(dir);
    }
    if let Some(dir) = env_dir {
        cmd.env("KUBE_EBPF_PROXY_PIN_DIR", dir);
    }
    cmd.args(args).args(["--output", "json"]).output().unwrap()
}

fn online_json(ns: &str, pin_dir: &Path, args: &[String]) -> Value {
    let out = online(ns, Some(pin_dir), None, args);
    assert!(
        out.status.success(),
        "explain --online failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The verdict once the agent has pinned and programmed its maps.
fn once_forwarded(ns: &str, pin_dir: &Path, args: &[String]) -> Option<Value> {
    let out = online(ns, Some(pin_dir), None, args);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    (out.status.success() && v["verdict"] == "forwarded").then_some(v)
}

/// Entries of a pinned conntrack map, read from this process.
fn conntrack_entries(pin_dir: &Path) -> usize {
    let data = aya::maps::MapData::from_pin(pin_dir.join("CONNTRACK")).unwrap();
    let map: aya::maps::HashMap<_, proxy_common::CtKey, proxy_common::CtValue> =
        aya::maps::Map::from_map_data(data)
            .unwrap()
            .try_into()
            .unwrap();
    map.keys().filter_map(Result::ok).count()
}

#[test]
fn online_explain_answers_from_the_running_agents_pinned_maps() {
    use testbed::cluster::{Cluster, NodeId};

    let mut cluster = Cluster::new().unwrap();
    assert_eq!(cluster.node(NodeId::A).ip, NODE_A);
    let web_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
    let client_a = cluster.add_pod(NodeId::A, "client-a").unwrap();
    let web_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
    assert_eq!((web_a.ip, client_a.ip, web_b.ip), (WEB_A, POD_A, WEB_B));
    let ns = cluster.node(NodeId::A).ns.clone();

    let manifests = tempfile::tempdir().unwrap();
    write_manifests(manifests.path());
    let bpffs = Bpffs::mount();
    let root = bpffs.path().join("kube-ebpf-proxy");
    let pin_dir = maps_dir(&root);
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("agent.log"),
        &root,
    );

    // The agent pins at start-up and programs the services within a second.
    let nodeport = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    // Masquerading needs the node's address, known once the Node object is read.
    let v = wait_for(
        Duration::from_secs(20),
        "the agent's maps to serve the NodePort, masqueraded",
        || once_forwarded(&ns, &pin_dir, &nodeport).filter(|v| v["masqueraded"] == true),
    );
    let mut pins: Vec<String> = fs::read_dir(&pin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pins.sort();
    for map in [
        "BACKENDS",
        "CONFIG",
        "CONNTRACK",
        "IFACES",
        "LOCAL_POD_CIDRS",
        "SERVICES",
        "SOURCE_RANGES",
        "STATS",
    ] {
        assert!(pins.iter().any(|p| p == map), "{map} pinned: {pins:?}");
    }
    assert!(
        agent.log_text().contains("maps pinned"),
        "{}",
        agent.log_text()
    );

    assert_eq!(v["mode"], "online");
    assert_forwarded(&v, WEB_B, true);
    assert_eq!(*source_of(&v).ip(), NODE_A);
    assert_eq!(v["frontend"]["kind"], "NodePort");
    assert_eq!(v["frontend"]["service"], Value::Null, "no model online");
    assert_eq!(
        v["steps"][0]["program"], "xdp_from_netdev",
        "the agent attached XDP to eth0 (auto mode)"
    );

    let ct_before = conntrack_entries(&pin_dir);
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("tcp", CLIENT, NODE_A, LOCAL_NODEPORT, "outside"),
    );
    assert_eq!(v["verdict"], "dropped", "{v:#}");
    assert_eq!(v["reason"], "drop_no_local_endpoints");
    let v = online_json(&ns, &pin_dir, &packet("tcp", POD_A, REMOTE_VIP, 80, "pod"));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["steps"][0]["program"], "tc_from_pod");
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("udp", CLIENT, EMPTY_LB, 80, "outside"),
    );
    assert_eq!(v["verdict"], "rejected", "{v:#}");
    assert_eq!(v["reject"], "icmp_port_unreachable");
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("tcp", DENIED, RANGED_LB, 80, "outside"),
    );
    assert_eq!(v["reason"], "drop_source_range", "{v:#}");
    let mut flows = packet("tcp", POD_A, TRIO_VIP, 80, "pod");
    flows.extend(["--flows".into(), "300".into()]);
    let v = online_json(&ns, &pin_dir, &flows);
    assert_eq!(v["verdicts"]["forwarded"], 300, "{v:#}");
    assert_eq!(v["endpoints"].as_array().unwrap().len(), 3, "{v:#}");
    assert_eq!(
        conntrack_entries(&pin_dir),
        ct_before,
        "explain never writes the live conntrack"
    );

    // The environment variable names the directory as well as --pin-dir.
    let out = online(&ns, None, Some(&pin_dir), &nodeport);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!pin_dir.exists(), "pins removed on a clean exit");
    let out = online(&ns, Some(&pin_dir), None, &nodeport);
    assert_one_line_error(&out, "--pin-dir: ");
}

#[test]
fn the_agent_takes_over_a_killed_agents_pins_and_runs_without_a_bpf_filesystem() {
    use testbed::cluster::{Cluster, NodeId};

    let cluster = Cluster::new().unwrap();
    let ns = cluster.node(NodeId::A).ns.clone();
    let manifests = tempfile::tempdir().unwrap();
    write_manifests(manifests.path());

    // An agent killed outright leaves its pins behind.
    let bpffs = Bpffs::mount();
    let root = bpffs.path().join("kube-ebpf-proxy");
    let pin_dir = maps_dir(&root);
    let old = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("old.log"),
        &root,
    );
    let nodeport = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    wait_for(Duration::from_secs(20), "the first agent's maps", || {
        once_forwarded(&ns, &pin_dir, &nodeport)
    });
    drop(old); // SIGKILL
    assert!(
        pin_dir.join("SERVICES").exists(),
        "a killed agent leaves its pins"
    );

    // The next agent takes them over, and explain reads them.
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("new.log"),
        &root,
    );
    wait_for(Duration::from_secs(20), "the new agent's maps", || {
        agent
            .log_text()
            .contains("took over the pinned service maps")
            .then_some(())?;
        once_forwarded(&ns, &pin_dir, &nodeport)
    });
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!pin_dir.exists(), "--ebpf-detach-on-exit removes every pin");

    // Without a BPF filesystem at the pin root (as /sys/fs/bpf under
    // `ip netns exec`): no pins, a warning, and the agent serves anyway.
    let tmp = tempfile::tempdir().unwrap();
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("nofs.log"),
        &tmp.path().join("kube-ebpf-proxy"),
    );
    wait_for(Duration::from_secs(20), "the agent to sync", || {
        agent.log_text().contains("datapath synced").then_some(())
    });
    let log = agent.log_text();
    assert!(log.contains("running without pinned maps"), "{log}");
    assert!(log.contains("not on a BPF filesystem"), "{log}");
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!tmp.path().join("kube-ebpf-proxy").exists());
}
