//! Health, health-check node ports and metrics of the real agent in the
//! two-node testbed: the external client probes each node as a cloud load
//! balancer does, endpoint and service changes are followed, the Node's
//! eligibility drains `/healthz`, and a scrape shows the sync engine at work.

use std::{
    fs,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use crate::{
    e2e_cluster::node_yaml,
    http_client::{HttpReply, get},
    support::{Agent, wait_for},
};
use testbed::{
    clients::tcp_connect_outcome,
    cluster::{Cluster, NodeId},
    netns,
    servers::IdentityServer,
};

const HC_PORT: u16 = 32100;
const HEALTHZ_PORT: u16 = 10256;

fn service(policy: &str, hc_port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: esipp, namespace: e2e}}\nspec:\n  type: LoadBalancer\n  clusterIP: 198.19.0.40\n  clusterIPs: [198.19.0.40]\n  externalTrafficPolicy: {policy}\n  healthCheckNodePort: {hc_port}\n  ports:\n    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30400}}\nstatus:\n  loadBalancer:\n    ingress: [{{ip: 198.18.3.40}}]\n"
    )
}

/// `(pod ip, node, ready)`; a not-ready endpoint is terminating but serving.
fn slice(endpoints: &[(IpAddr, &str, bool)]) -> String {
    let mut s = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: esipp-1\n  namespace: e2e\n  labels: {kubernetes.io/service-name: esipp}\naddressType: IPv4\nports:\n  - {name: http, protocol: TCP, port: 8080}\nendpoints:\n".to_owned();
    for (ip, node, ready) in endpoints {
        s.push_str(&format!(
            "  - addresses: [{ip}]\n    nodeName: {node}\n    conditions: {{ready: {ready}, serving: true, terminating: {}}}\n",
            !ready
        ));
    }
    s
}

/// GET from the external client's namespace.
fn probe(cluster: &Cluster, ip: IpAddr, port: u16, path: &'static str) -> Option<HttpReply> {
    let addr = SocketAddr::new(ip, port);
    netns::run_in(&cluster.client().ns, move || get(addr, path).ok()).unwrap()
}

fn local_endpoints(reply: &HttpReply) -> u64 {
    let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    body["localEndpoints"].as_u64().unwrap()
}

fn write(dir: &Path, file: &str, text: String) {
    let tmp = dir.join(format!(".{file}.tmp"));
    fs::write(&tmp, text).unwrap();
    fs::rename(tmp, dir.join(file)).unwrap();
}

