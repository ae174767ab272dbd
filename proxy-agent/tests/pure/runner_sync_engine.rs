//! The sync engine: initial-sync gating, partial vs full syncs, failure
//! handling, node topology changes, and the driver under paused time.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Service};
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::{
    model::{DesiredState, NamespacedName, Protocol, ServicePortName},
    sources::SourceEvent,
    sync::{
        Proxier, SourceState, SyncChanges, SyncObserver, SyncOutcome, SyncReport, SyncTiming,
        Syncer, run,
    },
};
use serde_json::json;

const NODE: &str = "node-a";

#[derive(Debug, thiserror::Error)]
#[error("injected failure")]
struct Injected;

#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<(SyncChanges, usize)>>>,
    fail_next: Arc<Mutex<bool>>,
}

impl Proxier for Recorder {
    type Error = Injected;
    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Injected> {
        self.calls
            .lock()
            .unwrap()
            .push((changes.clone(), desired.services.len()));
        if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
            Err(Injected)
        } else {
            Ok(())
        }
    }
}

impl Recorder {
    fn calls(&self) -> Vec<(SyncChanges, usize)> {
        self.calls.lock().unwrap().clone()
    }
}

fn svc(name: &str, port: i32) -> SourceEvent {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": port}]},
    }))
    .unwrap();
    SourceEvent::ServiceApplied(Box::new(svc))
}

fn slice(name: &str, service: &str, ip: &str, zone_hint: Option<&str>) -> SourceEvent {
    let mut ep = json!({"addresses": [ip], "nodeName": "node-b"});
    if let Some(z) = zone_hint {
        ep["hints"] = json!({"forZones": [{"name": z}]});
    }
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"name": "", "port": 80}], "endpoints": [ep],
    }))
    .unwrap();
    SourceEvent::SliceApplied(Box::new(slice))
}

fn node(labels: serde_json::Value) -> SourceEvent {
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": NODE, "labels": labels}})).unwrap();
    SourceEvent::NodeApplied(Box::new(node))
}

fn spn(name: &str) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: name.into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
    }
}

fn setup() -> (Arc<Mutex<SourceState>>, Syncer<Recorder>, Recorder) {
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let rec = Recorder::default();
    let syncer = Syncer::new(source.clone(), rec.clone(), Duration::from_secs(3600));
    (source, syncer, rec)
}

fn feed(source: &Arc<Mutex<SourceState>>, event: SourceEvent) -> bool {
    source.lock().unwrap().handle(event)
}

fn partial(names: &[&str]) -> SyncChanges {
    SyncChanges {
        full: false,
        changed: names.iter().map(|n| spn(n)).collect(),
    }
}

