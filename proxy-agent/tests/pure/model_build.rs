//! Service + EndpointSlice JSON (as the API serves it) -> desired state.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::model::{
    DesiredService, DesiredState, IpFamily, NodeTopology, Protocol, ServicePortName,
    SessionAffinity, build_desired_state, build_desired_state_for,
};
use serde_json::{Value, json};

const NODE: &str = "node-a";

fn svc(name: &str, spec: Value) -> Service {
    svc_with(name, spec, json!({}))
}

fn svc_with(name: &str, spec: Value, status: Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, family: &str, ports: Value, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "addressType": family, "ports": ports, "endpoints": endpoints,
    }))
    .unwrap()
}

fn ep(ip: &str, node: &str) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": node})
}

fn spn(name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: name.into(),
        port_name: port.into(),
        protocol,
    }
}

fn get<'a>(
    state: &'a DesiredState,
    name: &str,
    port: &str,
    protocol: Protocol,
) -> &'a DesiredService {
    state
        .services
        .get(&spn(name, port, protocol))
        .unwrap_or_else(|| panic!("{name}:{port} missing: {state:#?}"))
}

fn addrs(eps: &[proxy_agent::model::Endpoint]) -> Vec<String> {
    eps.iter().map(ToString::to_string).collect()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn cluster_ip_nodeport_externalips_lb_affinity_and_source_ranges() {
    let s = svc_with(
        "web",
        json!({
            "type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}],
            "externalIPs": ["203.0.113.9", "2001:db8::9"],
            "loadBalancerSourceRanges": [" 192.0.2.0/24 ", "2001:db8::/64"],
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
        }),
        json!({"loadBalancer": {"ingress": [
            {"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "Proxy"}, {"ip": "198.51.100.3", "ipMode": "VIP"},
            {"hostname": "lb.example.com"}
        ]}}),
    );
    let sl = slice(
        "web-1",
        "web",
        "IPv4",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        json!([ep("10.0.1.1", NODE), ep("10.0.2.1", "node-b")]),
    );
    let state = build_desired_state(&[s], &[sl], NODE);
    let d = get(&state, "web", "http", Protocol::Tcp);
    assert_eq!(d.cluster_ips, ips(&["10.96.0.10"]));
    assert_eq!(d.port, 80);
    assert_eq!(d.node_port, Some(30080));
    // v6 external IP and source range dropped: the service has no v6 cluster IP.
    assert_eq!(d.external_ips, ips(&["203.0.113.9"]));
    assert_eq!(d.load_balancer_ips, ips(&["198.51.100.1", "198.51.100.3"]));
    assert_eq!(
        d.load_balancer_source_ranges,
        vec!["192.0.2.0/24".parse::<ipnet::IpNet>().unwrap()]
    );
    assert_eq!(
        d.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 60
        }
    );
    assert!(d.external_policy_local && !d.internal_policy_local);
    assert_eq!(d.health_check_node_port, Some(32000));
    assert_eq!(
        addrs(&d.cluster_endpoints),
        ["10.0.1.1:8080", "10.0.2.1:8080"]
    );
    assert_eq!(addrs(&d.local_endpoints), ["10.0.1.1:8080"]);
    assert_eq!(addrs(d.external_endpoints()), ["10.0.1.1:8080"]);
    assert_eq!(
        addrs(d.internal_endpoints()),
        ["10.0.1.1:8080", "10.0.2.1:8080"]
    );
}

#[test]
fn affinity_default_timeout_and_no_health_check_for_nodeport_or_cluster_policy() {
    let np = svc(
        "np",
        json!({"type": "NodePort", "clusterIP": "10.96.0.11", "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 32001, "sessionAffinity": "ClientIP",
        "ports": [{"port": 80, "nodePort": 30001}]}),
    );
    let lb = svc(
        "lb",
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.12", "externalTrafficPolicy": "Cluster",
        "ports": [{"port": 80, "nodePort": 30002}]}),
    );
    let ci = svc(
        "ci",
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.13", "externalTrafficPolicy": "Local",
        "ports": [{"port": 80}]}),
    );
    let state = build_desired_state(&[np, lb, ci], &[], NODE);
    let np = get(&state, "np", "", Protocol::Tcp);
    assert_eq!(
        np.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 10_800
        }
    );
    assert!(np.external_policy_local);
    assert_eq!(
        np.health_check_node_port, None,
        "health checks are for LoadBalancer services only"
    );
    assert!(!get(&state, "lb", "", Protocol::Tcp).external_policy_local);
    assert!(
        !get(&state, "ci", "", Protocol::Tcp).external_policy_local,
        "eTP only applies to NodePort/LB"
    );
}

