//! The API source against a scripted fake API server (kube's tower-test mock
//! pattern), fed JSON as a real apiserver sends it: lists with
//! metadata.resourceVersion, watch ADDED/MODIFIED/DELETED/BOOKMARK lines, and an
//! ERROR event carrying a 410 Status that forces a relist.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use http::{Request, Response};
use kube::{Client, client::Body};
use proxy_agent::{
    model::{NamespacedName, Protocol, ServicePortName},
    sources::SourceEvent,
    sources::api as watch,
    sync::{Proxier, SourceState, SyncChanges, Syncer},
};
use serde_json::{Value, json};
use tower_test::mock;

const NODE: &str = "node-a";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Res {
    Services,
    Slices,
    Nodes,
    ServiceCidrs,
}

/// One scripted answer: what the request must look like, and the response.
struct Step {
    watch: bool,
    /// Expected `resourceVersion` query parameter of a watch.
    rv: Option<&'static str>,
    status: u16,
    body: String,
}

fn list(kind: &str, api_version: &str, rv: &str, items: Vec<Value>) -> Step {
    let body = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv}, "items": items});
    Step {
        watch: false,
        rv: None,
        status: 200,
        body: body.to_string(),
    }
}

fn watch_lines(rv: &'static str, events: Vec<Value>) -> Step {
    let body = events.iter().map(|e| e.to_string() + "\n").collect();
    Step {
        watch: true,
        rv: Some(rv),
        status: 200,
        body,
    }
}

/// A watch from `rv` answered as an apiserver that is going away does (or a
/// load balancer in front of a dead one).
fn unavailable(rv: &'static str) -> Step {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server is currently unable to handle the request", "reason": "ServiceUnavailable", "code": 503});
    Step {
        watch: true,
        rv: Some(rv),
        status: 503,
        body: body.to_string(),
    }
}

fn ev(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn gone(rv: &str) -> Value {
    ev(
        "ERROR",
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv} (150)"), "reason": "Expired", "code": 410}),
    )
}

fn service(name: &str, rv: &str, port: i32) -> Value {
    json!({"kind": "Service", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": rv},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}]},
        "status": {"loadBalancer": {}}})
}

fn endpoint_slice(name: &str, service: &str, rv: &str, ip: &str) -> Value {
    json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "generateName": format!("{service}-"),
            "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": format!("uid-{service}")}]},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": "node-b", "zone": "z1", "targetRef": {"kind": "Pod", "namespace": "ns", "name": "pod"}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn node(rv: &str, zone: &str) -> Value {
    json!({"kind": "Node", "apiVersion": "v1",
        "metadata": {"name": NODE, "resourceVersion": rv,
            "labels": {"kubernetes.io/hostname": NODE, "topology.kubernetes.io/zone": zone}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.10"}]}})
}

/// A ServiceCIDR as the API server sends it (cluster-scoped, with its Ready condition).
fn service_cidr(name: &str, rv: &str, cidrs: &[&str]) -> Value {
    json!({"kind": "ServiceCIDR", "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": name, "resourceVersion": rv, "uid": format!("uid-{name}"),
            "finalizers": ["networking.k8s.io/service-cidr-finalizer"]},
        "spec": {"cidrs": cidrs},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
            "message": "Kubernetes Service CIDR is ready", "lastTransitionTime": "2026-11-23T10:00:00Z"}]}})
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() + 1 {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn query(req: &Request<Body>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Serves scripted steps per resource, in order; requests past the end of a
/// script are held open forever, like an idle watch. Mismatches are recorded.
fn fake_apiserver(scripts: Vec<(Res, Vec<Step>)>) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (client, errors, _) = timed_fake_apiserver(scripts);
    (client, errors)
}

/// [`fake_apiserver`], also recording when each resource was asked for.
fn timed_fake_apiserver(
    scripts: Vec<(Res, Vec<Step>)>,
) -> (Client, Arc<Mutex<Vec<String>>>, Requests) {
    let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let errs = errors.clone();
    let requests = Requests::default();
    let seen = requests.clone();
    let mut scripts: BTreeMap<Res, VecDeque<Step>> =
        scripts.into_iter().map(|(r, s)| (r, s.into())).collect();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let res = match req.uri().path() {
                "/api/v1/services" => Res::Services,
                "/apis/discovery.k8s.io/v1/endpointslices" => Res::Slices,
                "/api/v1/nodes" => Res::Nodes,
                "/apis/networking.k8s.io/v1/servicecidrs" => Res::ServiceCidrs,
                other => {
                    errs.lock()
                        .unwrap()
                        .push(format!("unexpected path {other}"));
                    continue;
                }
            };
            let q = query(&req);
            let selector_ok = match res {
                Res::Services | Res::Slices => {
                    q.get("labelSelector").map(String::as_str)
                        == Some(
                            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
                        )
                }
                Res::Nodes => {
                    q.get("fieldSelector").map(String::as_str) == Some("metadata.name=node-a")
                }
                Res::ServiceCidrs => {
                    !q.contains_key("labelSelector") && !q.contains_key("fieldSelector")
                }
            };
            if !selector_ok {
                errs.lock()
                    .unwrap()
                    .push(format!("{res:?}: bad selector in {}", req.uri()));
            }
            seen.0
                .lock()
                .unwrap()
                .push((res, tokio::time::Instant::now()));
            let Some(step) = scripts.get_mut(&res).and_then(VecDeque::pop_front) else {
                held.push(send);
                continue;
            };
            let is_watch = q.get("watch").map(String::as_str) == Some("true");
            if is_watch != step.watch
                || (step.watch && q.get("resourceVersion").map(String::as_str) != step.rv)
            {
                errs.lock().unwrap().push(format!(
                    "{res:?}: expected watch={} rv={:?}, got {}",
                    step.watch,
                    step.rv,
                    req.uri()
                ));
            }
            send.send_response(
                Response::builder()
                    .status(step.status)
                    .body(Body::from(step.body.into_bytes()))
                    .unwrap(),
            );
        }
    });
    (Client::new(svc, "default"), errors, requests)
}

