//! The datapath outlives the agent: long-lived TCP connections through a
//! ClusterIP (from a pod) and through a NodePort (from outside, masqueraded),
//! and a UDP stream, keep working on their original backends while the agent
//! is killed (`kill -9`) or stopped (SIGTERM), while no agent runs, and after
//! a new agent takes the pinned datapath over, also when it first migrates
//! maps of the previous map ABI. Needs root.

use std::{fs, path::Path, time::Duration};

use crate::{
    abi5::{conntrack_to_abi_5, services_to_abi_6},
    bpffs::BpfFs,
    support::{Agent, sock, wait_for},
};
use testbed::{
    Cni, NODE_EXTERNAL_IP, Testbed,
    echo::{Connections, EchoServer, UdpStream},
};

const VIP: &str = "198.19.0.10:80";
const NODE_PORT: u16 = 30080;
const BACKENDS: [&str; 2] = ["echo-0", "echo-1"];
const CONNECTIONS: usize = 1000;

fn manifests(dir: &Path, pod_ips: &[String]) {
    fs::write(
        dir.join("service.yaml"),
        r#"
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec:
  type: NodePort
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  ports:
    - {name: tcp, protocol: TCP, port: 80, targetPort: 7000, nodePort: 30080}
    - {name: udp, protocol: UDP, port: 80, targetPort: 7000}
"#,
    )
    .unwrap();
    let mut slice = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: echo-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: echo}\naddressType: IPv4\nports:\n  - {name: tcp, protocol: TCP, port: 7000}\n  - {name: udp, protocol: UDP, port: 7000}\nendpoints:\n",
    );
    for ip in pod_ips {
        slice.push_str(&format!(
            "  - addresses: [{ip}]\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
        ));
    }
    fs::write(dir.join("slice.yaml"), slice).unwrap();
    fs::write(
        dir.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {NODE_EXTERNAL_IP}}}\n"
        ),
    )
    .unwrap();
}

/// Makes the pinned datapath look as an agent of map ABI 5 left it: its
/// maps under `v5/`, the conntrack maps in that version's layout (the half
/// of the flow in the key) holding the flows tracked so far, and the service
/// maps in the layout it shared with ABI 6 (backend slots as entries). The
/// programs keep running on the maps they hold, exactly as an old agent's
/// would.
fn pin_as_previous_abi(pins: &BpfFs) {
    use proxy_common::{ABI_VERSION, V4, V6};

    let root = pins.dir.join("kube-ebpf-proxy");
    fs::rename(root.join(format!("v{ABI_VERSION}")), root.join("v5")).unwrap();
    let maps = root.join("v5/maps");
    let flows = conntrack_to_abi_5::<V4>(pins, &maps.join("CONNTRACK"));
    assert!(flows >= 4 * CONNECTIONS, "{flows} IPv4 flow halves tracked");
    conntrack_to_abi_5::<V6>(pins, &maps.join("CONNTRACK6"));
    services_to_abi_6::<V4>(pins, &maps, "SERVICES", "SLOTS");
    services_to_abi_6::<V6>(pins, &maps, "SERVICES6", "SLOTS6");
}

/// Runs 0-2 ask for generic XDP on the node's veth, so that its pinned link
/// is taken over across restarts; run 3 leaves the mode to `auto`, which
/// detaches it (a veth is TC's under `auto`) with the flows kept.
fn start(ns: &str, dir: &Path, pins: &BpfFs, run: u32) -> Agent {
    let root = pins.dir.join("kube-ebpf-proxy");
    let xdp = if run < 3 { "generic" } else { "auto" };
    Agent::start_as(
        ns,
        "node-a",
        dir,
        dir.join(format!("agent-{run}.log")),
        &[
            "--ebpf-pin-root",
            root.to_str().unwrap(),
            "--ebpf-xdp-mode",
            xdp,
        ],
    )
}