#[test]
fn externalname_headless_and_ipless_services_get_nothing() {
    let services = [
        svc(
            "ext",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.0.20", "ports": [{"port": 80}]}),
        ),
        svc(
            "headless",
            json!({"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 80}]}),
        ),
        svc("pending", json!({"ports": [{"port": 80}]})),
        svc(
            "ok",
            json!({"clusterIP": "10.96.0.21", "ports": [{"port": 80}]}),
        ),
    ];
    let slices = [slice(
        "headless-1",
        "headless",
        "IPv4",
        json!([{"name": "", "port": 80}]),
        json!([ep("10.0.0.1", NODE)]),
    )];
    let state = build_desired_state(&services, &slices, NODE);
    let names: Vec<&str> = state.services.keys().map(|k| &*k.name).collect();
    assert_eq!(names, ["ok"]);
}

#[test]
fn protocols_and_same_port_number_on_tcp_udp_sctp() {
    let s = svc(
        "dns",
        json!({"clusterIP": "10.96.0.30", "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "sig", "port": 53, "protocol": "SCTP"},
        ]}),
    );
    let sl = slice(
        "dns-1",
        "dns",
        "IPv4",
        json!([
            {"name": "dns", "port": 5353, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 5354, "protocol": "TCP"},
            {"name": "sig", "port": 5355, "protocol": "SCTP"},
        ]),
        json!([ep("10.0.0.5", NODE)]),
    );
    let state = build_desired_state(&[s], &[sl], NODE);
    assert_eq!(
        addrs(&get(&state, "dns", "dns", Protocol::Udp).cluster_endpoints),
        ["10.0.0.5:5353"]
    );
    assert_eq!(
        addrs(&get(&state, "dns", "dns-tcp", Protocol::Tcp).cluster_endpoints),
        ["10.0.0.5:5354"]
    );
    assert_eq!(
        addrs(&get(&state, "dns", "sig", Protocol::Sctp).cluster_endpoints),
        ["10.0.0.5:5355"]
    );
}

#[test]
fn named_target_port_resolves_per_slice_and_duplicates_merge_local_first() {
    let s = svc(
        "api",
        json!({"clusterIP": "10.96.0.40", "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}),
    );
    let a = slice(
        "api-a",
        "api",
        "IPv4",
        json!([{"name": "http", "port": 8080}]),
        json!([ep("10.0.0.1", "node-b"), ep("10.0.0.2", "node-b")]),
    );
    let b = slice(
        "api-b",
        "api",
        "IPv4",
        json!([{"name": "http", "port": 9090}]),
        json!([ep("10.0.0.3", "node-b")]),
    );
    // Same endpoint during a move between slices, the second copy claiming to be local.
    let c = slice(
        "api-c",
        "api",
        "IPv4",
        json!([{"name": "http", "port": 8080}]),
        json!([ep("10.0.0.2", NODE)]),
    );
    let state = build_desired_state(&[s], &[a, b, c], NODE);
    let d = get(&state, "api", "http", Protocol::Tcp);
    assert_eq!(
        addrs(&d.cluster_endpoints),
        ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:9090"]
    );
    assert!(
        d.cluster_endpoints[1].is_local,
        "a local copy wins when merging duplicates"
    );
}

#[test]
fn conditions_fallback_and_publish_not_ready_addresses() {
    let eps = json!([
        {"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}, "nodeName": "node-b"},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false, "terminating": true}, "nodeName": "node-b"},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": false}, "nodeName": "node-b"},
    ]);
    let port = json!([{"name": "", "port": 80}]);
    let services = [
        svc(
            "plain",
            json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]}),
        ),
        svc(
            "pnra",
            json!({"clusterIP": "10.96.0.51", "publishNotReadyAddresses": true, "ports": [{"port": 80}]}),
        ),
    ];
    let slices = [
        slice("plain-1", "plain", "IPv4", port.clone(), eps.clone()),
        slice("pnra-1", "pnra", "IPv4", port, eps),
    ];
    let state = build_desired_state(&services, &slices, NODE);
    let plain = get(&state, "plain", "", Protocol::Tcp);
    assert_eq!(
        addrs(&plain.cluster_endpoints),
        ["10.0.0.1:80"],
        "only serving-terminating as fallback"
    );
    assert!(plain.has_any_endpoints.v4);
    assert_eq!(
        addrs(&get(&state, "pnra", "", Protocol::Tcp).cluster_endpoints),
        ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    );
}