/// When each resource was requested (paused tokio time).
#[derive(Clone, Default)]
struct Requests(Arc<Mutex<Vec<(Res, tokio::time::Instant)>>>);

impl Requests {
    fn of(&self, res: Res) -> Vec<tokio::time::Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| *r == res)
            .map(|(_, t)| *t)
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unused")]
struct Never;

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<SyncChanges>>>);

impl Proxier for Recorder {
    type Error = Never;
    fn sync(
        &mut self,
        _: &proxy_agent::model::DesiredState,
        changes: &SyncChanges,
    ) -> Result<(), Never> {
        self.0.lock().unwrap().push(changes.clone());
        Ok(())
    }
}

fn describe(e: &SourceEvent) -> String {
    match e {
        SourceEvent::ServiceApplied(s) => {
            format!(
                "svc+ {} port {}",
                s.metadata.name.as_deref().unwrap(),
                s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port
            )
        }
        SourceEvent::ServiceDeleted(nn) => format!("svc- {}", nn.name),
        SourceEvent::ServicesSynced => "svc synced".into(),
        SourceEvent::SliceApplied(s) => format!(
            "slice+ {} -> {}",
            s.metadata.name.as_deref().unwrap(),
            s.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"]
        ),
        SourceEvent::SliceDeleted(nn) => format!("slice- {}", nn.name),
        SourceEvent::SlicesSynced => "slices synced".into(),
        SourceEvent::NodeApplied(n) => format!(
            "node {}",
            n.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"]
        ),
        SourceEvent::NodeDeleted => "node-".into(),
        SourceEvent::HostChanged(_) => "host".into(),
        SourceEvent::ServiceCidrApplied(c) => format!(
            "cidr+ {} {:?}",
            c.metadata.name.as_deref().unwrap(),
            c.spec.as_ref().unwrap().cidrs.as_ref().unwrap()
        ),
        SourceEvent::ServiceCidrDeleted(name) => format!("cidr- {name}"),
    }
}

/// Collects events until the stream has been quiet for a minute of paused time.
async fn drain(
    stream: &mut (impl futures::Stream<Item = SourceEvent> + Unpin),
) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
        out.push(e);
    }
    out
}

