//! The rule-based modes end to end, nftables and iptables alike: the real
//! agent started with `--proxy-mode nftables` (or `iptables`) programs the
//! node's tables from manifest files, and real TCP and UDP go through them:
//! a pod reaches both backends of a cluster IP keeping its address; the
//! external client reaches a NodePort masqueraded to the node; a backend
//! that leaves takes its UDP conntrack entries with it; a service without
//! endpoints is refused at once, and in nftables mode an unused port of a
//! cluster IP too (upstream's iptables mode has no such rule). Needs root.

use std::{collections::BTreeSet, fs, net::SocketAddr, time::Duration};

use crate::support::{Agent, wait_for};
use testbed::{Cni, EXTERNAL_CLIENT_IP, NODE_EXTERNAL_IP, Testbed, netns, servers};

const VIP: &str = "198.19.0.60";
const EMPTY_VIP: &str = "198.19.0.61";
const NODE_PORT: u16 = 30_660;
const BACKENDS: [&str; 2] = ["nft-0", "nft-1"];
const TIMEOUT: Duration = Duration::from_millis(500);

fn write_manifests(tb: &Testbed, dir: &std::path::Path) {
    fs::write(
        dir.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: \"{NODE_EXTERNAL_IP}\"}}\n"
        ),
    )
    .unwrap();
    fs::write(
        dir.join("services.yaml"),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: demo}}\nspec:\n  type: NodePort\n  clusterIP: {VIP}\n  clusterIPs: [{VIP}]\n  ports:\n    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}\n    - {{name: dns, protocol: UDP, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: empty, namespace: demo}}\nspec:\n  clusterIP: {EMPTY_VIP}\n  clusterIPs: [{EMPTY_VIP}]\n  ports:\n    - {{name: http, protocol: TCP, port: 80, targetPort: 8080}}\n"
        ),
    )
    .unwrap();
    let mut slice = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports:\n  - {name: http, protocol: TCP, port: 8080}\n  - {name: dns, protocol: UDP, port: 8080}\nendpoints:\n",
    );
    for b in BACKENDS {
        slice.push_str(&format!(
            "  - addresses: [{}]\n    conditions: {{ready: true}}\n    nodeName: node-a\n",
            tb.pod(b).ip
        ));
    }
    fs::write(dir.join("slice.yaml"), slice).unwrap();
}

fn tcp(ns: &str, target: SocketAddr) -> anyhow::Result<String> {
    netns::run_in(ns, move || servers::tcp_identity(target, TIMEOUT))?
}

#[test]
fn nftables_mode_serves_cluster_ips_and_node_ports_and_rejects_without_endpoints() {
    serves_and_rejects("nftables");
}

#[test]
fn iptables_mode_serves_cluster_ips_and_node_ports_and_rejects_without_endpoints() {
    serves_and_rejects("iptables");
}

