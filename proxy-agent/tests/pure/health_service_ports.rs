//! Service health-check node ports against upstream's acceptance cases,
//! through real HTTP on loopback addresses: the count of ready local
//! endpoints, terminating ones not counted, a stale proxier, listeners
//! closed and moved with the service, nodePortAddresses, a port in use.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr, TcpListener},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Service;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::{
    events::{EventRecorder, Regarding},
    health::{ProxyHealth, ServiceHealthPorts, SystemClock},
    model::{DesiredState, IpFamily, NamespacedName, build_desired_state},
    sync::SyncChanges,
};
use serde_json::json;

use crate::http_client::{HttpReply, get};

const NODE: &str = "node-a";
const FULL: SyncChanges = SyncChanges {
    full: true,
    changed: BTreeSet::new(),
};

#[derive(Default)]
struct Recorded(Mutex<Vec<(Regarding, String, String)>>);

impl EventRecorder for Recorded {
    fn warning(&self, regarding: Regarding, reason: &str, _action: &str, message: &str) {
        self.0
            .lock()
            .unwrap()
            .push((regarding, reason.into(), message.into()));
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn service(hc_port: u16, policy: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "svc1", "namespace": "ns1"},
        "spec": {
            "type": "LoadBalancer", "clusterIP": "198.19.0.10", "clusterIPs": ["198.19.0.10"],
            "externalTrafficPolicy": policy, "healthCheckNodePort": hc_port,
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "https", "port": 443, "protocol": "TCP", "nodePort": 30443}
            ]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.3.20"}]}}
    }))
    .unwrap()
}

/// `(ip, node, ready, serving, terminating)` endpoints serving both ports.
fn slice(endpoints: &[(&str, &str, bool, bool, bool)]) -> EndpointSlice {
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|(ip, node, ready, serving, terminating)| {
            json!({"addresses": [ip], "nodeName": node,
                   "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "svc1-abc", "namespace": "ns1",
                     "labels": {"kubernetes.io/service-name": "svc1"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "https", "port": 8443, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .unwrap()
}

fn desired(services: &[Service], slices: &[EndpointSlice], node_ips: &[&str]) -> DesiredState {
    let mut desired = build_desired_state(services, slices, NODE);
    desired.node.node_port_addresses = node_ips.iter().map(|ip| ip.parse().unwrap()).collect();
    desired
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    ports: ServiceHealthPorts,
    health: Arc<ProxyHealth>,
    events: Arc<Recorded>,
}

fn fixture(all_addresses: bool, timeout: Duration) -> Fixture {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let health = Arc::new(ProxyHealth::new(
        vec![IpFamily::V4],
        timeout,
        Arc::new(SystemClock),
    ));
    let events = Arc::new(Recorded::default());
    let ports = {
        let _entered = runtime.enter();
        ServiceHealthPorts::new(NODE, all_addresses, health.clone(), events.clone())
    };
    Fixture {
        runtime,
        ports,
        health,
        events,
    }
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse::<IpAddr>().unwrap(), port)
}

fn expected_body(count: usize, healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc1\"\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {healthy}\n}}"
    )
}

/// Syncs service svc1 with health-check port `port` and one ready local endpoint.
fn sync_one_local(f: &Fixture, port: u16, policy: &str, node_ips: &[&str]) {
    let local = slice(&[("198.18.1.10", NODE, true, true, false)]);
    f.ports.sync(
        &desired(&[service(port, policy)], &[local], node_ips),
        &FULL,
    );
}

fn assert_answer(reply: &HttpReply, status: u16, count: usize, healthy: bool) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(reply.body, expected_body(count, healthy));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        reply.header("x-load-balancing-endpoint-weight"),
        Some(count.to_string().as_str())
    );
}

#[test]
fn the_answer_counts_ready_local_endpoints_by_address_on_any_path() {
    let f = fixture(false, Duration::from_secs(60));
    let port = free_port();
    let svc = service(port, "Local");
    // Two local ready pods (each serving both ports: counted once each), one remote.
    let two_local = slice(&[
        ("198.18.1.10", NODE, true, true, false),
        ("198.18.1.11", NODE, true, true, false),
        ("198.18.2.10", "node-b", true, true, false),
    ]);
    f.ports.sync(
        &desired(std::slice::from_ref(&svc), &[two_local], &["127.0.0.1"]),
        &FULL,
    );
    for path in ["/", "/healthz", "/anything?x=1"] {
        assert_answer(&get(at("127.0.0.1", port), path).unwrap(), 200, 2, true);
    }

    let all_remote = slice(&[("198.18.2.10", "node-b", true, true, false)]);
    f.ports.sync(
        &desired(std::slice::from_ref(&svc), &[all_remote], &["127.0.0.1"]),
        &FULL,
    );
    assert_answer(&get(at("127.0.0.1", port), "/").unwrap(), 503, 0, true);

    let only_terminating = slice(&[
        ("198.18.1.10", NODE, false, true, true),
        ("198.18.2.10", "node-b", true, true, false),
    ]);
    f.ports
        .sync(&desired(&[svc], &[only_terminating], &["127.0.0.1"]), &FULL);
    assert_answer(&get(at("127.0.0.1", port), "/").unwrap(), 503, 0, true);
    assert!(f.events.0.lock().unwrap().is_empty());
    drop(f.runtime);
}