fn full() -> SyncChanges {
    SyncChanges {
        full: true,
        changed: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_is_programmed_until_services_and_slices_were_listed() {
    let (source, mut syncer, rec) = setup();
    assert!(!feed(&source, svc("a", 80)));
    assert!(
        !feed(&source, SourceEvent::ServicesSynced),
        "slices not listed yet"
    );
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::NotInitialized);
    assert!(rec.calls().is_empty());
    assert!(
        feed(&source, SourceEvent::SlicesSynced),
        "becoming initialised asks for a sync"
    );
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(full()));
    assert_eq!(rec.calls(), [(full(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn partial_syncs_name_changed_ports_and_failure_makes_next_full() {
    let (source, mut syncer, rec) = setup();
    for e in [
        svc("a", 80),
        svc("b", 80),
        SourceEvent::ServicesSynced,
        SourceEvent::SlicesSynced,
    ] {
        feed(&source, e);
    }
    syncer.sync().unwrap();

    assert!(feed(&source, slice("a-1", "a", "10.0.0.1", None)));
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(partial(&["a"])));
    assert!(
        !feed(&source, slice("a-1", "a", "10.0.0.1", None)),
        "no-op update asks for nothing"
    );
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(partial(&[])));

    feed(
        &source,
        SourceEvent::ServiceDeleted(NamespacedName::new("ns", "b")),
    );
    *rec.fail_next.lock().unwrap() = true;
    let failure = syncer.sync().unwrap_err().to_string();
    assert_eq!(
        failure,
        "partial sync of 1 service ports failed: injected failure; the next sync will be full",
        "the runner logs this text alone: it carries the cause"
    );
    assert!(!syncer.desired().services.contains_key(&spn("b")));
    assert_eq!(
        syncer.sync().unwrap(),
        SyncOutcome::Synced(full()),
        "after a failure the next sync is full"
    );
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(partial(&[])));
}

/// Records, in order, the proxier's calls and the observer's reports.
#[derive(Clone, Default)]
struct Ordered {
    log: Arc<Mutex<Vec<&'static str>>>,
    fail_next: Arc<Mutex<bool>>,
}

impl Proxier for Ordered {
    type Error = Injected;
    fn sync(&mut self, _: &DesiredState, _: &SyncChanges) -> Result<(), Injected> {
        self.log.lock().unwrap().push("sync");
        match std::mem::take(&mut *self.fail_next.lock().unwrap()) {
            true => Err(Injected),
            false => Ok(()),
        }
    }
    fn after_sync(&mut self, _: &DesiredState, _: &SyncChanges) {
        self.log.lock().unwrap().push("after");
    }
}

impl SyncObserver for Ordered {
    fn synced(&self, report: &SyncReport<'_>) {
        let what = match report.succeeded {
            true => "reported",
            false => "reported failed",
        };
        self.log.lock().unwrap().push(what);
    }
}

/// A proxier's bookkeeping (`after_sync`) waits until the sync is reported
/// (the metrics' timestamp the start is timed by), and follows only a sync
/// that succeeded.
#[tokio::test(start_paused = true)]
async fn bookkeeping_follows_the_report_of_a_successful_sync() {
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let ordered = Ordered::default();
    let mut syncer = Syncer::new(source.clone(), ordered.clone(), Duration::from_secs(3600))
        .with_observer(Arc::new(ordered.clone()));
    for e in [
        svc("a", 80),
        SourceEvent::ServicesSynced,
        SourceEvent::SlicesSynced,
    ] {
        feed(&source, e);
    }
    syncer.sync().unwrap();
    *ordered.fail_next.lock().unwrap() = true;
    syncer.sync().unwrap_err();
    syncer.sync().unwrap();
    assert_eq!(
        *ordered.log.lock().unwrap(),
        [
            "sync",
            "reported",
            "after",
            "sync",
            "reported failed",
            "sync",
            "reported",
            "after"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn zone_label_change_triggers_full_sync_other_labels_do_not() {
    let (source, mut syncer, rec) = setup();
    for e in [
        svc("a", 80),
        slice("a-1", "a", "10.0.0.1", Some("z1")),
        slice("a-2", "a", "10.0.0.2", Some("z2")),
        node(json!({"topology.kubernetes.io/zone": "z1"})),
        SourceEvent::ServicesSynced,
        SourceEvent::SlicesSynced,
    ] {
        feed(&source, e);
    }
    syncer.sync().unwrap();
    let eps = |s: &Syncer<Recorder>| {
        s.desired().services[&spn("a")]
            .cluster_endpoints
            .iter()
            .map(|e| e.ip.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(eps(&syncer), ["10.0.0.1"]);

    assert!(!feed(
        &source,
        node(json!({"topology.kubernetes.io/zone": "z1", "team": "x"}))
    ));
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(partial(&[])));

    assert!(feed(
        &source,
        node(json!({"topology.kubernetes.io/zone": "z2"}))
    ));
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(full()));
    assert_eq!(eps(&syncer), ["10.0.0.2"]);

    assert!(feed(&source, SourceEvent::NodeDeleted));
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(full()));
    assert_eq!(eps(&syncer), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(rec.calls().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn full_sync_is_forced_after_full_sync_period() {
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let mut syncer = Syncer::new(source.clone(), Recorder::default(), Duration::from_secs(60));
    feed(&source, SourceEvent::ServicesSynced);
    feed(&source, SourceEvent::SlicesSynced);
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(full()));
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(partial(&[])));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(syncer.sync().unwrap(), SyncOutcome::Synced(full()));
}

#[tokio::test(start_paused = true)]
async fn driver_waits_for_initial_lists_and_coalesces_bursts() {
    let rec = Recorder::default();
    let (tx, rx) = futures::channel::mpsc::unbounded::<SourceEvent>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let timing = SyncTiming {
        min_sync_period: Duration::from_secs(1),
        sync_period: Duration::from_secs(30),
        retry_period: Duration::from_secs(1),
        full_sync_period: Duration::from_secs(3600),
    };
    let task = tokio::spawn({
        let rec = rec.clone();
        async move {
            run(rx, SourceState::new(NODE), rec, timing, async move {
                let _ = stop_rx.await;
            })
            .await
            .unwrap()
        }
    });
    let step = |d: u64| tokio::time::sleep(Duration::from_millis(d));
    tx.unbounded_send(svc("a", 80)).unwrap();
    tx.unbounded_send(SourceEvent::ServicesSynced).unwrap();
    step(5000).await;
    assert!(
        rec.calls().is_empty(),
        "slices not listed: nothing programmed"
    );

    tx.unbounded_send(slice("a-1", "a", "10.0.0.1", None))
        .unwrap();
    tx.unbounded_send(SourceEvent::SlicesSynced).unwrap();
    step(10).await;
    assert_eq!(rec.calls(), [(full(), 1)]);

    for i in 0..20 {
        tx.unbounded_send(svc(&format!("burst-{i}"), 80)).unwrap();
    }
    step(10).await;
    assert_eq!(rec.calls().len(), 1, "min sync period holds the burst back");
    step(1000).await;
    let calls = rec.calls();
    assert_eq!(calls.len(), 2, "the whole burst is one partial sync");
    assert_eq!(calls[1].0.changed.len(), 20);
    assert_eq!(calls[1].1, 21);

    step(30_000).await;
    assert_eq!(rec.calls().len(), 3, "periodic sync after syncPeriod");
    stop_tx.send(()).unwrap();
    task.await.unwrap();
}
