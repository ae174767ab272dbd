//! Change trackers record only what changed (upstream servicechangetracker /
//! endpointslicecache tests, reduced to their facts).

use k8s_openapi::api::core::v1::Service;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::model::{
    DesiredState, EndpointsChangeTracker, NamespacedName, NodeTopology, Protocol,
    ServiceChangeTracker, ServicePortName,
};
use serde_json::{Value, json};

const NODE: &str = "node-a";

fn svc(name: &str, ports: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.1", "ports": ports},
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, ips: &[&str]) -> EndpointSlice {
    let eps: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "nodeName": "node-b"}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "a", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap()
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

fn spn(name: &str, port: &str) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: name.into(),
        port_name: port.into(),
        protocol: Protocol::Tcp,
    }
}

#[test]
fn service_tracker_cancels_changes_that_return_to_applied_state() {
    let mut t = ServiceChangeTracker::default();
    let v1 = svc("s", json!([{"name": "a", "port": 80}]));
    assert!(t.update(&v1));
    assert_eq!(t.apply(), [nn("s")].into());
    assert!(!t.update(&v1), "same object again is no change");

    let v2 = svc("s", json!([{"name": "a", "port": 81}]));
    assert!(t.update(&v2));
    assert!(
        !t.update(&v1),
        "back to the applied state cancels the pending change"
    );
    assert!(t.apply().is_empty());

    // Metadata-only updates (new resourceVersion, labels) change nothing kube-proxy reads.
    let mut relabelled = v1.clone();
    relabelled.metadata.resource_version = Some("99".into());
    relabelled.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
    assert!(!t.update(&relabelled));

    assert!(t.delete(&nn("s")));
    assert_eq!(t.apply(), [nn("s")].into());
    assert!(t.ports(&nn("s")).is_none());
    assert!(
        !t.delete(&nn("s")),
        "deleting an unknown service is no change"
    );
}

#[test]
fn endpoints_tracker_reports_only_services_whose_endpoints_changed() {
    let mut t = EndpointsChangeTracker::new(NODE);
    assert!(t.update(&slice("s-1", "s", &["10.0.0.1"])));
    assert!(t.update(&slice("o-1", "other", &["10.0.9.1"])));
    assert_eq!(t.apply(), [nn("other"), nn("s")].into());
    // A service first seen with a slice of no endpoint has none to report.
    assert!(t.update(&slice("e-1", "empty", &[])));
    assert!(t.apply().is_empty());

    assert!(
        !t.update(&slice("s-1", "s", &["10.0.0.1"])),
        "identical slice"
    );
    // An endpoint moving between two slices of one service changes no endpoint list.
    assert!(t.update(&slice("s-1", "s", &[])));
    assert!(t.update(&slice("s-2", "s", &["10.0.0.1"])));
    assert!(t.apply().is_empty());

    assert!(t.update(&slice("s-2", "s", &["10.0.0.1", "10.0.0.2"])));
    assert_eq!(t.apply(), [nn("s")].into());
    assert_eq!(
        t.endpoints(&nn("s"))
            .unwrap()
            .get("a", Protocol::Tcp)
            .unwrap()
            .len(),
        2
    );

    assert!(t.delete("ns", "s-2"));
    assert!(t.delete("ns", "s-1"));
    assert!(!t.delete("ns", "s-1"));
    assert_eq!(t.apply(), [nn("s")].into());
    assert!(t.endpoints(&nn("s")).is_none());
}

#[test]
fn slice_relabelled_to_another_service_leaves_the_first() {
    let mut t = EndpointsChangeTracker::new(NODE);
    t.update(&slice("moving", "a", &["10.0.0.1"]));
    t.apply();
    assert!(t.update(&slice("moving", "b", &["10.0.0.1"])));
    assert_eq!(t.apply(), [nn("a"), nn("b")].into());
    assert!(t.endpoints(&nn("a")).is_none());
    assert!(t.endpoints(&nn("b")).is_some());
    // Deleting it later finds it under its new service.
    assert!(t.delete("ns", "moving"));
    assert_eq!(t.apply(), [nn("b")].into());
}

#[test]
fn desired_state_partial_update_names_only_changed_ports() {
    let mut svcs = ServiceChangeTracker::default();
    let mut eps = EndpointsChangeTracker::new(NODE);
    let node = NodeTopology::new(NODE);
    svcs.update(&svc(
        "s",
        json!([{"name": "a", "port": 80}, {"name": "b", "port": 81}]),
    ));
    svcs.update(&svc("t", json!([{"name": "a", "port": 80}])));
    svcs.apply();
    let mut state = DesiredState::rebuild(&svcs, &eps, &node);
    assert_eq!(state.services.len(), 3);

    // Endpoints for port "a" only: port "b" of the same service is untouched.
    eps.update(&slice("s-1", "s", &["10.0.0.1"]));
    let changed = eps.apply();
    let touched = state.update_services(&changed, &svcs, &eps, &node);
    assert_eq!(touched, [spn("s", "a")].into());
    assert_eq!(state.services[&spn("s", "a")].cluster_endpoints.len(), 1);

    // Removing a port reports it; the remaining port is unchanged.
    svcs.update(&svc("s", json!([{"name": "a", "port": 80}])));
    let changed = svcs.apply();
    let touched = state.update_services(&changed, &svcs, &eps, &node);
    assert_eq!(touched, [spn("s", "b")].into());
    assert!(!state.services.contains_key(&spn("s", "b")));

    // Deleting the service removes its ports and leaves "t" alone.
    svcs.delete(&nn("s"));
    let touched = state.update_services(&svcs.apply(), &svcs, &eps, &node);
    assert_eq!(touched, [spn("s", "a")].into());
    assert_eq!(
        state.services.keys().cloned().collect::<Vec<_>>(),
        [spn("t", "a")]
    );
    assert_eq!(
        state,
        DesiredState::rebuild(&svcs, &eps, &node),
        "partial updates agree with a rebuild"
    );
}
