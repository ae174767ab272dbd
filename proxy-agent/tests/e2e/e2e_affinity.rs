//! `sessionAffinity: ClientIP` end to end, as upstream's e2e checks it
//! (`test/e2e/network/service.go`: "should have session affinity work /
//! timeout work / be able to switch" for ClusterIP and NodePort services):
//! the real agent programs a service with three backend pods from manifest
//! files; 15 consecutive requests from one client reach one backend, from a
//! pod to the cluster IP and from the external client to the NodePort;
//! after the timeout passes without a request the client is balanced again;
//! switching the manifest to `None` spreads requests, and back to
//! `ClientIP` pins them again. Needs root.

use std::{collections::BTreeSet, fs, net::SocketAddr, path::Path, time::Duration};

use crate::support::{Agent, wait_for};
use testbed::{Cni, NODE_EXTERNAL_IP, Testbed, netns, servers};

const VIP: &str = "198.19.0.40";
const NODE_PORT: u16 = 30_640;
const BACKENDS: [&str; 3] = ["sticky-0", "sticky-1", "sticky-2"];
const TIMEOUT: Duration = Duration::from_secs(2);
/// upstream's AffinityConfirmCount.
const CONFIRM: usize = 15;

fn service_yaml(affinity: &str, timeout_seconds: u32) -> String {
    let config = if affinity == "ClientIP" {
        format!("  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout_seconds}}}}}\n")
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: sticky, namespace: demo}}\nspec:\n  type: NodePort\n  clusterIP: {VIP}\n  clusterIPs: [{VIP}]\n  sessionAffinity: {affinity}\n{config}  ports:\n    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}\n    - {{name: dns, protocol: UDP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}\n"
    )
}

fn write_service(dir: &Path, affinity: &str, timeout_seconds: u32) {
    // Written aside and renamed: the agent never reads half a file.
    let tmp = dir.join("service.yaml.tmp");
    fs::write(&tmp, service_yaml(affinity, timeout_seconds)).unwrap();
    fs::rename(tmp, dir.join("service.yaml")).unwrap();
}

/// One TCP request (or UDP, with `udp`) from `ns` to `target`: the backend's name.
fn request(ns: &str, target: SocketAddr, udp: bool) -> String {
    netns::run_in(ns, move || {
        if udp {
            servers::udp_identity(target, TIMEOUT).map(|(id, _)| id)
        } else {
            servers::tcp_identity(target, TIMEOUT)
        }
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("request to {target}: {e:#}"))
}

/// upstream's checkAffinity: the last `CONFIRM` requests all reached one backend.
fn sticks(ns: &str, target: SocketAddr, udp: bool) -> bool {
    let seen: BTreeSet<String> = (0..CONFIRM).map(|_| request(ns, target, udp)).collect();
    seen.len() == 1
}

/// Whether some of `tries` requests reach different backends.
fn spreads(ns: &str, target: SocketAddr, tries: usize) -> bool {
    let seen: BTreeSet<String> = (0..tries).map(|_| request(ns, target, false)).collect();
    seen.len() > 1
}

#[test]
fn session_affinity_holds_expires_and_switches_for_cluster_ip_and_node_port() {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(Cni::Routed, &pods).unwrap();
    let _servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| servers::IdentityServer::start(&tb.pod(name).ns, name, 8080).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    fs::write(
        manifests.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: \"{NODE_EXTERNAL_IP}\"}}\n"
        ),
    )
    .unwrap();
    let mut slice = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: sticky-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: sticky}\naddressType: IPv4\nports:\n  - {name: http, protocol: TCP, port: 8080}\n  - {name: dns, protocol: UDP, port: 8080}\nendpoints:\n",
    );
    for b in BACKENDS {
        slice.push_str(&format!(
            "  - addresses: [{}]\n    conditions: {{ready: true}}\n    nodeName: node-a\n",
            tb.pod(b).ip
        ));
    }
    fs::write(manifests.join("slice.yaml"), slice).unwrap();
    write_service(&manifests, "ClientIP", 10_800);
    let agent = Agent::start(&tb.node_ns, &manifests, dir.path().join("agent.log"));

    let pod = tb.pod("client").ns.clone();
    let outside = tb.external_ns.clone();
    let vip: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let node_port = SocketAddr::new(NODE_EXTERNAL_IP.into(), NODE_PORT);
    let answers = |ns: &str, target: SocketAddr| {
        let ns = ns.to_owned();
        move || {
            netns::run_in(&ns, move || {
                servers::tcp_identity(target, Duration::from_millis(300)).ok()
            })
            .unwrap()
        }
    };
    wait_for(
        Duration::from_secs(20),
        "the cluster IP",
        answers(&pod, vip),
    );
    wait_for(
        Duration::from_secs(20),
        "the NodePort",
        answers(&outside, node_port),
    );

    // #24, #27: affinity holds, over TCP and UDP.
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        for udp in [false, true] {
            assert!(
                sticks(ns, target, udp),
                "{target} udp={udp}: 15 requests, one backend\n{}",
                agent.log_text()
            );
        }
    }

    // #26, #29: switched off, requests spread; back on, they stick again.
    write_service(&manifests, "None", 0);
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        wait_for(Duration::from_secs(20), "affinity switched off", || {
            spreads(ns, target, 30).then_some(())
        });
    }
    write_service(&manifests, "ClientIP", 10_800);
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        wait_for(Duration::from_secs(20), "affinity switched on", || {
            sticks(ns, target, false).then_some(())
        });
    }

    // #25, #28: with a short timeout the client is balanced again once it
    // passes without a request (upstream: up to 10 tries a timeout apart).
    write_service(&manifests, "ClientIP", 1);
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        wait_for(
            Duration::from_secs(20),
            "the short timeout programmed",
            || {
                // Requests closer than the timeout keep the pin ...
                sticks(ns, target, false).then_some(())
            },
        );
        let mut seen = BTreeSet::new();
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(1_300));
            seen.insert(request(ns, target, false));
            if seen.len() > 1 {
                break;
            }
        }
        assert!(
            seen.len() > 1,
            "{target}: after the timeout the client is balanced again: {seen:?}"
        );
    }
    drop(agent);
}
