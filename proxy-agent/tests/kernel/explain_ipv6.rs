//! `proxy-agent explain` with IPv6 packets, offline, against a dual-stack
//! cluster: the same vocabulary as IPv4 (verdicts, frontends, programs,
//! counters), IPv6 endpoints and sources written `[address]:port`, each
//! family served from its own EndpointSlices, and the node's own IPv6
//! connections explained through `sock_connect6`. Needs root.

use std::{
    fs,
    net::{Ipv6Addr, SocketAddr},
    path::Path,
};

use serde_json::Value;

use crate::explain_common::{CONFIG, Offline, assert_one_line_error, is_masquerade_port};

const NODE_A4: &str = "198.18.0.1";
const NODE_A: &str = "2001:db8::1";
const CLIENT: &str = "2001:db8::100";
const POD_A: &str = "2001:db8:1::11";
const POD_A4: &str = "198.18.1.11";
const WEB_B: &str = "[2001:db8:2::10]:8080";
const WEB_B4: &str = "198.18.2.10:8080";
const REMOTE_VIP: &str = "2001:db8:ffff::10";
const REMOTE_VIP4: &str = "198.19.0.10";
const REMOTE_LB: &str = "2001:db8:3::20";
const REMOTE_EXTERNAL_IP: &str = "2001:db8:3::30";
const REMOTE_NODEPORT: &str = "30080";
const EMPTY_VIP: &str = "2001:db8:ffff::12";
const EMPTY_NODEPORT: &str = "30082";
const TRIO_VIP: &str = "2001:db8:ffff::20";

fn node(name: &str, n: u8) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec:\n  podCIDR: 198.18.{n}.0/24\n  podCIDRs: [198.18.{n}.0/24, '2001:db8:{n}::/64']\nstatus:\n  addresses:\n    - {{type: InternalIP, address: 198.18.0.{n}}}\n    - {{type: InternalIP, address: '2001:db8::{n}'}}\n    - {{type: Hostname, address: {name}}}\n"
    )
}