#[test]
fn established_flows_survive_kill_and_sigterm_restarts_on_their_backends() {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(Cni::Routed, &pods).unwrap();
    let _servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| EchoServer::start(&tb.pod(name).ns, name, 7000).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let ips: Vec<String> = BACKENDS.iter().map(|b| tb.pod(b).ip.to_string()).collect();
    manifests(dir.path(), &ips);
    let pins = BpfFs::new();
    let client = tb.pod("client").ns.clone();

    let mut agent = start(&tb.node_ns, dir.path(), &pins, 0);
    wait_for(Duration::from_secs(20), "the ClusterIP to answer", || {
        Connections::open(&client, sock(VIP), 1).ok()
    });
    assert!(
        agent.log_text().contains("maps pinned"),
        "{}",
        agent.log_text()
    );

    let node_port = std::net::SocketAddr::from((NODE_EXTERNAL_IP, NODE_PORT));
    wait_for(Duration::from_secs(20), "the NodePort to answer", || {
        Connections::open(&tb.external_ns, node_port, 1).ok()
    });
    let mut cluster_ip = Connections::open(&client, sock(VIP), CONNECTIONS).unwrap();
    let mut from_outside = Connections::open(&tb.external_ns, node_port, CONNECTIONS).unwrap();
    let identities = |c: &Connections| c.identities().map(str::to_owned).collect::<Vec<_>>();
    let before = (identities(&cluster_ip), identities(&from_outside));
    for ids in [&before.0, &before.1] {
        for b in BACKENDS {
            let n = ids.iter().filter(|id| *id == b).count();
            assert!(n > CONNECTIONS / 4, "{b} got {n} of {CONNECTIONS}");
        }
    }
    assert_eq!(cluster_ip.check(0).broken, 0);
    assert_eq!(from_outside.check(0).broken, 0);
    let udp = UdpStream::start(&client, sock(VIP), Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    for (round, how) in [
        (1, "kill -9"),
        (2, "SIGTERM"),
        (3, "kill -9 and an upgrade from the previous map ABI"),
    ] {
        if how == "SIGTERM" {
            let status = agent.stop();
            assert!(status.success(), "{status:?}");
            assert!(
                agent.log_text().contains("datapath left in place"),
                "{}",
                agent.log_text()
            );
        } else {
            agent.kill();
        }
        if round == 3 {
            pin_as_previous_abi(&pins);
        }
        // No agent runs: the pinned datapath keeps serving.
        std::thread::sleep(Duration::from_millis(300));
        for (what, conns) in [
            ("ClusterIP", &mut cluster_ip),
            ("NodePort", &mut from_outside),
        ] {
            let check = conns.check(round * 10);
            assert_eq!(
                check.broken, 0,
                "{what} after {how}, with no agent: {check:?}"
            );
        }

        let started = std::time::Instant::now();
        agent = start(&tb.node_ns, dir.path(), &pins, round);
        if round == 3 {
            wait_for(Duration::from_secs(20), "the migration", || {
                agent
                    .log_text()
                    .contains("migrated the pinned maps to this agent's layout")
                    .then_some(())
            });
        }

        wait_for(
            Duration::from_secs(20),
            "the new agent to take over",
            || {
                agent
                    .log_text()
                    .contains("took over the pinned service maps")
                    .then_some(())
            },
        );
        wait_for(Duration::from_secs(20), "the node's interface", || {
            agent
                .log_text()
                .contains("attached tc_from_netdev at ingress")
                .then_some(())
        });
        let log = agent.log_text();
        let links = std::process::Command::new("ip")
            .args(["-n", &tb.node_ns, "-o", "link", "show"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&links.stdout);
        if round < 3 {
            assert!(
                log.contains("xdp=Adopted") && links.contains("xdpgeneric"),
                "the pinned XDP link is taken over\n{links}\n{log}"
            );
        } else {
            assert!(
                log.contains("xdp=None") && log.contains("veth: no XDP"),
                "under auto, the veth's pinned XDP link is let go\n{log}"
            );
            assert!(!links.contains("xdp"), "no XDP program is left\n{links}");
        }
        println!(
            "restart after {how}: the maps were taken over {:?} after the start",
            started.elapsed()
        );
        for (what, conns) in [
            ("ClusterIP", &mut cluster_ip),
            ("NodePort", &mut from_outside),
        ] {
            let check = conns.check(round * 10 + 1);
            assert_eq!(
                check.broken, 0,
                "{what} after {how} and a restart: {check:?}"
            );
        }
        let after = (identities(&cluster_ip), identities(&from_outside));
        assert_eq!(after, before, "every connection stays on its backend");

        // New connections are still balanced over both backends.
        let fresh = Connections::open(&client, sock(VIP), 40).unwrap();
        for b in BACKENDS {
            assert!(
                fresh.identities().any(|id| id == b),
                "no new connection reached {b}"
            );
        }
    }

    let tally = udp.finish();
    assert!(tally.sent > 50, "{tally:?}");
    assert_eq!(
        tally.backends.len(),
        1,
        "the UDP flow stayed on one backend: {tally:?}"
    );
    let lost = tally.sent - tally.answered;
    println!(
        "restart: {CONNECTIONS} TCP connections through the ClusterIP and {CONNECTIONS} through the NodePort, 0 broken; UDP {} sent, {} answered, {lost} lost",
        tally.sent, tally.answered
    );
    assert!(
        lost <= 3,
        "UDP datagrams lost across three restarts: {lost} ({tally:?})"
    );
    agent.stop();
}
