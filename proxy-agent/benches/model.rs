//! 10,000 services x 10 endpoints through the sync engine (`MODEL_SERVICES`
//! for another number).
//!
//! `cargo bench -p proxy-agent --bench model` (AYA_BUILD_SKIP=1 works).
//! Reports: time to feed every object into the trackers and build the full
//! desired state, time to apply one endpoint change (partial sync), and the
//! heap the agent keeps for that state, counted by a wrapping allocator.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::{
        Arc, Mutex,
        atomic::{AtomicIsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Service;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::{
    model::DesiredState,
    sources::SourceEvent,
    sync::{Proxier, SourceState, SyncChanges, SyncOutcome, Syncer},
};
use serde_json::json;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Services by default; `MODEL_SERVICES` overrides it.
const DEFAULT_SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;
const NODE: &str = "node-0";

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Touches what a backend would read, so the sync is not optimised away.
struct Sink(usize);

impl Proxier for Sink {
    type Error = Never;
    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Never> {
        self.0 += desired.services.len() + changes.changed.len();
        Ok(())
    }
}

fn service(i: usize) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}"), "namespace": format!("ns-{}", i % 100), "resourceVersion": "1"},
        "spec": {"type": "ClusterIP", "clusterIP": format!("10.96.{}.{}", i / 250, i % 250),
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "sessionAffinity": "None", "internalTrafficPolicy": "Cluster"},
    }))
    .unwrap()
}

fn slice(i: usize, generation: usize) -> EndpointSlice {
    let endpoints: Vec<_> = (0..ENDPOINTS)
        .map(|e| {
            let n = i * ENDPOINTS + e + generation;
            json!({"addresses": [format!("10.{}.{}.{}", 1 + n / 65_536, (n / 256) % 256, n % 256)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", n % 50), "zone": format!("zone-{}", n % 3)})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": format!("ns-{}", i % 100),
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn statm_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn build(events: Vec<SourceEvent>) -> (Arc<Mutex<SourceState>>, Syncer<Sink>) {
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let syncer = Syncer::new(source.clone(), Sink(0), Duration::from_secs(3600));
    {
        let mut src = source.lock().unwrap();
        for event in events {
            src.handle(event);
        }
    }
    (source, syncer)
}

fn main() {
    let services_n: usize = std::env::var("MODEL_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SERVICES);
    let services: Vec<Service> = (0..services_n).map(service).collect();
    let slices: Vec<EndpointSlice> = (0..services_n).map(|i| slice(i, 0)).collect();
    let changed_slices: Vec<EndpointSlice> =
        (1..=2).map(|g| slice(services_n / 2, g * 7)).collect();

    // Timing: events are built first, as the watch hands over owned objects.
    let events: Vec<SourceEvent> = services
        .iter()
        .map(|s| SourceEvent::ServiceApplied(Box::new(s.clone())))
        .chain(
            slices
                .iter()
                .map(|s| SourceEvent::SliceApplied(Box::new(s.clone()))),
        )
        .chain([SourceEvent::ServicesSynced, SourceEvent::SlicesSynced])
        .collect();
    let start = Instant::now();
    let (source, mut syncer) = build(events);
    let fed = start.elapsed();
    let outcome = syncer.sync().unwrap();
    let full = start.elapsed();
    assert!(matches!(
        outcome,
        SyncOutcome::Synced(SyncChanges { full: true, .. })
    ));
    assert_eq!(syncer.desired().services.len(), services_n);
    drop((source, syncer));

    // Memory: what the agent keeps (trackers + desired state), inputs excluded.
    let heap_before = LIVE.load(Ordering::Relaxed);
    let rss_before = statm_rss_bytes();
    let events: Vec<SourceEvent> = services
        .iter()
        .map(|s| SourceEvent::ServiceApplied(Box::new(s.clone())))
        .chain(
            slices
                .iter()
                .map(|s| SourceEvent::SliceApplied(Box::new(s.clone()))),
        )
        .chain([SourceEvent::ServicesSynced, SourceEvent::SlicesSynced])
        .collect();
    let input = LIVE.load(Ordering::Relaxed) - heap_before;
    let (source, mut syncer) = build(events);
    syncer.sync().unwrap();
    let heap_state = LIVE.load(Ordering::Relaxed) - heap_before;
    let rss_after = statm_rss_bytes();

    let mut single = Vec::new();
    for round in 0..200 {
        let slice = changed_slices[round % 2].clone();
        let t = Instant::now();
        let wants = source
            .lock()
            .unwrap()
            .handle(SourceEvent::SliceApplied(Box::new(slice)));
        let outcome = syncer.sync().unwrap();
        single.push(t.elapsed());
        assert!(wants);
        match outcome {
            SyncOutcome::Synced(c) => assert!(!c.full && c.changed.len() == 1),
            other => panic!("{other:?}"),
        }
    }

    println!("model benchmark: {services_n} services x {ENDPOINTS} endpoints");
    println!(
        "  feed trackers (all objects):        {:>8.1} ms",
        fed.as_secs_f64() * 1e3
    );
    println!(
        "  first (full) sync: desired state:   {:>8.1} ms",
        (full - fed).as_secs_f64() * 1e3
    );
    println!(
        "  full model + desired state (total): {:>8.1} ms",
        full.as_secs_f64() * 1e3
    );
    println!(
        "  single endpoint change (median):    {:>8.1} us",
        median(single.clone()).as_secs_f64() * 1e6
    );
    println!(
        "  single endpoint change (max):       {:>8.1} us",
        single.iter().max().unwrap().as_secs_f64() * 1e6
    );
    println!(
        "  agent heap for that state:          {:>8.1} MiB (allocator count)",
        mib(heap_state)
    );
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        println!(
            "  RSS growth while building:          {:>8.1} MiB (/proc/self/statm)",
            mib(b as isize - a as isize)
        );
    }
    println!(
        "  (the 20,000 input objects: {:.1} MiB, dropped as they are fed)",
        mib(input)
    );
}