#[test]
fn no_conditions_means_ready_and_missing_endpoints_reject() {
    let services = [
        svc(
            "bare",
            json!({"clusterIP": "10.96.0.60", "ports": [{"port": 80}]}),
        ),
        svc(
            "empty",
            json!({"clusterIP": "10.96.0.61", "ports": [{"port": 80}]}),
        ),
    ];
    let slices = [
        slice(
            "bare-1",
            "bare",
            "IPv4",
            json!([{"name": "", "port": 80}]),
            json!([{"addresses": ["10.0.0.9"]}]),
        ),
        slice(
            "empty-1",
            "empty",
            "IPv4",
            json!([{"name": "", "port": 80}]),
            json!([]),
        ),
        slice(
            "fqdn-1",
            "bare",
            "FQDN",
            json!([{"name": "", "port": 80}]),
            json!([{"addresses": ["db.example.com"]}]),
        ),
    ];
    let state = build_desired_state(&services, &slices, NODE);
    assert_eq!(
        addrs(&get(&state, "bare", "", Protocol::Tcp).cluster_endpoints),
        ["10.0.0.9:80"]
    );
    let empty = get(&state, "empty", "", Protocol::Tcp);
    assert!(empty.cluster_endpoints.is_empty());
    assert!(!empty.has_any_endpoints.contains(IpFamily::V4));
}

#[test]
fn dual_stack_keeps_both_families_and_categorises_each() {
    let s = svc(
        "dual",
        json!({"clusterIP": "10.96.0.70", "clusterIPs": ["10.96.0.70", "fd00::70"],
        "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
        "externalIPs": ["203.0.113.7", "2001:db8::7"], "ports": [{"port": 80}]}),
    );
    let v4 = slice(
        "dual-v4",
        "dual",
        "IPv4",
        json!([{"name": "", "port": 80}]),
        json!([ep("10.0.0.7", NODE)]),
    );
    let v6 = slice(
        "dual-v6",
        "dual",
        "IPv6",
        json!([{"name": "", "port": 80}]),
        json!([
            {"addresses": ["fd00::7"], "conditions": {"ready": false, "serving": true, "terminating": true}}
        ]),
    );
    let state = build_desired_state(&[s], &[v4, v6], NODE);
    let d = get(&state, "dual", "", Protocol::Tcp);
    assert_eq!(d.cluster_ips, ips(&["10.96.0.70", "fd00::70"]));
    assert_eq!(d.external_ips, ips(&["203.0.113.7", "2001:db8::7"]));
    // v6 has no ready endpoint, so it falls back on its own; v4's ready one does not count there.
    assert_eq!(addrs(&d.cluster_endpoints), ["10.0.0.7:80", "[fd00::7]:80"]);
    assert!(d.has_any_endpoints.v4 && d.has_any_endpoints.v6);
}

