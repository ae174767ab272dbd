//! Warning events reach the API server as kube-proxy sends them: an
//! events.k8s.io/v1 Event in the object's namespace, reported by
//! `kube-proxy` on this node, regarding the Service (or this Node, whose
//! UID upstream sets to its name). A mock API server receives the request.

use std::time::Duration;

use http::{Request, Response};
use kube::{Client, client::Body};
use proxy_agent::{
    events::{ApiEvents, EventRecorder, Regarding},
    model::NamespacedName,
};
use serde_json::{Value, json};
use tower_test::mock;

/// The path and JSON body of the first request the recorder sends.
async fn first_request(send: impl FnOnce(&ApiEvents)) -> (String, Value) {
    let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let events = ApiEvents::new(Client::new(svc, "default"), "node-a");
    send(&events);
    let (req, respond) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("the event is sent")
        .expect("a request");
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    respond.send_response(
        Response::builder()
            .status(201)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    assert_eq!(method, http::Method::POST);
    (path, body)
}

#[tokio::test]
async fn a_service_health_check_failure_is_a_warning_event_on_the_service() {
    let (path, body) = first_request(|events| {
        events.warning(
            Regarding::Service(NamespacedName::new("ns1", "svc1")),
            "FailedToStartServiceHealthcheck",
            "Listen",
            "node node-a failed to start healthcheck \"ns1/svc1\" on port 30000: address in use",
        )
    })
    .await;
    assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/ns1/events");
    assert_eq!(body["type"], "Warning");
    assert_eq!(body["reason"], "FailedToStartServiceHealthcheck");
    assert_eq!(body["action"], "Listen");
    assert_eq!(
        body["note"],
        "node node-a failed to start healthcheck \"ns1/svc1\" on port 30000: address in use"
    );
    assert_eq!(body["reportingController"], "kube-proxy");
    assert_eq!(body["reportingInstance"], "node-a");
    assert_eq!(
        body["regarding"],
        json!({"apiVersion": "v1", "kind": "Service", "namespace": "ns1", "name": "svc1"})
    );
}

#[tokio::test]
async fn a_health_server_that_cannot_listen_is_a_warning_event_on_the_node() {
    let (path, body) = first_request(|events| {
        events.warning(
            Regarding::ThisNode,
            "FailedToStartProxierHealthcheck",
            "StartKubeProxy",
            "failed to start proxy health server on 0.0.0.0:10256: address in use",
        )
    })
    .await;
    // A cluster-scoped object's events go to "default".
    assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/default/events");
    assert_eq!(body["reason"], "FailedToStartProxierHealthcheck");
    assert_eq!(
        body["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"})
    );
}