fn of(events: &[SourceEvent], prefix: &str) -> Vec<String> {
    events
        .iter()
        .map(describe)
        .filter(|d| d.starts_with(prefix))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn lists_watches_bookmark_410_relist_slice_move_and_node_labels() {
    let scripts = vec![
        (
            Res::Services,
            vec![
                list(
                    "ServiceList",
                    "v1",
                    "100",
                    vec![service("a", "10", 80), service("b", "11", 80)],
                ),
                watch_lines(
                    "100",
                    vec![
                        ev("ADDED", service("c", "101", 80)),
                        ev("MODIFIED", service("a", "102", 8080)),
                        ev(
                            "BOOKMARK",
                            json!({"kind": "Service", "apiVersion": "v1", "metadata": {"resourceVersion": "105"}}),
                        ),
                    ],
                ),
                // Resumes from the bookmark's resourceVersion.
                watch_lines("105", vec![ev("DELETED", service("b", "106", 80))]),
                watch_lines("106", vec![gone("106")]),
                // Relist after 410: "c" vanished while we were not watching.
                list(
                    "ServiceList",
                    "v1",
                    "200",
                    vec![service("a", "102", 8080), service("d", "150", 80)],
                ),
            ],
        ),
        (
            Res::Slices,
            vec![
                list(
                    "EndpointSliceList",
                    "discovery.k8s.io/v1",
                    "300",
                    vec![
                        endpoint_slice("a-1", "a", "30", "10.0.0.1"),
                        endpoint_slice("b-1", "b", "31", "10.0.0.2"),
                    ],
                ),
                watch_lines(
                    "300",
                    vec![
                        ev("MODIFIED", endpoint_slice("a-1", "d", "301", "10.0.0.1")),
                        ev("ADDED", endpoint_slice("a-2", "a", "302", "10.0.0.3")),
                        ev("DELETED", endpoint_slice("b-1", "b", "303", "10.0.0.2")),
                    ],
                ),
            ],
        ),
        (
            Res::Nodes,
            vec![
                list("NodeList", "v1", "500", vec![node("50", "z1")]),
                watch_lines("500", vec![ev("MODIFIED", node("501", "z2"))]),
            ],
        ),
    ];
    let (client, errors) = fake_apiserver(scripts);
    let mut stream = Box::pin(watch::events(client, NODE));
    let events = drain(&mut stream).await;
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:#?}",
        errors.lock().unwrap()
    );

    assert_eq!(
        of(&events, "svc"),
        [
            "svc+ a port 80",
            "svc+ b port 80",
            "svc synced",
            "svc+ c port 80",
            "svc+ a port 8080",
            "svc- b",
            "svc+ a port 8080",
            "svc+ d port 80",
            "svc- c",
            "svc synced",
        ]
    );
    assert_eq!(
        of(&events, "slice"),
        [
            "slice+ a-1 -> a",
            "slice+ b-1 -> b",
            "slices synced",
            "slice+ a-1 -> d",
            "slice+ a-2 -> a",
            "slice- b-1",
        ]
    );
    assert_eq!(of(&events, "node"), ["node z1", "node z2"]);

    // The same events through the engine: final state and what asked for syncs.
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let rec = Recorder::default();
    let mut syncer = Syncer::new(source.clone(), rec.clone(), Duration::from_secs(3600));
    let mut wants = Vec::new();
    for e in events {
        let d = describe(&e);
        let want = source.lock().unwrap().handle(e);
        wants.push((d, want));
    }
    assert!(
        wants.iter().any(|(d, w)| d == "node z2" && *w),
        "zone change asks for a sync: {wants:?}"
    );
    syncer.sync().unwrap();
    let spn = |n: &str| ServicePortName {
        namespace: "ns".into(),
        name: n.into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    };
    let desired = syncer.desired();
    assert_eq!(
        desired.services.keys().cloned().collect::<Vec<_>>(),
        [spn("a"), spn("d")]
    );
    let ips = |n: &str| {
        desired.services[&spn(n)]
            .cluster_endpoints
            .iter()
            .map(|e| e.ip.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(desired.services[&spn("a")].port, 8080);
    assert_eq!(ips("a"), ["10.0.0.3"], "a-1 moved to d");
    assert_eq!(ips("d"), ["10.0.0.1"]);
    assert_eq!(rec.0.lock().unwrap().len(), 1);
    let _ = NamespacedName::new("ns", "unused");
}

#[tokio::test(start_paused = true)]
async fn nothing_is_synced_while_endpoint_slices_are_not_listed() {
    // Services list fine; the EndpointSlice list never answers.
    let scripts = vec![(
        Res::Services,
        vec![list("ServiceList", "v1", "1", vec![service("a", "1", 80)])],
    )];
    let (client, errors) = fake_apiserver(scripts);
    let mut stream = Box::pin(watch::events(client, NODE));
    let events = drain(&mut stream).await;
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:#?}",
        errors.lock().unwrap()
    );
    assert_eq!(
        events.iter().map(describe).collect::<Vec<_>>(),
        ["svc+ a port 80", "svc synced"]
    );
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let rec = Recorder::default();
    let mut syncer = Syncer::new(source.clone(), rec.clone(), Duration::from_secs(3600));
    for e in events {
        assert!(!source.lock().unwrap().handle(e));
    }
    syncer.sync().unwrap();
    assert!(rec.0.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn service_cidrs_are_listed_and_watched_and_replace_the_configured_ones() {
    let scripts = vec![
        (
            Res::Services,
            vec![list("ServiceList", "v1", "1", vec![service("a", "1", 80)])],
        ),
        (
            Res::Slices,
            vec![list(
                "EndpointSliceList",
                "discovery.k8s.io/v1",
                "1",
                vec![],
            )],
        ),
        (
            Res::ServiceCidrs,
            vec![
                list(
                    "ServiceCIDRList",
                    "networking.k8s.io/v1",
                    "7",
                    vec![service_cidr(
                        "kubernetes",
                        "5",
                        &["198.19.0.0/16", "2001:db8:ffff::/108"],
                    )],
                ),
                watch_lines(
                    "7",
                    vec![
                        ev("ADDED", service_cidr("extra", "8", &["198.18.128.0/24"])),
                        ev(
                            "DELETED",
                            service_cidr(
                                "kubernetes",
                                "9",
                                &["198.19.0.0/16", "2001:db8:ffff::/108"],
                            ),
                        ),
                    ],
                ),
            ],
        ),
    ];
    let (client, errors) = fake_apiserver(scripts);
    let mut stream = Box::pin(watch::events(client, NODE));
    let events = drain(&mut stream).await;
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:#?}",
        errors.lock().unwrap()
    );
    assert_eq!(
        of(&events, "cidr"),
        [
            "cidr+ kubernetes [\"198.19.0.0/16\", \"2001:db8:ffff::/108\"]",
            "cidr+ extra [\"198.18.128.0/24\"]",
            "cidr- kubernetes",
        ]
    );
    let configured = vec!["198.19.0.0/20".parse().unwrap()];
    let mut state = SourceState::new(NODE).with_configured_service_cidrs(configured);
    let cidrs = |s: &SourceState| -> Vec<String> {
        s.service_cidrs().iter().map(|c| c.to_string()).collect()
    };
    assert_eq!(
        cidrs(&state),
        ["198.19.0.0/20"],
        "the configured, while none is listed"
    );
    // Services and EndpointSlices first: before both are listed nothing syncs.
    let (cidr_events, rest): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|e| describe(e).starts_with("cidr"));
    for e in rest {
        state.handle(e);
    }
    assert!(state.is_initialized());
    let mut seen = Vec::new();
    for e in cidr_events {
        assert!(state.handle(e), "a service CIDR change asks for a sync");
        seen.push(cidrs(&state));
    }
    assert_eq!(
        seen,
        [
            vec!["198.19.0.0/16", "2001:db8:ffff::/108"],
            vec!["198.18.128.0/24", "198.19.0.0/16", "2001:db8:ffff::/108"],
            vec!["198.18.128.0/24"],
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cluster_without_the_service_cidr_api_keeps_the_configured_ones() {
    let not_found = Step {
        watch: false,
        rv: None,
        status: 404,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server could not find the requested resource", "reason": "NotFound",
            "details": {}, "code": 404})
        .to_string(),
    };
    let scripts = vec![
        (
            Res::Services,
            vec![list("ServiceList", "v1", "1", vec![service("a", "1", 80)])],
        ),
        (
            Res::Slices,
            vec![list(
                "EndpointSliceList",
                "discovery.k8s.io/v1",
                "1",
                vec![],
            )],
        ),
        (Res::ServiceCidrs, vec![not_found]),
    ];
    let (client, errors) = fake_apiserver(scripts);
    let mut stream = Box::pin(watch::events(client, NODE));
    let events = drain(&mut stream).await;
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:#?}",
        errors.lock().unwrap()
    );
    assert!(of(&events, "cidr").is_empty());
    let configured = vec!["198.19.0.0/16".parse().unwrap()];
    let mut state = SourceState::new(NODE).with_configured_service_cidrs(configured);
    let mut synced = false;
    for e in events {
        synced |= state.handle(e);
    }
    assert!(synced, "Services and EndpointSlices still sync");
    assert_eq!(
        state
            .service_cidrs()
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        ["198.19.0.0/16"]
    );
}

#[test]
fn node_name_is_the_override_or_hostname_lower_cased() {
    assert_eq!(
        watch::node_name(Some(" Node-A.Example ")).unwrap(),
        "node-a.example"
    );
    let host = watch::node_name(None).unwrap();
    assert!(!host.is_empty());
    assert_eq!(host, host.to_lowercase());
    assert_eq!(
        watch::node_name(Some("")).unwrap(),
        host,
        "an empty override falls back to the hostname"
    );
}

/// What the proxier was asked to program: service name -> endpoint IPs.
type Programmed = BTreeMap<String, Vec<String>>;

#[derive(Clone, Default)]
struct StateRecorder(Arc<Mutex<Vec<Programmed>>>);

impl Proxier for StateRecorder {
    type Error = Never;
    fn sync(
        &mut self,
        desired: &proxy_agent::model::DesiredState,
        _: &SyncChanges,
    ) -> Result<(), Never> {
        let programmed = desired
            .services
            .iter()
            .map(|(spn, svc)| {
                let ips = svc
                    .cluster_endpoints
                    .iter()
                    .map(|e| e.ip.to_string())
                    .collect();
                (spn.name.to_string(), ips)
            })
            .collect();
        self.0.lock().unwrap().push(programmed);
        Ok(())
    }
}

/// A `tracing` writer into a shared buffer, to read what the agent logged.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn an_api_server_outage_leaves_the_datapath_as_it_was_and_it_converges_after() {
    const OUTAGE: usize = 8;
    let mut services = vec![
        list("ServiceList", "v1", "1", vec![service("a", "1", 80)]),
        watch_lines("1", vec![]),
    ];
    services.extend((0..OUTAGE).map(|_| unavailable("1")));
    services.extend([
        watch_lines("1", vec![gone("1")]),
        list(
            "ServiceList",
            "v1",
            "9",
            vec![service("a", "1", 80), service("b", "8", 80)],
        ),
    ]);
    let mut slices = vec![
        list(
            "EndpointSliceList",
            "discovery.k8s.io/v1",
            "1",
            vec![endpoint_slice("a-1", "a", "1", "10.0.0.1")],
        ),
        watch_lines("1", vec![]),
    ];
    slices.extend((0..OUTAGE).map(|_| unavailable("1")));
    slices.extend([
        watch_lines("1", vec![gone("1")]),
        list(
            "EndpointSliceList",
            "discovery.k8s.io/v1",
            "9",
            vec![
                endpoint_slice("a-1", "a", "7", "10.0.0.5"),
                endpoint_slice("b-1", "b", "8", "10.0.0.2"),
            ],
        ),
    ]);
    let scripts = vec![
        (Res::Services, services),
        (Res::Slices, slices),
        (
            Res::Nodes,
            vec![list("NodeList", "v1", "1", vec![node("1", "z1")])],
        ),
    ];
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    );
    let (client, errors, requests) = timed_fake_apiserver(scripts);
    let rec = StateRecorder::default();
    let timing = proxy_agent::sync::SyncTiming {
        min_sync_period: Duration::from_secs(1),
        sync_period: Duration::from_secs(30),
        ..Default::default()
    };
    proxy_agent::sync::run(
        watch::events(client, NODE),
        SourceState::new(NODE),
        rec.clone(),
        timing,
        tokio::time::sleep(Duration::from_secs(600)),
    )
    .await
    .unwrap();
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:#?}",
        errors.lock().unwrap()
    );

    let synced = rec.0.lock().unwrap().clone();
    let before: Programmed = [("a".to_string(), vec!["10.0.0.1".to_string()])].into();
    let after: Programmed = [
        ("a".to_string(), vec!["10.0.0.5".to_string()]),
        ("b".to_string(), vec!["10.0.0.2".to_string()]),
    ]
    .into();
    assert_eq!(synced.first(), Some(&before));
    assert_eq!(synced.last(), Some(&after), "converged after the outage");
    // Every sync in between (periodic resyncs during the outage, the relist
    // arriving piece by piece) kept "a" with an endpoint: nothing was blanked.
    for state in &synced {
        assert!(
            state.get("a").is_some_and(|ips| !ips.is_empty()),
            "a sync blanked service a: {synced:#?}"
        );
    }
    assert!(
        synced.len() > 3,
        "periodic syncs ran during the outage: {synced:?}"
    );

    // The watches were retried with a growing backoff, for minutes, and the log says so.
    for res in [Res::Services, Res::Slices] {
        let times = requests.of(res);
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let outage: Duration = gaps.iter().sum();
        assert!(outage > Duration::from_secs(60), "{res:?}: {gaps:?}");
        let retries = &gaps[2..2 + OUTAGE - 1];
        assert!(
            retries.last() > retries.first(),
            "{res:?}: the backoff grows: {gaps:?}"
        );
    }
    let log = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warned = log.matches("watch failed; retrying with backoff").count();
    assert!(warned >= 2 * OUTAGE, "{warned} warnings:\n{log}");
}