#[test]
fn zone_hints_apply_with_node_zone_and_internal_traffic_policy_local() {
    let s = svc(
        "close",
        json!({"clusterIP": "10.96.0.80", "trafficDistribution": "PreferClose", "ports": [{"port": 80}]}),
    );
    let l = svc(
        "loc",
        json!({"clusterIP": "10.96.0.81", "internalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    );
    let hinted = |ip: &str, zone: &str| json!({"addresses": [ip], "conditions": {"ready": true}, "zone": zone, "nodeName": "node-b", "hints": {"forZones": [{"name": zone}]}});
    let slices = [
        slice(
            "close-1",
            "close",
            "IPv4",
            json!([{"name": "", "port": 80}]),
            json!([hinted("10.0.0.1", "a"), hinted("10.0.0.2", "b")]),
        ),
        slice(
            "loc-1",
            "loc",
            "IPv4",
            json!([{"name": "", "port": 80}]),
            json!([ep("10.0.0.3", NODE), ep("10.0.0.4", "node-b")]),
        ),
    ];
    let mut node = NodeTopology::new(NODE);
    node.labels
        .insert("topology.kubernetes.io/zone".into(), "b".into());
    let state = build_desired_state_for(&[s.clone(), l], &slices, &node);
    assert_eq!(
        addrs(&get(&state, "close", "", Protocol::Tcp).cluster_endpoints),
        ["10.0.0.2:80"]
    );
    let loc = get(&state, "loc", "", Protocol::Tcp);
    assert!(loc.cluster_endpoints.is_empty());
    assert_eq!(addrs(loc.internal_endpoints()), ["10.0.0.3:80"]);
    // Without a zone label the hints are ignored.
    let state = build_desired_state(&[s], &slices, NODE);
    assert_eq!(
        addrs(&get(&state, "close", "", Protocol::Tcp).cluster_endpoints),
        ["10.0.0.1:80", "10.0.0.2:80"]
    );
}

#[test]
fn a_udp_port_keeps_the_addresses_of_serving_endpoints_it_does_not_balance_to() {
    // Upstream's stale-flow cleanup keeps the UDP flows of every serving
    // endpoint: terminating ones passed over while others are ready, other
    // zones', other nodes' under a Local policy.
    let dns = svc(
        "dns",
        json!({"clusterIP": "10.96.0.53", "trafficDistribution": "PreferClose",
               "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
    );
    let tcp = svc(
        "dns-tcp",
        json!({"clusterIP": "10.96.0.54", "trafficDistribution": "PreferClose",
               "ports": [{"name": "dns", "port": 53, "protocol": "TCP"}]}),
    );
    let endpoints = json!([
        {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "zone": "b", "nodeName": "node-b", "hints": {"forZones": [{"name": "b"}]}},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": true}, "zone": "a", "nodeName": "node-c", "hints": {"forZones": [{"name": "a"}]}},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}, "zone": "b", "nodeName": "node-b"},
        {"addresses": ["10.0.0.4"], "conditions": {"ready": false, "serving": false, "terminating": true}, "zone": "b", "nodeName": "node-b"},
    ]);
    let slices = [
        slice(
            "dns-1",
            "dns",
            "IPv4",
            json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
            endpoints.clone(),
        ),
        slice(
            "dns-tcp-1",
            "dns-tcp",
            "IPv4",
            json!([{"name": "dns", "port": 53, "protocol": "TCP"}]),
            endpoints,
        ),
    ];
    let mut node = NodeTopology::new(NODE);
    node.labels
        .insert("topology.kubernetes.io/zone".into(), "b".into());
    let state = build_desired_state_for(&[dns, tcp], &slices, &node);
    let udp = get(&state, "dns", "dns", Protocol::Udp);
    assert_eq!(addrs(&udp.cluster_endpoints), ["10.0.0.1:53"]);
    assert_eq!(udp.other_serving_ips, ips(&["10.0.0.2", "10.0.0.3"]));
    assert_eq!(
        udp.udp_flow_keepers().into_iter().collect::<Vec<_>>(),
        ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    );
    // Only UDP flows outlive their endpoint's place in the sets.
    assert!(
        get(&state, "dns-tcp", "dns", Protocol::Tcp)
            .other_serving_ips
            .is_empty()
    );
}

#[test]
fn slices_without_service_label_or_for_unknown_ports_are_ignored() {
    let s = svc(
        "x",
        json!({"clusterIP": "10.96.0.90", "ports": [{"name": "a", "port": 80}]}),
    );
    let mut orphan = slice(
        "orphan",
        "x",
        "IPv4",
        json!([{"name": "a", "port": 80}]),
        json!([ep("10.0.0.1", NODE)]),
    );
    orphan.metadata.labels = None;
    let other_port = slice(
        "x-1",
        "x",
        "IPv4",
        json!([{"name": "b", "port": 81}]),
        json!([ep("10.0.0.2", NODE)]),
    );
    let state = build_desired_state(&[s], &[orphan, other_port], NODE);
    assert!(
        get(&state, "x", "a", Protocol::Tcp)
            .cluster_endpoints
            .is_empty()
    );
}

#[test]
fn the_lb_algorithm_annotation_chooses_maglev_or_random_and_other_values_are_ignored() {
    use proxy_agent::model::{BALANCING_ANNOTATION, Balancing};
    let spec = json!({
        "type": "ClusterIP", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
    });
    let sl = slice(
        "web-1",
        "web",
        "IPv4",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        json!([ep("10.0.1.1", NODE)]),
    );
    for (value, want) in [
        (Some("maglev"), Balancing::Maglev),
        (Some(" random "), Balancing::Random),
        (Some("round-robin"), Balancing::Configured),
        (None, Balancing::Configured),
    ] {
        let mut s = svc_with("web", spec.clone(), json!({}));
        if let Some(v) = value {
            s.metadata.annotations =
                Some([(BALANCING_ANNOTATION.to_string(), v.to_string())].into());
        }
        let state = build_desired_state(&[s], std::slice::from_ref(&sl), NODE);
        assert_eq!(
            get(&state, "web", "http", Protocol::Tcp).balancing,
            want,
            "{value:?}"
        );
    }
}
