//! End to end in a network-namespace testbed: the real agent binary programs
//! the real datapath from manifest files, and real TCP/UDP connections from
//! a client pod to a ClusterIP are balanced across three backend pods.
//! Runs for both pod wirings (routed veths and a bridge). Needs root.

use std::{collections::BTreeMap, fs, time::Duration};

use crate::support::{Agent, sock, wait_for};
use testbed::{Cni, Testbed, netns, servers};

const VIP: &str = "198.19.0.10:80";
const BACKENDS: [&str; 3] = ["whoami-0", "whoami-1", "whoami-2"];
const TIMEOUT: Duration = Duration::from_secs(2);

fn service_yaml() -> &'static str {
    r#"
apiVersion: v1
kind: Service
metadata: {name: whoami, namespace: demo}
spec:
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: 8080}
    - {name: dns, protocol: UDP, port: 80, targetPort: 8080}
"#
}

fn slice_yaml(pod_ips: &[String]) -> String {
    let mut s = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: whoami-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: whoami}\naddressType: IPv4\nports:\n  - {name: http, protocol: TCP, port: 8080}\n  - {name: dns, protocol: UDP, port: 8080}\nendpoints:\n",
    );
    for ip in pod_ips {
        s.push_str(&format!(
            "  - addresses: [{ip}]\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
        ));
    }
    s
}

/// `count` TCP connections and `count` UDP requests from `client_ns` to the VIP:
/// identities reached, asserting every UDP reply came from the VIP.
fn exercise(client_ns: &str, count: usize) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    netns::run_in(client_ns, move || {
        let mut tcp = BTreeMap::new();
        let mut udp = BTreeMap::new();
        for _ in 0..count {
            let id = servers::tcp_identity(sock(VIP), TIMEOUT).expect("TCP to the ClusterIP");
            *tcp.entry(id).or_insert(0) += 1;
            let (id, from) =
                servers::udp_identity(sock(VIP), TIMEOUT).expect("UDP to the ClusterIP");
            assert_eq!(from, sock(VIP), "UDP reply must come from the VIP:port");
            *udp.entry(id).or_insert(0) += 1;
        }
        (tcp, udp)
    })
    .unwrap()
}

/// Packets the node's ends of the backends' veths have sent (their transmit counters).
fn backend_veths_sent(tb: &Testbed) -> u64 {
    BACKENDS
        .iter()
        .map(|b| {
            let out = std::process::Command::new("ip")
                .args(["-n", &tb.node_ns, "-s", "-j", "link", "show", "dev"])
                .arg(&tb.pod(b).host_veth)
                .output()
                .expect("ip link show");
            assert!(out.status.success(), "ip link show: {out:?}");
            let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            links[0]["stats64"]["tx"]["packets"]
                .as_u64()
                .expect("transmit counter")
        })
        .sum()
}