/// A Service of `families` (the first is primary) with TCP and UDP on port
/// 80 (node port `node_port` when given), and `extra` spec/status lines.
fn service(name: &str, cluster_ips: &[&str], node_port: Option<&str>, extra: &str) -> String {
    let families: Vec<&str> = cluster_ips
        .iter()
        .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
        .collect();
    let policy = if families.len() == 2 {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    let (kind, np) = match node_port {
        Some(p) => ("NodePort", format!(", nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    let quoted: Vec<String> = cluster_ips.iter().map(|ip| format!("'{ip}'")).collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  type: {kind}\n  ipFamilyPolicy: {policy}\n  ipFamilies: [{}]\n  clusterIP: {}\n  clusterIPs: [{}]\n  ports:\n    - {{name: tcp, protocol: TCP, port: 80, targetPort: 8080{np}}}\n    - {{name: udp, protocol: UDP, port: 80, targetPort: 8080{np}}}\n{extra}",
        families.join(", "),
        quoted[0],
        quoted.join(", ")
    )
}

/// An EndpointSlice of `family` for `service` with ready `endpoints` (address, node).
fn slice(service: &str, family: &str, endpoints: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{}\n  namespace: e2e\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n  - {{name: tcp, protocol: TCP, port: 8080}}\n  - {{name: udp, protocol: UDP, port: 8080}}\n",
        family.to_lowercase()
    );
    if endpoints.is_empty() {
        s.push_str("endpoints: []\n");
    } else {
        s.push_str("endpoints:\n");
    }
    for (ip, node) in endpoints {
        s.push_str(&format!(
            "  - addresses: ['{ip}']\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
        ));
    }
    s
}

/// Dual-stack node A (198.18.0.1, 2001:db8::1) and node B; `remote`
/// (dual-stack NodePort with an IPv6 LB IP and external IP, one endpoint
/// per family on node B), `empty` (dual-stack, no endpoints) and `trio`
/// (IPv6 only, three endpoints).
fn dual_stack() -> Offline {
    Offline::with(write_dual_stack_manifests, CONFIG)
}

fn write_dual_stack_manifests(dir: &Path) {
    let write = |file: &str, text: String| fs::write(dir.join(file), text).unwrap();
    write(
        "nodes.yaml",
        format!("{}---\n{}", node("node-a", 1), node("node-b", 2)),
    );
    write(
        "remote.yaml",
        [
            service(
                "remote",
                &[REMOTE_VIP4, REMOTE_VIP],
                Some(REMOTE_NODEPORT),
                &format!(
                    "  externalIPs: ['{REMOTE_EXTERNAL_IP}']\nstatus:\n  loadBalancer:\n    ingress: [{{ip: '{REMOTE_LB}'}}]\n"
                ),
            ),
            slice("remote", "IPv4", &[("198.18.2.10", "node-b")]),
            slice("remote", "IPv6", &[("2001:db8:2::10", "node-b")]),
        ]
        .join("---\n"),
    );
    write(
        "empty.yaml",
        [
            service(
                "empty",
                &["198.19.0.12", EMPTY_VIP],
                Some(EMPTY_NODEPORT),
                "",
            ),
            slice("empty", "IPv4", &[]),
            slice("empty", "IPv6", &[]),
        ]
        .join("---\n"),
    );
    let trio = [
        ("2001:db8:1::21", "node-a"),
        ("2001:db8:2::21", "node-b"),
        ("2001:db8:2::22", "node-b"),
    ];
    write(
        "trio.yaml",
        [
            service("trio", &[TRIO_VIP], None, ""),
            slice("trio", "IPv6", &trio),
        ]
        .join("---\n"),
    );
}

/// `proto src:40000 -> dst:dport` from `from` through `o`, as JSON, with `more` flags.
fn probe(o: &Offline, [proto, src, dst, dport, from]: [&str; 5], more: &[&str]) -> Value {
    let mut args = vec![
        "--proto", proto, "--src", src, "--dst", dst, "--dport", dport, "--from", from,
    ];
    args.extend(more);
    o.json(&args)
}

#[track_caller]
fn assert_forwarded(v: &Value, to: &str, masqueraded: bool) {
    assert_eq!(v["verdict"], "forwarded", "{v:#}");
    assert_eq!(v["endpoint"], to, "{v:#}");
    assert_eq!(v["masqueraded"], masqueraded, "{v:#}");
    assert_eq!(v["flow"], "new", "{v:#}");
}

#[test]
fn ipv6_cluster_ip_from_a_pod_reaches_the_ipv6_endpoint_and_ipv4_the_ipv4_one() {
    let o = dual_stack();
    for proto in ["tcp", "udp"] {
        let v = probe(&o, [proto, POD_A, REMOTE_VIP, "80", "pod"], &[]);
        assert_forwarded(&v, WEB_B, false);
        assert_eq!(v["source"], "[2001:db8:1::11]:40000");
        assert_eq!(v["packet"]["destination"], "[2001:db8:ffff::10]:80");
        assert_eq!(v["destination"], WEB_B, "where it leaves for");
        assert_eq!(v["frontend"]["kind"], "ClusterIP");
        assert_eq!(
            v["frontend"]["service"],
            format!("e2e/remote:{proto}/{}", proto.to_uppercase())
        );
        assert_eq!(v["frontend"]["endpoints"], 1, "the IPv6 slice's only");
        assert_eq!(v["steps"][0]["program"], "tc_from_pod");
        assert_eq!(
            v["exit"], "fib_redirect",
            "routed by the IPv6 default route"
        );
        assert_eq!(v["counters"]["new_flow"], 1);
    }
    // The same service's IPv4 cluster IP: the IPv4 endpoint.
    let v = probe(&o, ["tcp", POD_A4, REMOTE_VIP4, "80", "pod"], &[]);
    assert_forwarded(&v, WEB_B4, false);

    let text = o.text(&[
        "--proto", "tcp", "--src", POD_A, "--dst", REMOTE_VIP, "--dport", "80", "--from", "pod",
    ]);
    assert_eq!(
        text.lines().next().unwrap(),
        "forwarded to endpoint [2001:db8:2::10]:8080, source kept ([2001:db8:1::11]:40000)"
    );
}

#[test]
fn ipv6_node_port_lb_ip_and_external_ip_from_outside_are_masqueraded_to_the_nodes_ipv6() {
    let o = dual_stack();
    for (dst, port, kind) in [
        (NODE_A, REMOTE_NODEPORT, "NodePort"),
        (REMOTE_LB, "80", "LoadBalancer"),
        (REMOTE_EXTERNAL_IP, "80", "ExternalIP"),
    ] {
        for proto in ["tcp", "udp"] {
            let v = probe(&o, [proto, CLIENT, dst, port, "outside"], &[]);
            assert_forwarded(&v, WEB_B, true);
            assert_eq!(v["frontend"]["kind"], kind, "{v:#}");
            let source: SocketAddr = v["source"].as_str().unwrap().parse().unwrap();
            assert_eq!(
                source.ip(),
                NODE_A.parse::<Ipv6Addr>().unwrap(),
                "eTP Cluster masquerades to the node's IPv6: {v:#}"
            );
            assert!(is_masquerade_port(source.port()), "{v:#}");
            assert_eq!(v["steps"][0]["program"], "xdp_from_netdev");
            assert_eq!(v["steps"][0]["action"], "XDP_TX", "{v:#}");
            assert_eq!(v["counters"]["masqueraded"], 1);
        }
    }
    // The node's IPv4 address serves the same node port in IPv4.
    let v = probe(
        &o,
        ["tcp", "198.18.0.100", NODE_A4, REMOTE_NODEPORT, "outside"],
        &[],
    );
    assert_forwarded(&v, WEB_B4, true);
}

#[test]
fn ipv6_without_endpoints_is_rejected_with_a_reset_or_an_icmpv6_port_unreachable() {
    let o = dual_stack();
    for (src, dst, port, from, kind) in [
        (POD_A, EMPTY_VIP, "80", "pod", "ClusterIP"),
        (CLIENT, NODE_A, EMPTY_NODEPORT, "outside", "NodePort"),
    ] {
        for (proto, reply) in [("tcp", "tcp_reset"), ("udp", "icmp_port_unreachable")] {
            let v = probe(&o, [proto, src, dst, port, from], &[]);
            assert_eq!(v["verdict"], "rejected", "{proto} {dst}:{port}: {v:#}");
            assert_eq!(v["reject"], reply, "{v:#}");
            assert_eq!(v["reason"], "reject_no_endpoints");
            assert_eq!(v["frontend"]["kind"], kind);
        }
    }
    // An unused port of an IPv6 cluster IP, as in IPv4.
    let v = probe(&o, ["tcp", POD_A, REMOTE_VIP, "81", "pod"], &[]);
    assert_eq!(v["reason"], "reject_unknown_port", "{v:#}");
    // No service at all: passed.
    let v = probe(&o, ["tcp", POD_A, "2001:db8:ffff::99", "80", "pod"], &[]);
    assert_eq!(v["verdict"], "passed", "{v:#}");
}

#[test]
fn ipv6_flows_are_spread_over_the_ipv6_endpoints() {
    let o = dual_stack();
    let v = probe(
        &o,
        ["tcp", POD_A, TRIO_VIP, "80", "pod"],
        &["--flows", "300"],
    );
    assert_eq!(v["verdicts"]["forwarded"], 300, "{v:#}");
    let endpoints: Vec<&str> = v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(
        endpoints,
        [
            "[2001:db8:1::21]:8080",
            "[2001:db8:2::21]:8080",
            "[2001:db8:2::22]:8080"
        ],
        "sorted by address: {v:#}"
    );
}

#[test]
fn the_nodes_own_ipv6_connections_are_explained_through_sock_connect6() {
    let o = dual_stack();
    for (dst, port, kind) in [
        (REMOTE_VIP, "80", "ClusterIP"),
        (NODE_A, REMOTE_NODEPORT, "NodePort"),
        (REMOTE_LB, "80", "LoadBalancer"),
    ] {
        for proto in ["tcp", "udp"] {
            let v = probe(&o, [proto, NODE_A, dst, port, "host"], &[]);
            assert_forwarded(&v, WEB_B, false);
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["exit"], "socket", "{v:#}");
            assert_eq!(v["steps"][0]["program"], "sock_connect6");
            assert_eq!(v["steps"][0]["action"], "SOCK_ALLOW");
        }
    }
    let v = probe(&o, ["tcp", NODE_A, EMPTY_VIP, "80", "host"], &[]);
    assert_eq!(v["reject"], "connection_refused", "{v:#}");
    assert_eq!(v["steps"][0]["action"], "SOCK_REFUSE");
}

#[test]
fn a_packet_of_two_families_is_refused_naming_the_destination() {
    let o = dual_stack();
    let out = o.run(&[
        "--proto", "tcp", "--src", POD_A4, "--dst", REMOTE_VIP, "--dport", "80", "--from", "pod",
    ]);
    assert_one_line_error(
        &out,
        "--dst: 2001:db8:ffff::10 is IPv6 but --src 198.18.1.11 is IPv4 (a packet has one family)",
    );
}
