//! The proxy health server (`/healthz`, `/livez`) against every acceptance
//! case of upstream's unit tests (health timeout 10 s), through real HTTP on
//! loopback, bodies compared byte for byte with a fake clock.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Node;
use proxy_agent::{
    health::{Clock, ProxyHealth, proxy_server},
    metrics::ProxyMetrics,
    model::{FamilySet, IpFamily},
    sync::SyncObserver,
};
use serde_json::json;

use crate::http_client::{HttpReply, get, request};
use crate::http_serve::serve_in_background;

struct FakeClock(Mutex<SystemTime>);

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

impl FakeClock {
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

/// 2024-05-01T10:00:01Z
fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_557_601)
}

struct Fixture {
    clock: Arc<FakeClock>,
    health: Arc<ProxyHealth>,
    addr: std::net::SocketAddr,
}

fn fixture(families: Vec<IpFamily>) -> Fixture {
    let clock = Arc::new(FakeClock(Mutex::new(t0())));
    let health = Arc::new(ProxyHealth::new(
        families.clone(),
        Duration::from_secs(10),
        clock.clone(),
    ));
    let metrics = Arc::new(ProxyMetrics::new(families));
    let addr = serve_in_background("127.0.0.1", proxy_server::handler(health.clone(), metrics));
    Fixture {
        clock,
        health,
        addr,
    }
}

fn node(extra: serde_json::Value) -> Node {
    let mut node = json!({"metadata": {"name": "node-a"}, "spec": {}});
    if let Some(meta) = extra.get("metadata") {
        node["metadata"]
            .as_object_mut()
            .unwrap()
            .extend(meta.as_object().unwrap().clone());
    }
    if let Some(spec) = extra.get("spec") {
        node["spec"] = spec.clone();
    }
    serde_json::from_value(node).unwrap()
}

fn healthz(f: &Fixture) -> HttpReply {
    get(f.addr, "/healthz").unwrap()
}

fn livez(f: &Fixture) -> HttpReply {
    get(f.addr, "/livez").unwrap()
}

fn assert_json_headers(reply: &HttpReply) {
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn a_new_server_is_healthy_before_any_proxier_updated() {
    let f = fixture(vec![IpFamily::V4]);
    f.health.set_node(Some(&node(json!({}))));
    let reply = healthz(&f);
    assert_eq!(reply.status, 200);
    assert_json_headers(&reply);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:01Z","currentTime":"2024-05-01T10:00:01Z","nodeEligible":true,"healthy":true}"#,
        "no family updated yet: no status map, lastUpdated is now because healthy"
    );
    let reply = livez(&f);
    assert_eq!(reply.status, 200);
    assert_json_headers(&reply);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:01Z","currentTime":"2024-05-01T10:00:01Z","healthy":true}"#,
        "/livez never says nodeEligible"
    );
}

#[test]
fn a_queued_update_turns_the_server_unhealthy_once_it_is_the_timeout_old() {
    let f = fixture(vec![IpFamily::V4]);
    f.health.set_node(Some(&node(json!({}))));
    f.health.updated(IpFamily::V4);
    f.health.queued_update(IpFamily::V4);
    f.clock.advance(Duration::from_millis(5_250));
    let reply = healthz(&f);
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:06.25Z","currentTime":"2024-05-01T10:00:06.25Z","nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2024-05-01T10:00:01Z","healthy":true}}}"#
    );
    // A later queued update does not reset the oldest one.
    f.health.queued_update(IpFamily::V4);
    f.clock.advance(Duration::from_millis(4_750));
    let reply = healthz(&f);
    assert_eq!(reply.status, 503);
    assert_json_headers(&reply);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:01Z","currentTime":"2024-05-01T10:00:11Z","nodeEligible":true,"healthy":false,"status":{"IPv4":{"lastUpdated":"2024-05-01T10:00:01Z","healthy":false}}}"#,
        "unhealthy: lastUpdated is the proxier's, not now"
    );
    let reply = livez(&f);
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:01Z","currentTime":"2024-05-01T10:00:11Z","healthy":false,"status":{"IPv4":{"lastUpdated":"2024-05-01T10:00:01Z","healthy":false}}}"#
    );
    f.health.updated(IpFamily::V4);
    assert_eq!(healthz(&f).status, 200);
    assert_eq!(livez(&f).status, 200);
}

