//! SCTP end to end with raw packets (these kernels have no SCTP sockets):
//! the real agent programs an SCTP service (cluster IP and NodePort, two
//! backend pods) from manifest files; a client pod's INITs to the cluster
//! IP and the external client's to the NodePort are answered by the
//! backends' INIT ACKs through the datapath, both ways translated, every
//! CRC32c verifying where it arrives (the backends count bad ones, the
//! client refuses them), the NodePort's INITs masqueraded to the node, and
//! the associations spread over both backends. Needs root.

use std::{
    collections::BTreeSet,
    fs,
    net::{IpAddr, SocketAddr},
    sync::atomic::Ordering,
    time::Duration,
};

use crate::support::{Agent, wait_for};
use testbed::{Cni, EXTERNAL_CLIENT_IP, NODE_EXTERNAL_IP, Testbed, netns, sctp};

const VIP: &str = "198.19.0.50";
const NODE_PORT: u16 = 30_650;
const BACKENDS: [&str; 2] = ["assoc-0", "assoc-1"];
const TIMEOUT: Duration = Duration::from_millis(500);

fn manifests(tb: &Testbed, dir: &std::path::Path) {
    fs::write(
        dir.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: \"{NODE_EXTERNAL_IP}\"}}\n"
        ),
    )
    .unwrap();
    fs::write(
        dir.join("service.yaml"),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: signal, namespace: demo}}\nspec:\n  type: NodePort\n  clusterIP: {VIP}\n  clusterIPs: [{VIP}]\n  ports:\n    - {{name: sctp, protocol: SCTP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}\n"
        ),
    )
    .unwrap();
    let mut slice = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: signal-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: signal}\naddressType: IPv4\nports:\n  - {name: sctp, protocol: SCTP, port: 8080}\nendpoints:\n",
    );
    for b in BACKENDS {
        slice.push_str(&format!(
            "  - addresses: [{}]\n    conditions: {{ready: true}}\n    nodeName: node-a\n",
            tb.pod(b).ip
        ));
    }
    fs::write(dir.join("slice.yaml"), slice).unwrap();
}

/// INITs from `ns` to `target`, from source ports `ports`: who answered.
fn associations(ns: &str, target: SocketAddr, ports: std::ops::Range<u16>) -> Vec<sctp::InitAck> {
    netns::run_in(ns, move || {
        ports
            .map(|sport| sctp::init(target, sport, TIMEOUT))
            .collect::<anyhow::Result<Vec<_>>>()
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("associations to {target}: {e:#}"))
}

#[test]
fn sctp_associations_reach_the_backends_and_answer_through_the_datapath() {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(Cni::Routed, &pods).unwrap();
    let servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| sctp::SctpServer::start(&tb.pod(name).ns, name, 8080).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let dir_manifests = dir.path().join("manifests");
    fs::create_dir(&dir_manifests).unwrap();
    manifests(&tb, &dir_manifests);
    let agent = Agent::start(&tb.node_ns, &dir_manifests, dir.path().join("agent.log"));

    let pod = tb.pod("client").ns.clone();
    let outside = tb.external_ns.clone();
    let vip: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let node_port = SocketAddr::new(NODE_EXTERNAL_IP.into(), NODE_PORT);
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        let ns = ns.clone();
        wait_for(Duration::from_secs(20), "the SCTP service", move || {
            netns::run_in(&ns, move || sctp::init(target, 4999, TIMEOUT).ok()).unwrap()
        });
    }

    for (ns, target, first) in [(&pod, vip, 5000u16), (&outside, node_port, 6000)] {
        let answers = associations(ns, target, first..first + 24);
        // Each answer comes from the address and port asked (translated back).
        for a in &answers {
            assert_eq!(a.from, target, "{a:?}\n{}", agent.log_text());
        }
        let identities: BTreeSet<&str> = answers.iter().map(|a| a.identity.as_str()).collect();
        assert_eq!(
            identities,
            BACKENDS.into_iter().collect(),
            "{target}: 24 associations over both backends"
        );
    }
    for (name, server) in BACKENDS.iter().zip(&servers) {
        assert_eq!(
            server.seen.bad_crc.load(Ordering::Relaxed),
            0,
            "{name}: every INIT arrived with a valid CRC32c"
        );
        let sources: BTreeSet<IpAddr> = server
            .seen
            .inits
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.ip())
            .collect();
        assert!(
            sources.contains(&IpAddr::from(tb.pod("client").ip)),
            "{name}: the pod's INITs keep its address: {sources:?}"
        );
        assert!(
            !sources.contains(&IpAddr::from(EXTERNAL_CLIENT_IP)),
            "{name}: the NodePort's INITs are masqueraded: {sources:?}"
        );
    }
    drop(agent);
}