fn serves_and_rejects(mode: &str) {
    let mut pods: Vec<&str> = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(Cni::Routed, &pods).unwrap();
    let servers: Vec<_> = BACKENDS
        .iter()
        .map(|name| servers::IdentityServer::start(&tb.pod(name).ns, name, 8080).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    write_manifests(&tb, &manifests);
    let agent = Agent::start_as(
        &tb.node_ns,
        "node-a",
        &manifests,
        dir.path().join("agent.log"),
        &["--proxy-mode", mode, "--cluster-cidr", "198.18.0.0/16"],
    );

    let pod = tb.pod("client").ns.clone();
    let outside = tb.external_ns.clone();
    let vip: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let node_port = SocketAddr::new(NODE_EXTERNAL_IP.into(), NODE_PORT);
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        let ns = ns.clone();
        wait_for(
            Duration::from_secs(20),
            "the service through nftables",
            move || tcp(&ns, target).ok(),
        );
    }
    let (tool, args, want): (&str, &[&str], &str) = match mode {
        "nftables" => (
            "nft",
            &["list", "table", "ip", "kube-proxy"],
            "chain services",
        ),
        _ => ("iptables-save", &["-t", "nat"], "-A KUBE-SERVICES"),
    };
    let listing = netns::run_in(&tb.node_ns, move || {
        std::process::Command::new(tool)
            .args(args)
            .output()
            .unwrap()
    })
    .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    assert!(listing.contains(want), "{listing}\n{}", agent.log_text());

    // Both backends, over TCP and UDP, from the pod and from outside.
    for (ns, target) in [(&pod, vip), (&outside, node_port)] {
        let seen: BTreeSet<String> = (0..30).map(|_| tcp(ns, target).unwrap()).collect();
        assert_eq!(
            seen,
            BACKENDS.iter().map(|b| b.to_string()).collect(),
            "{target} over TCP"
        );
        let udp: BTreeSet<String> = (0..30)
            .map(|_| {
                netns::run_in(ns, move || servers::udp_identity(target, TIMEOUT))
                    .unwrap()
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(udp.len(), 2, "{target} over UDP: {udp:?}");
    }
    // The pod keeps its address; the external client is masqueraded.
    let sources: BTreeSet<std::net::Ipv4Addr> =
        servers.iter().flat_map(|s| s.tcp_sources()).collect();
    assert!(sources.contains(&tb.pod("client").ip), "{sources:?}");
    assert!(!sources.contains(&EXTERNAL_CLIENT_IP), "{sources:?}");

    // A backend leaves: its UDP flows are deleted from conntrack.
    let gone = tb.pod(BACKENDS[1]).ip;
    let with_gone = |flows: &[proxy_agent::modes::conntrack::Flow]| {
        flows
            .iter()
            .filter(|f| f.proto == 17 && f.reply_src.ip() == std::net::IpAddr::V4(gone))
            .count()
    };
    let udp_flows = || {
        netns::run_in(&tb.node_ns, || {
            proxy_agent::modes::conntrack::dump(proxy_agent::model::IpFamily::V4).unwrap()
        })
        .unwrap()
    };
    assert!(
        with_gone(&udp_flows()) > 0,
        "UDP flows to {gone} before it leaves"
    );
    let slice = fs::read_to_string(manifests.join("slice.yaml")).unwrap();
    let kept: String = slice
        .split("  - addresses:")
        .filter(|part| !part.contains(&format!("[{gone}]")))
        .collect::<Vec<_>>()
        .join("  - addresses:");
    fs::write(manifests.join("slice.yaml.tmp"), kept).unwrap();
    fs::rename(
        manifests.join("slice.yaml.tmp"),
        manifests.join("slice.yaml"),
    )
    .unwrap();
    wait_for(
        Duration::from_secs(20),
        "the UDP flows of the gone backend deleted",
        || (with_gone(&udp_flows()) == 0).then_some(()),
    );
    // Counted as upstream counts its conntrack reconciler's work.
    let node_ns = tb.node_ns.clone();
    let scrape = move || {
        let reply = netns::run_in(&node_ns, || {
            crate::http_client::get("127.0.0.1:10249".parse().unwrap(), "/metrics")
        });
        reply.ok()?.ok().map(|r| r.body)
    };
    let sample = |body: &str, series: &str| -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    let deleted = r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}"#;
    let metrics = wait_for(
        Duration::from_secs(10),
        "the deleted UDP flows counted in the metrics",
        || scrape().filter(|body| sample(body, deleted).is_some_and(|n| n >= 1.0)),
    );
    for series in [
        r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"}"#,
        r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv6"}"#,
    ] {
        assert!(
            sample(&metrics, series).is_some_and(|n| n >= 1.0),
            "{series}: every sync reconciles each family\n{metrics}"
        );
    }
    if mode == "iptables" {
        // The rules kube-proxy owns, as the kernel holds them after that
        // partial sync (the jumps from the built-in chains are not counted,
        // as upstream does not count them).
        for table in ["filter", "nat"] {
            let dump = netns::run_in(&tb.node_ns, move || {
                std::process::Command::new("iptables-save")
                    .args(["-t", table])
                    .output()
                    .unwrap()
            })
            .unwrap();
            let held = String::from_utf8_lossy(&dump.stdout)
                .lines()
                .filter(|l| l.starts_with("-A KUBE-"))
                .count();
            let series = |name: &str| {
                let series = format!(r#"{name}{{ip_family="IPv4",table="{table}"}}"#);
                sample(&metrics, &series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
            };
            let total = series("kubeproxy_sync_proxy_rules_iptables_total");
            let last = series("kubeproxy_sync_proxy_rules_iptables_last");
            assert_eq!(total, held as f64, "{table}: the rules in the kernel");
            assert!(
                last > 0.0 && last <= total,
                "{table}: last {last}, total {total}"
            );
        }
    }

    // Refused at once: no endpoints, and another port of a cluster IP. A
    // real node routes the service range somewhere (its default route);
    // without a route the node would answer "unreachable" before nftables
    // sees the packet.
    testbed::netns::ip(
        Some(&tb.node_ns),
        &[
            "route",
            "add",
            "198.19.0.0/16",
            "via",
            &EXTERNAL_CLIENT_IP.to_string(),
        ],
    )
    .unwrap();
    let mut refused = vec![format!("{EMPTY_VIP}:80").parse::<SocketAddr>().unwrap()];
    if mode == "nftables" {
        refused.push(format!("{VIP}:81").parse().unwrap());
    }
    for target in refused {
        // Long enough for the SYN's first retransmission (1 s): two CI runs
        // saw the 500 ms connect time out here, while every other refusal
        // (and this one, locally, every time) came at once. Still only a
        // refusal passes.
        let err = netns::run_in(&pod, move || {
            servers::tcp_identity(target, Duration::from_millis(3_000))
        })
        .unwrap()
        .unwrap_err();
        assert!(format!("{err:#}").contains("refused"), "{target}: {err:#}");
    }
    drop(agent);
}