#[test]
fn health_check_node_ports_follow_endpoints_and_nodes_drain_on_deletion() {
    let mut cluster = Cluster::new().unwrap();
    let pod_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
    let pod_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        cluster.node(NodeId::A).clone(),
        cluster.node(NodeId::B).clone(),
    );
    let nodes = |a_taints: &str| {
        let cidr = a.pod_cidr.to_string();
        format!(
            "{}---\n{}",
            node_yaml("node-a", a.ip, &cidr).replace(
                &format!("spec: {{podCIDR: {cidr}, podCIDRs: [{cidr}]}}"),
                &format!("spec: {{podCIDR: {cidr}, podCIDRs: [{cidr}], taints: [{a_taints}]}}"),
            ),
            node_yaml("node-b", b.ip, &b.pod_cidr.to_string())
        )
    };
    write(dir.path(), "nodes.yaml", nodes(""));
    write(dir.path(), "svc.yaml", service("Local", HC_PORT));
    write(
        dir.path(),
        "slice.yaml",
        slice(&[(pod_b.ip.into(), "node-b", true)]),
    );
    let agents: Vec<Agent> = [(NodeId::A, "node-a"), (NodeId::B, "node-b")]
        .into_iter()
        .map(|(id, name)| {
            Agent::start_as(
                &cluster.node(id).ns,
                name,
                dir.path(),
                dir.path().join(format!("{name}.log")),
                // XDP on the veths (`auto` leaves them to TC), for the
                // attachment metrics below.
                &["--ebpf-xdp-mode", "generic"],
            )
        })
        .collect();
    let logs = || {
        agents
            .iter()
            .map(Agent::log_text)
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let (ip_a, ip_b) = (IpAddr::from(a.ip), IpAddr::from(b.ip));
    let answered = |ip, status, count| {
        let what = format!("{ip}:{HC_PORT} answering {status} with {count} local endpoints");
        wait_for(Duration::from_secs(20), &what, || {
            probe(&cluster, ip, HC_PORT, "/healthz")
                .filter(|r| r.status == status && local_endpoints(r) == count)
        })
    };

    // As the ESIPP e2e: 200 where a ready endpoint runs, 503 elsewhere.
    let on_b = answered(ip_b, 200, 1);
    assert_eq!(on_b.header("x-load-balancing-endpoint-weight"), Some("1"));
    assert_eq!(
        on_b.body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"e2e\",\n\t\t\"name\": \"esipp\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
    );
    answered(ip_a, 503, 0);

    // web-b terminates, web-a becomes ready: the answers swap.
    write(
        dir.path(),
        "slice.yaml",
        slice(&[
            (pod_b.ip.into(), "node-b", false),
            (pod_a.ip.into(), "node-a", true),
        ]),
    );
    answered(ip_a, 200, 1);
    answered(ip_b, 503, 0);
    // The log says what was programmed and why: node-a first had no local
    // endpoint for its eTP Local service, then one.
    let log_a = agents[0].log_text();
    assert!(
        log_a.contains("full sync programmed service_ports=1 without_endpoints=0 local_policy_without_local_endpoints=1")
            && log_a.contains("service port programmed: balanced service=e2e/esipp:http/TCP"),
        "{log_a}"
    );

    // The proxy health server: healthy, eligible nodes.
    for ip in [ip_a, ip_b] {
        for path in ["/healthz", "/livez"] {
            let reply = probe(&cluster, ip, HEALTHZ_PORT, path)
                .unwrap_or_else(|| panic!("{ip} {path} unanswered\n{}", logs()));
            assert_eq!(reply.status, 200, "{ip}{path}: {}\n{}", reply.body, logs());
            let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
            assert_eq!(body["healthy"], true);
            assert_eq!(body["status"]["IPv4"]["healthy"], true, "{body}");
            assert_eq!(body.get("nodeEligible").is_some(), path == "/healthz");
        }
    }

    // The autoscaler is about to remove node-a: load balancers drain it.
    let tainted_nodes =
        nodes("{key: ToBeDeletedByClusterAutoscaler, value: \"1700000000\", effect: NoSchedule}");
    assert!(
        tainted_nodes.contains("taints: [{key: ToBeDeleted"),
        "{tainted_nodes}"
    );
    write(dir.path(), "nodes.yaml", tainted_nodes);
    let drained = wait_for(Duration::from_secs(10), "node-a /healthz 503", || {
        probe(&cluster, ip_a, HEALTHZ_PORT, "/healthz").filter(|r| r.status == 503)
    });
    assert!(
        drained
            .body
            .contains(r#""nodeEligible":false,"healthy":true"#),
        "{}",
        drained.body
    );
    assert_eq!(
        probe(&cluster, ip_a, HEALTHZ_PORT, "/livez")
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        probe(&cluster, ip_b, HEALTHZ_PORT, "/healthz")
            .unwrap()
            .status,
        200
    );

    // eTP Cluster: no health check any more.
    write(dir.path(), "svc.yaml", service("Cluster", HC_PORT));
    for ip in [ip_a, ip_b] {
        wait_for(
            Duration::from_secs(10),
            "the health-check port closed",
            || probe(&cluster, ip, HC_PORT, "/").is_none().then_some(()),
        );
    }

    // The kernel keeps BPF run times while this descriptor is held (it does
    // not change the sysctl, and ends with the test).
    let _run_time = aya::sys::enable_stats(aya::sys::Stats::RunTime).unwrap();
    // A connection through node-a's NodePort to its local endpoint.
    let _server = IdentityServer::start(&pod_a.ns, "web-a", 8080).unwrap();
    let through = std::net::SocketAddrV4::new(a.ip, 30400);
    let outcome = tcp_connect_outcome(&cluster.client().ns, None, through, Duration::from_secs(1));
    assert_eq!(outcome.identity(), Some("web-a"), "{outcome:?}\n{}", logs());

    // The scrape, from inside node-a (metrics listen on 127.0.0.1:10249 by default).
    let ns = a.ns.clone();
    let fetch = move |path: &'static str| {
        let ns = ns.clone();
        netns::run_in(&ns, move || {
            get("127.0.0.1:10249".parse().unwrap(), path).unwrap()
        })
        .unwrap()
    };
    let metrics = fetch("/metrics");
    assert_eq!(metrics.status, 200);
    let sample = |series: &str| -> f64 {
        metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{}", metrics.body))
    };
    assert!(
        sample(r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#) > 1.7e9
    );
    // One sync programs both families' maps: both are reported.
    assert!(
        sample(r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}"#) > 1.7e9
    );
    assert!(sample("kubeproxy_sync_proxy_rules_service_changes_total") >= 2.0);
    assert!(sample("kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 2.0);
    assert!(
        sample(r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}"#) >= 3.0
    );
    assert!(sample(r#"kubeproxy_proxy_healthz_total{code="503"}"#) >= 1.0);
    assert!(sample(r#"kubeproxy_proxy_livez_total{code="200"}"#) >= 1.0);
    // Upstream's conntrack reconciler metrics, fed by the UDP flow flushes
    // (none here: no UDP backend left).
    for family in ["IPv4", "IPv6"] {
        assert_eq!(
            sample(&format!(
                r#"kubeproxy_conntrack_reconciler_deleted_entries_total{{ip_family="{family}"}}"#
            )),
            0.0
        );
        sample(&format!(
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{{ip_family="{family}"}}"#
        ));
    }
    // The process's, unprefixed, as every Kubernetes component serves them.
    assert!(sample("process_resident_memory_bytes") > 1e6);
    assert!(sample("process_cpu_seconds_total") > 0.0);
    assert!(sample("process_start_time_seconds") > 1.7e9);
    // The datapath's own: counters by reason, map fill, attachments.
    assert!(sample(r#"kubeproxy_ebpf_datapath_events_total{event="new_flow"}"#) >= 1.0);
    assert!(sample(r#"kubeproxy_ebpf_map_entries{map="CONNTRACK"}"#) >= 2.0);
    for map in ["SERVICES", "BACKENDS", "SOCKETS", "CONFIG", "STATS"] {
        sample(&format!(r#"kubeproxy_ebpf_map_capacity{{map="{map}"}}"#));
    }
    let log_a = agents[0].log_text();
    let conntrack_size = log_a
        .split("conntrack: ")
        .nth(1)
        .and_then(|rest| rest.split([' ', ',']).next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no map sizes in the log\n{log_a}"));
    assert_eq!(
        sample(r#"kubeproxy_ebpf_map_capacity{map="CONNTRACK"}"#),
        conntrack_size
    );
    assert!(
        metrics.body.contains(r#"kubeproxy_ebpf_interface_attached{interface="eth0",program="tc_from_netdev",mode="tc_ingress"} 1"#),
        "{}",
        metrics.body
    );
    assert!(
        metrics
            .body
            .contains(r#"kubeproxy_ebpf_interface_attached{interface="eth0",program="xdp_from_netdev",mode="xdp_"#),
        "{}",
        metrics.body
    );
    assert!(sample(r#"kubeproxy_ebpf_program_runs_total{program="tc_from_netdev"}"#) >= 1.0);
    assert!(sample(r#"kubeproxy_ebpf_program_run_seconds_total{program="tc_from_netdev"}"#) > 0.0);
    for name in proxy_agent::modes::ebpf::metrics::sample_names() {
        assert!(
            metrics.body.contains(&format!("\n{name}{{")),
            "{name} missing from\n{}",
            metrics.body
        );
    }
    let mode = fetch("/proxyMode");
    assert_eq!((mode.status, mode.body.as_str()), (200, "ebpf"));
    let configz: serde_json::Value = serde_json::from_str(&fetch("/configz").body).unwrap();
    assert_eq!(
        configz["kubeproxy.config.k8s.io"]["healthzBindAddress"], "0.0.0.0:10256",
        "{configz}"
    );
    assert_eq!(fetch("/healthz").body, "ok");
    drop(agents);
}

#[test]
fn bind_address_hard_fail_stops_the_agent_before_it_touches_the_datapath() {
    let cluster = Cluster::new().unwrap();
    let ns = cluster.node(NodeId::A).ns.clone();
    let dir = tempfile::tempdir().unwrap();
    // Something else holds the health port.
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let holder = netns::spawn_in(&ns, move || {
        let _taken = std::net::TcpListener::bind("0.0.0.0:10256").unwrap();
        ready_tx.send(()).unwrap();
        let _ = hold_rx.recv();
    })
    .unwrap();
    ready_rx.recv().unwrap();
    let mut agent = Agent::start_as(
        &ns,
        "node-a",
        dir.path(),
        dir.path().join("agent.log"),
        &["--bind-address-hard-fail"],
    );
    let status = wait_for(Duration::from_secs(10), "the agent to exit", || {
        agent.try_wait()
    });
    let log = agent.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(
            "healthzBindAddress: cannot listen on 0.0.0.0:10256 (bindAddressHardFail is set)"
        ),
        "{log}"
    );
    assert!(!log.contains("maps ready"), "{log}");
    drop(hold_tx);
    holder.join().unwrap();
}