fn clusterip_end_to_end(cni: Cni) {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(cni, &pods).unwrap();
    let _servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| servers::IdentityServer::start(&tb.pod(name).ns, name, 8080).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = BACKENDS.iter().map(|b| tb.pod(b).ip.to_string()).collect();
    fs::write(dir.path().join("service.yaml"), service_yaml()).unwrap();
    fs::write(dir.path().join("slice.yaml"), slice_yaml(&ips)).unwrap();
    let mut agent = Agent::start(&tb.node_ns, dir.path(), dir.path().join("agent.log"));

    let client = tb.pod("client").ns.clone();
    let c = client.clone();
    wait_for(Duration::from_secs(20), "the ClusterIP to answer", || {
        let c = c.clone();
        netns::run_in(&c, || {
            servers::tcp_identity(sock(VIP), Duration::from_millis(300)).ok()
        })
        .unwrap()
    });

    // 300 connections of each protocol reach all three backends, each at least 1/6.
    let sent_before = backend_veths_sent(&tb);
    let (tcp, udp) = exercise(&client, 300);
    // Routed pods: what the datapath forwards to a backend goes straight to
    // the pod's ingress (bpf_redirect_peer), never out of the node's end of
    // its veth, which sends only what the stack itself does (ARP). Bridged
    // pods are reached through the bridge.
    let sent = backend_veths_sent(&tb) - sent_before;
    if cni == Cni::Routed {
        assert!(
            sent < 30,
            "{sent} packets left the backends' veths for 600 requests: not delivered to the pods' ingress"
        );
    } else {
        assert!(
            sent >= 600,
            "{sent} packets through the bridge ports for 600 requests"
        );
    }
    for (proto, hits) in [("TCP", &tcp), ("UDP", &udp)] {
        assert_eq!(hits.values().sum::<usize>(), 300);
        for b in BACKENDS {
            let n = hits.get(b).copied().unwrap_or(0);
            assert!(n >= 50, "{proto}: {b} got {n} of 300 ({hits:?})");
        }
    }

    // Backend whoami-2 leaves the EndpointSlice: one second later no new connection reaches it.
    fs::write(dir.path().join("slice.yaml"), slice_yaml(&ips[..2])).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let (tcp, udp) = exercise(&client, 100);
    assert!(
        !tcp.contains_key("whoami-2") && !udp.contains_key("whoami-2"),
        "removed backend reached: {tcp:?} {udp:?}"
    );

    // Bad input is rejected with the file and field named, and the last good state stays.
    fs::write(
        dir.path().join("slice.yaml"),
        slice_yaml(&["198.18.1.999".to_string()]),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log_text();
    assert!(
        log.contains("manifests rejected"),
        "no rejection logged:\n{log}"
    );
    assert!(
        log.contains("slice.yaml") && log.contains("endpoints[0].addresses[0]"),
        "error must name file and field:\n{log}"
    );
    let (tcp, _) = exercise(&client, 30);
    assert!(
        tcp.keys().all(|k| k == "whoami-0" || k == "whoami-1"),
        "{tcp:?}"
    );

    // SIGTERM: clean exit, programs detached, the VIP no longer translated.
    let status = agent.stop();
    assert!(
        status.success(),
        "agent exit {status:?}:\n{}",
        agent.log_text()
    );
    assert!(agent.log_text().contains("programs detached"));
    let still = netns::run_in(&client, || {
        servers::tcp_identity(sock(VIP), Duration::from_millis(500)).is_ok()
    })
    .unwrap();
    assert!(
        !still,
        "the ClusterIP still answers after the agent stopped"
    );
    let attached = std::process::Command::new("ip")
        .args(["netns", "exec", &tb.node_ns, "bpftool", "net", "show"])
        .output()
        .expect("bpftool");
    let listing = String::from_utf8_lossy(&attached.stdout);
    assert!(
        attached.status.success() && !listing.contains("tc_from_pod"),
        "programs still attached:\n{listing}"
    );
}

#[test]
fn clusterip_routed_pods() {
    clusterip_end_to_end(Cni::Routed);
}

#[test]
fn clusterip_bridged_pods() {
    clusterip_end_to_end(Cni::Bridge);
}

#[test]
fn new_pod_interfaces_are_attached_while_running() {
    let mut tb = Testbed::new(Cni::Routed, &["whoami-0", "client"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("service.yaml"), service_yaml()).unwrap();
    fs::write(
        dir.path().join("slice.yaml"),
        slice_yaml(&["198.18.1.10".into()]),
    )
    .unwrap();
    let _server = servers::IdentityServer::start(&tb.pod("whoami-0").ns, "whoami-0", 8080).unwrap();
    let mut agent = Agent::start(&tb.node_ns, dir.path(), dir.path().join("agent.log"));
    let client = tb.pod("client").ns.clone();
    wait_for(Duration::from_secs(20), "the ClusterIP to answer", || {
        let c = client.clone();
        netns::run_in(&c, || {
            servers::tcp_identity(sock(VIP), Duration::from_millis(300)).ok()
        })
        .unwrap()
    });
    // The client pod goes away and a new one comes up on a fresh veth.
    tb.remove_pod("client");
    let late = tb.add_pod("late-client").unwrap().ns;
    let reached = wait_for(
        Duration::from_secs(5),
        "the new pod's veth to be attached",
        || {
            let ns = late.clone();
            netns::run_in(&ns, || {
                servers::tcp_identity(sock(VIP), Duration::from_millis(300)).ok()
            })
            .unwrap()
        },
    );
    assert_eq!(reached, "whoami-0");
    assert!(agent.stop().success());
}

/// A UDP datagram larger than the veths' MTU crosses a ClusterIP in
/// fragments, both ways, in IPv4 and IPv6: the client's 4,000 bytes reach
/// the backend whole (each later fragment follows its first to the backend),
/// and the backend's echo comes back whole from the VIP (upstream e2e
/// "should be able to handle large requests: udp").
#[test]
fn udp_datagrams_larger_than_the_mtu_cross_a_clusterip_in_fragments() {
    let tb = Testbed::new(Cni::Routed, &["whoami-0", "client"]).unwrap();
    let ips = [tb.pod("whoami-0").ip.to_string()];
    let manifests = [
        ("service.yaml", service_yaml().to_owned()),
        ("slice.yaml", slice_yaml(&ips)),
    ];
    large_udp_echoes(&tb, &manifests, sock(VIP));
}

#[test]
fn ipv6_udp_datagrams_larger_than_the_mtu_cross_a_clusterip_in_fragments() {
    let tb = Testbed::new_dual_stack(&["whoami-0", "client"]).unwrap();
    let ip6 = tb.pod("whoami-0").ip6.expect("a dual-stack pod");
    let service = r#"
apiVersion: v1
kind: Service
metadata: {name: whoami, namespace: demo}
spec:
  ipFamilies: [IPv6]
  clusterIP: "2001:db8:ffff::40"
  clusterIPs: ["2001:db8:ffff::40"]
  ports:
    - {name: dns, protocol: UDP, port: 80, targetPort: 8080}
"#;
    let slice = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: whoami-6\n  namespace: demo\n  labels: {{kubernetes.io/service-name: whoami}}\naddressType: IPv6\nports:\n  - {{name: dns, protocol: UDP, port: 8080}}\nendpoints:\n  - addresses: [\"{ip6}\"]\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
    );
    let manifests = [("service.yaml", service.to_owned()), ("slice.yaml", slice)];
    large_udp_echoes(&tb, &manifests, sock("[2001:db8:ffff::40]:80"));
}

/// With `manifests` served by the agent and an echo server (whole
/// datagrams back) on the backend pod `whoami-0`'s UDP 8080: 4,000-byte
/// datagrams from the client pod to `vip` come back whole, from `vip`.
fn large_udp_echoes(tb: &Testbed, manifests: &[(&str, String)], vip: std::net::SocketAddr) {
    let any: std::net::SocketAddr = if vip.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let server_addr = std::net::SocketAddr::new(any.ip(), 8080);
    let echo = netns::run_in(&tb.pod("whoami-0").ns, move || {
        std::net::UdpSocket::bind(server_addr)
    })
    .unwrap()
    .unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let server = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((n, peer)) = echo.recv_from(&mut buf) {
                let _ = echo.send_to(&buf[..n], peer);
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in manifests {
        fs::write(dir.path().join(name), text).unwrap();
    }
    let agent = Agent::start(&tb.node_ns, dir.path(), dir.path().join("agent.log"));

    let request: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
    let client = tb.pod("client").ns.clone();
    let exchange = |request: Vec<u8>| {
        netns::run_in(&client, move || {
            let socket = std::net::UdpSocket::bind(any).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            socket.send_to(&request, vip).unwrap();
            let mut buf = vec![0u8; 65_536];
            socket
                .recv_from(&mut buf)
                .ok()
                .map(|(n, from)| (buf[..n].to_vec(), from))
        })
        .unwrap()
    };
    // The first tries may go before the agent has programmed the service.
    let (answer, from) = wait_for(Duration::from_secs(20), "a 4,000-byte UDP echo", || {
        exchange(request.clone())
    });
    assert_eq!(from, vip, "the echo comes from the VIP");
    assert!(answer == request, "the echo is the request, whole");
    for _ in 0..20 {
        let (answer, _) = exchange(request.clone()).expect("every large datagram crosses");
        assert!(answer == request);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
    drop(agent);
}
