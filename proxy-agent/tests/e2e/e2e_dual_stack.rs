//! IPv6 and dual-stack end to end: the real agent binary programs a
//! dual-stack Service (two `clusterIPs`, a NodePort, an EndpointSlice per
//! family) from manifest files, and real TCP and UDP reach it over both
//! families at once, from a pod (ClusterIP) and from the external client
//! (NodePort on the node's IPv6 and IPv4 addresses). Addresses from
//! 198.18.0.0/15 and 2001:db8::/32. Needs root.

use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use crate::support::{Agent, wait_for};
use testbed::{NODE_EXTERNAL_IP, NODE_EXTERNAL_IP6, Testbed, netns, servers};

const VIP4: &str = "198.19.0.20";
const VIP6: &str = "2001:db8:ffff::20";
const NODE_PORT: u16 = 30_620;
const BACKENDS: [&str; 3] = ["web-0", "web-1", "web-2"];
const TIMEOUT: Duration = Duration::from_secs(2);

fn service_yaml() -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: demo}}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIP: {VIP6}
  clusterIPs: [{VIP6}, {VIP4}]
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}
    - {{name: dns, protocol: UDP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}
"#
    )
}

/// One EndpointSlice per family, as the EndpointSlice controller writes them.
fn slice_yaml(name: &str, address_type: &str, ips: &[String]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: demo\n  labels: {{kubernetes.io/service-name: web}}\naddressType: {address_type}\nports:\n  - {{name: http, protocol: TCP, port: 8080}}\n  - {{name: dns, protocol: UDP, port: 8080}}\nendpoints:\n"
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

#[test]
fn a_dual_stack_service_is_reached_over_both_families_from_pods_and_from_outside() {
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
    fs::write(dir.path().join("service.yaml"), service_yaml()).unwrap();
    fs::write(
        dir.path().join("slice4.yaml"),
        slice_yaml("web-v4", "IPv4", &v4),
    )
    .unwrap();
    fs::write(
        dir.path().join("slice6.yaml"),
        slice_yaml("web-v6", "IPv6", &v6),
    )
    .unwrap();
    let agent = Agent::start(&tb.node_ns, dir.path(), dir.path().join("agent.log"));

    let client = tb.pod("client").ns.clone();
    let client6 = tb.pod("client").ip6.unwrap();
    let vip6 = SocketAddr::new(VIP6.parse().unwrap(), 80);
    let vip4 = SocketAddr::new(VIP4.parse().unwrap(), 80);
    for target in [vip6, vip4] {
        let c = client.clone();
        wait_for(
            Duration::from_secs(20),
            &format!("{target} to answer"),
            || {
                netns::run_in(&c, move || {
                    servers::tcp_identity(target, Duration::from_millis(300)).ok()
                })
                .unwrap()
            },
        );
    }

    // From a pod, both cluster IPs, both protocols: every backend is
    // reached in each family, from the pod's own address of that family.
    for s in &servers {
        s.clear_seen();
    }
    for target in [vip6, vip4] {
        let hits = exercise(&client, target, 60);
        assert_eq!(hits.values().sum::<usize>(), 120, "{target}: {hits:?}");
        for b in BACKENDS {
            assert!(
                hits.get(b).copied().unwrap_or(0) >= 10,
                "{target}: {b} in {hits:?}"
            );
        }
    }
    for s in &servers {
        let peers: Vec<IpAddr> = s.seen.tcp.lock().unwrap().iter().map(|p| p.ip()).collect();
        assert!(
            peers.contains(&IpAddr::V6(client6))
                && peers.contains(&IpAddr::V4(tb.pod("client").ip)),
            "{}: each family's connections arrive from the client's address of that family: {peers:?}",
            s.identity
        );
        assert!(
            peers
                .iter()
                .all(|p| *p == IpAddr::V6(client6) || *p == IpAddr::V4(tb.pod("client").ip)),
            "{}: no connection crossed families: {peers:?}",
            s.identity
        );
    }

    // From outside, the NodePort on the node's IPv6 and IPv4 addresses.
    for target in [
        SocketAddr::new(IpAddr::V6(NODE_EXTERNAL_IP6), NODE_PORT),
        SocketAddr::new(IpAddr::V4(NODE_EXTERNAL_IP), NODE_PORT),
    ] {
        let ext = tb.external_ns.clone();
        wait_for(
            Duration::from_secs(10),
            &format!("{target} to answer"),
            || {
                netns::run_in(&ext, move || {
                    servers::tcp_identity(target, Duration::from_millis(300)).ok()
                })
                .unwrap()
            },
        );
        let hits = exercise(&tb.external_ns, target, 30);
        assert_eq!(hits.values().sum::<usize>(), 60, "{target}: {hits:?}");
        assert!(hits.len() >= 2, "{target}: balanced: {hits:?}");
    }
    drop(agent);
}