#[test]
fn a_stale_proxier_fails_the_check_with_its_endpoints_still_counted() {
    let f = fixture(false, Duration::from_millis(200));
    let port = free_port();
    let state = desired(
        &[service(port, "Local")],
        &[slice(&[
            ("198.18.1.10", NODE, true, true, false),
            ("198.18.1.11", NODE, true, true, false),
        ])],
        &["127.0.0.1"],
    );
    f.ports.sync(&state, &FULL);
    f.health.updated(IpFamily::V4);
    f.health.queued_update(IpFamily::V4);
    std::thread::sleep(Duration::from_millis(250));
    assert_answer(&get(at("127.0.0.1", port), "/").unwrap(), 503, 2, false);
    f.health.updated(IpFamily::V4);
    assert_answer(&get(at("127.0.0.1", port), "/").unwrap(), 200, 2, true);
}

#[test]
fn listeners_close_and_move_with_the_service() {
    let f = fixture(false, Duration::from_secs(60));
    let (first, second) = (free_port(), free_port());
    let local = slice(&[("198.18.1.10", NODE, true, true, false)]);
    sync_one_local(&f, first, "Local", &["127.0.0.1"]);
    assert_eq!(get(at("127.0.0.1", first), "/").unwrap().status, 200);

    sync_one_local(&f, second, "Local", &["127.0.0.1"]);
    assert!(
        get(at("127.0.0.1", first), "/").is_err(),
        "the old port is closed"
    );
    assert_eq!(get(at("127.0.0.1", second), "/").unwrap().status, 200);

    sync_one_local(&f, second, "Cluster", &["127.0.0.1"]);
    assert!(
        get(at("127.0.0.1", second), "/").is_err(),
        "eTP Cluster releases the port"
    );

    sync_one_local(&f, second, "Local", &["127.0.0.1"]);
    assert_eq!(get(at("127.0.0.1", second), "/").unwrap().status, 200);
    f.ports.sync(&desired(&[], &[local], &["127.0.0.1"]), &FULL);
    assert!(
        get(at("127.0.0.1", second), "/").is_err(),
        "a deleted service's port is closed"
    );
}

#[test]
fn only_the_node_port_addresses_get_a_listener_unless_all_are_selected() {
    let f = fixture(false, Duration::from_secs(60));
    let port = free_port();
    sync_one_local(&f, port, "Local", &["127.0.0.2"]);
    assert_eq!(get(at("127.0.0.2", port), "/").unwrap().status, 200);
    assert!(
        get(at("127.0.0.3", port), "/").is_err(),
        "127.0.0.3 is not a node-port address"
    );

    let all = fixture(true, Duration::from_secs(60));
    let port = free_port();
    sync_one_local(&all, port, "Local", &["127.0.0.2"]);
    for ip in ["127.0.0.3", "127.0.0.4"] {
        assert_eq!(
            get(at(ip, port), "/").unwrap().status,
            200,
            "nodePortAddresses unset: one listener on every address"
        );
    }
}

#[test]
fn a_port_in_use_raises_a_warning_event_and_is_retried_at_the_next_sync() {
    let f = fixture(false, Duration::from_secs(60));
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let state = desired(
        &[service(port, "Local")],
        &[slice(&[("198.18.1.10", NODE, true, true, false)])],
        &["127.0.0.1"],
    );
    f.ports.sync(&state, &FULL);
    let events = f.events.0.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let (regarding, reason, message) = &events[0];
    assert_eq!(
        *regarding,
        Regarding::Service(NamespacedName::new("ns1", "svc1"))
    );
    assert_eq!(reason, "FailedToStartServiceHealthcheck");
    assert!(
        message.starts_with(&format!(
            "node {NODE} failed to start healthcheck \"ns1/svc1\" on port {port}: "
        )),
        "{message}"
    );
    drop(taken);
    f.ports.sync(&state, &FULL);
    assert_eq!(get(at("127.0.0.1", port), "/").unwrap().status, 200);
}

/// A health-check port closed for its service also closes the connections
/// it accepted (Go's `http.Server.Close`): a load balancer that keeps its
/// connection open must not go on reading 200 from a port no longer served.
#[test]
fn closing_a_port_closes_its_open_connections() {
    use std::io::{Read as _, Write as _};
    let f = fixture(false, Duration::from_secs(60));
    let port = free_port();
    sync_one_local(&f, port, "Local", &["127.0.0.1"]);
    let mut kept = std::net::TcpStream::connect(at("127.0.0.1", port)).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: lb\r\n\r\n";
    kept.write_all(request).unwrap();
    let mut answer = [0u8; 4096];
    let n = kept.read(&mut answer).unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );

    sync_one_local(&f, port, "Cluster", &["127.0.0.1"]);
    // The close is the listener task's abort: give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    let _ = kept.write_all(request);
    match kept.read(&mut answer) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            panic!("the kept connection is still open: {e}")
        }
        Ok(0) | Err(_) => {}
        Ok(n) => panic!(
            "the closed port answered on a kept connection: {}",
            String::from_utf8_lossy(&answer[..n])
        ),
    }
}