#[test]
fn in_dual_stack_one_late_family_makes_the_whole_proxy_unhealthy() {
    let f = fixture(vec![IpFamily::V4, IpFamily::V6]);
    f.health.set_node(Some(&node(json!({}))));
    f.health.updated(IpFamily::V4);
    f.health.updated(IpFamily::V6);
    f.health.queued_update(IpFamily::V4);
    f.health.queued_update(IpFamily::V6);
    f.clock.advance(Duration::from_secs(3));
    f.health.updated(IpFamily::V4);
    f.clock.advance(Duration::from_secs(7));
    let reply = healthz(&f);
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"2024-05-01T10:00:04Z","currentTime":"2024-05-01T10:00:11Z","nodeEligible":true,"healthy":false,"status":{"IPv4":{"lastUpdated":"2024-05-01T10:00:04Z","healthy":true},"IPv6":{"lastUpdated":"2024-05-01T10:00:01Z","healthy":false}}}"#
    );
    f.health.updated(IpFamily::V6);
    assert_eq!(healthz(&f).status, 200);
}

#[test]
fn node_eligibility_drains_healthz_but_not_livez() {
    let f = fixture(vec![IpFamily::V4]);
    assert_eq!(healthz(&f).status, 503, "the node object is not known yet");
    assert_eq!(livez(&f).status, 200);

    f.health.set_node(Some(&node(
        json!({"metadata": {"deletionTimestamp": "2024-05-01T09:00:00Z"}}),
    )));
    let reply = healthz(&f);
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.body,
        r#"{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2024-05-01T10:00:01Z","nodeEligible":false,"healthy":true}"#,
        "healthy is the proxier's health alone; on a 503 lastUpdated stays the proxier's (never: Go's zero time)"
    );
    assert_eq!(livez(&f).status, 200);

    let taint =
        |key: &str| node(json!({"spec": {"taints": [{"key": key, "effect": "NoSchedule"}]}}));
    f.health
        .set_node(Some(&taint("ToBeDeletedByClusterAutoscaler")));
    assert_eq!(healthz(&f).status, 503);
    assert_eq!(livez(&f).status, 200);
    f.health
        .set_node(Some(&taint("node.kubernetes.io/unschedulable")));
    assert_eq!(healthz(&f).status, 200, "other taints do not matter");
    f.health.set_node(None);
    assert_eq!(healthz(&f).status, 503, "a deleted node is not eligible");
}

#[test]
fn any_method_and_body_get_the_same_answer_and_other_paths_the_go_mux_404() {
    let f = fixture(vec![IpFamily::V4]);
    f.health.set_node(Some(&node(json!({}))));
    let get = healthz(&f);
    let post = request(f.addr, "POST", "/healthz", "{\"x\":1}").unwrap();
    assert_eq!((post.status, &post.body), (get.status, &get.body));
    let other = request(f.addr, "GET", "/healthz/extra", "").unwrap();
    assert_eq!(other.status, 404);
    assert_eq!(other.body, "404 page not found\n");
    assert_eq!(
        other.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
}

#[test]
fn the_sync_engine_drives_the_state_machine_as_upstream_proxiers_do() {
    let clock = Arc::new(FakeClock(Mutex::new(t0())));
    let health = ProxyHealth::new(vec![IpFamily::V4], Duration::from_secs(10), clock.clone());
    health.set_node(Some(&node(json!({}))));
    health.loop_started();
    assert_eq!(
        health.health().status.len(),
        1,
        "SyncLoop start counts as an update"
    );
    health.queued();
    clock.advance(Duration::from_secs(10));
    assert!(!health.health().healthy);
    let desired = Default::default();
    let changes = Default::default();
    let report = |succeeded| proxy_agent::sync::SyncReport {
        desired: &desired,
        changes: &changes,
        took: Duration::from_millis(1),
        succeeded,
        failed: if succeeded {
            FamilySet::default()
        } else {
            FamilySet::BOTH
        },
        counted: FamilySet::default(),
        trigger_times: &[],
    };
    health.synced(&report(false));
    assert!(!health.health().healthy, "a failed sync does not count");
    health.synced(&report(true));
    assert!(health.health().healthy);
}

/// A sync that wrote one family's rules and not the other's updates the
/// one alone, as upstream's proxier per family would.
#[test]
fn a_family_that_failed_goes_stale_alone() {
    let clock = Arc::new(FakeClock(Mutex::new(t0())));
    let families = vec![IpFamily::V4, IpFamily::V6];
    let health = ProxyHealth::new(families, Duration::from_secs(10), clock.clone());
    health.set_node(Some(&node(json!({}))));
    health.loop_started();
    health.queued();
    clock.advance(Duration::from_secs(11));
    let desired = Default::default();
    let changes = Default::default();
    health.synced(&proxy_agent::sync::SyncReport {
        desired: &desired,
        changes: &changes,
        took: Duration::from_millis(1),
        succeeded: false,
        failed: FamilySet {
            v4: false,
            v6: true,
        },
        counted: FamilySet::default(),
        trigger_times: &[],
    });
    let state = health.health();
    assert!(!state.healthy, "{state:?}");
    let healthy = |family: &str| state.status[family].healthy;
    assert!(healthy("IPv4"), "{state:?}");
    assert!(!healthy("IPv6"), "{state:?}");
}
