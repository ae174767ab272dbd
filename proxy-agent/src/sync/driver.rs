use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt};

use super::{Proxier, SourceState, SyncObserver, SyncOutcome, Syncer, source::PreparedEvent};
use crate::sources::SourceEvent;
use crate::sync::runner::{BoundedFrequencyRunner, RunnerError, RunnerIntervals};

/// Upstream's `minSyncPeriod` / `syncPeriod`, plus how often a sync is forced full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncTiming {
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    pub retry_period: Duration,
    pub full_sync_period: Duration,
}

impl Default for SyncTiming {
    /// kube-proxy's defaults: minSyncPeriod 1s, syncPeriod 30s; upstream's
    /// iptables mode forces a full sync hourly.
    fn default() -> Self {
        SyncTiming {
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            retry_period: Duration::from_secs(1),
            full_sync_period: Duration::from_secs(3600),
        }
    }
}

/// Feeds `events` into the trackers and syncs `proxier` until `shutdown`.
/// Used by both the API source and the manifests source.
pub async fn run<P, S>(
    events: S,
    source: SourceState,
    proxier: P,
    timing: SyncTiming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunnerError>
where
    P: Proxier,
    S: Stream<Item = SourceEvent> + Send,
{
    run_observed(events, source, proxier, timing, shutdown, Arc::new(())).await
}

/// [`run`], telling `observer` what happens (health, metrics, health-check ports).
pub async fn run_observed<P, S>(
    events: S,
    source: SourceState,
    proxier: P,
    timing: SyncTiming,
    shutdown: impl Future<Output = ()> + Send,
    observer: Arc<dyn SyncObserver>,
) -> Result<(), RunnerError>
where
    P: Proxier,
    S: Stream<Item = SourceEvent> + Send,
{
    let source = Arc::new(Mutex::new(source));
    let mut syncer = Syncer::new(source.clone(), proxier, timing.full_sync_period)
        .with_observer(observer.clone());
    let (runner, handle) = BoundedFrequencyRunner::new(
        "sync-proxy-rules",
        RunnerIntervals {
            min: timing.min_sync_period,
            retry: timing.retry_period,
            max: timing.sync_period,
        },
    )?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    observer.loop_started();
    let sync_loop = runner.run_loop(
        move || {
            let res = syncer.sync();
            if matches!(&res, Ok(SyncOutcome::Synced(c)) if c.full) {
                crate::memory::release_freed();
            }
            async move { res.map(|_| ()) }
        },
        async move {
            let _ = stop_rx.await;
        },
    );
    let feed = async move {
        // The events ready at once (a first listing: all of them), their
        // Services and slices reduced on every core, then fed (each tracker
        // in its events' order).
        let events = events.ready_chunks(FEED_BATCH);
        futures::pin_mut!(events);
        while let Some(batch) = next_batch(&mut events).await {
            let prepared = prepare(batch);
            let wants_sync = (source.lock().unwrap_or_else(|e| e.into_inner()))
                .handle_batch(prepared, observer.as_ref());
            if wants_sync {
                observer.queued();
                handle.run();
            }
            // Batches are taken without tokio's budget (see `next_batch`):
            // the sync loop, polled by this same task, gets its turn here.
            tokio::task::yield_now().await;
        }
    };
    // A finite source (manifests) ends its stream; keep syncing until shutdown.
    let stopper = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = async { feed.await; std::future::pending::<()>().await } => {}
        }
        let _ = stop_tx.send(());
    };
    tokio::join!(sync_loop, stopper);
    Ok(())
}

/// Events fed to the trackers under one lock.
pub const FEED_BATCH: usize = 8_192;

/// The next batch of ready events, up to [`FEED_BATCH`]. Taken outside
/// tokio's cooperative budget: the agent's sources come through a tokio
/// channel, which otherwise ended every batch at the budget's 128 events,
/// too few for [`prepare`]'s threads, so a first listing's slices were all
/// reduced on the one thread that feeds the trackers.
async fn next_batch<S>(events: &mut S) -> Option<Vec<SourceEvent>>
where
    S: Stream<Item = Vec<SourceEvent>> + Unpin,
{
    tokio::task::unconstrained(events.next()).await
}

/// From this many events on, a batch's slices are reduced on several threads.
const PARALLEL_EVENTS: usize = 1_024;

fn prepare(batch: Vec<SourceEvent>) -> Vec<PreparedEvent> {
    let mut prepared: Vec<PreparedEvent> = batch.into_iter().map(PreparedEvent::plain).collect();
    let threads = match prepared.len() >= PARALLEL_EVENTS {
        true => std::thread::available_parallelism().map_or(1, |n| n.get()),
        false => 1,
    };
    if threads <= 1 {
        prepared.iter_mut().for_each(PreparedEvent::prepare);
        return prepared;
    }
    let part = prepared.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for events in prepared.chunks_mut(part) {
            scope.spawn(move || events.iter_mut().for_each(PreparedEvent::prepare));
        }
    });
    prepared
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DesiredState, NamespacedName, trackers::LAST_CHANGE_TRIGGER_TIME};

    #[tokio::test]
    async fn a_listing_sent_through_a_tokio_channel_comes_as_one_batch() {
        // As the agent's `read_ahead` passes a source's events on.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..5_000 {
            tx.send(SourceEvent::ServicesSynced).unwrap();
        }
        let events =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                .ready_chunks(FEED_BATCH);
        futures::pin_mut!(events);
        let batch = next_batch(&mut events).await.unwrap();
        // Within tokio's budget it was 128 events, below the threaded path's threshold.
        assert_eq!(batch.len(), 5_000);
        assert!(batch.len() >= PARALLEL_EVENTS);
    }

    fn service(i: usize) -> SourceEvent {
        service_on(i, 80)
    }

    fn service_on(i: usize, port: u16) -> SourceEvent {
        SourceEvent::ServiceApplied(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("svc-{i}"), "namespace": "ns"},
                "spec": {"clusterIP": format!("198.19.{}.{}", i / 250, i % 250 + 1),
                         "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}
            }))
            .unwrap(),
        ))
    }

    fn slice(i: usize, ip: &str) -> SourceEvent {
        SourceEvent::SliceApplied(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("svc-{i}-1"), "namespace": "ns",
                             "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"}]
            }))
            .unwrap(),
        ))
    }

    /// A batch fed on two threads wants a sync as the same events fed one
    /// by one do: when the sources become initialised in it, or were and
    /// something changed, never before both kinds were listed.
    #[test]
    fn a_batch_fed_on_two_threads_wants_a_sync_when_events_one_by_one_would() {
        let listing = |from: usize| -> Vec<SourceEvent> {
            (from..from + 1_000)
                .flat_map(|i| [service(i), slice(i, "198.18.1.1")])
                .collect()
        };
        let mut source = SourceState::new("node-a");
        // Neither kind listed yet: no sync.
        assert!(!source.handle_batch(prepare(listing(0)), &()));
        // Both listed within the batch: a sync, whatever the order of the synced marks.
        let mut events = vec![SourceEvent::SlicesSynced];
        events.extend(listing(1_000));
        events.push(SourceEvent::ServicesSynced);
        assert!(source.handle_batch(prepare(events), &()));
        // Initialised and synced: the same objects again change nothing,
        // new ones do.
        source.services.apply();
        source.endpoints.apply();
        assert!(!source.handle_batch(prepare(listing(1_000)), &()));
        assert!(source.handle_batch(prepare(listing(2_000)), &()));
    }

    /// After the trackers' start, so that it counts.
    const TRIGGERED: &str = "2100-01-01T00:00:00Z";

    /// A long batch (reduced on several threads) leaves the trackers as the
    /// same events fed one by one do, a Service or a slice sent twice keeping
    /// its last copy, a Service without a name ignored; the rebuild from them
    /// (also threaded) holds every service.
    #[test]
    fn a_prepared_batch_feeds_the_trackers_as_events_one_by_one_do() {
        let events = || {
            let mut all = Vec::new();
            for i in 0..2_500 {
                all.push(service(i));
                all.push(slice(i, "198.18.1.1"));
            }
            // A change with its trigger time (an annotation, kept by `prepare`).
            let mut changed = slice(7, "198.18.1.2");
            if let SourceEvent::SliceApplied(s) = &mut changed {
                s.metadata.annotations =
                    Some([(LAST_CHANGE_TRIGGER_TIME.to_owned(), TRIGGERED.to_owned())].into());
            }
            all.push(changed);
            all.push(service_on(9, 81));
            all.push(SourceEvent::ServiceApplied(Box::default()));
            all.extend([SourceEvent::ServicesSynced, SourceEvent::SlicesSynced]);
            all
        };
        let desired = |s: &mut SourceState| {
            s.services.apply();
            s.endpoints.apply();
            DesiredState::rebuild(&s.services, &s.endpoints, &s.node)
        };

        let mut one_by_one = SourceState::new("node-a");
        for event in events() {
            one_by_one.handle(event);
        }
        let mut batched = SourceState::new("node-a");
        let prepared = prepare(events());
        assert!(
            prepared.len() >= PARALLEL_EVENTS,
            "the batch takes the threaded path"
        );
        // Past PARALLEL_FEED: the trackers are fed on two threads.
        assert!(batched.handle_batch(prepared, &()));
        let triggered = |s: &mut SourceState| s.endpoints.take_trigger_times();
        let (a, b) = (triggered(&mut one_by_one), triggered(&mut batched));
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a, b);
        let (a, b) = (desired(&mut one_by_one), desired(&mut batched));
        // Past PARALLEL_SERVICES: the rebuild too runs on several threads.
        assert_eq!(a.services.len(), 2_500);
        assert_eq!(a.services, b.services);
        let seven = NamespacedName::new("ns", "svc-7");
        let ips: Vec<String> = b
            .services
            .values()
            .filter(|s| s.name.service() == seven)
            .flat_map(|s| s.cluster_endpoints.iter().map(|e| e.ip.to_string()))
            .collect();
        assert_eq!(ips, ["198.18.1.2"]);
        let nine = NamespacedName::new("ns", "svc-9");
        let ports: Vec<u16> = (b.services.values())
            .filter(|s| s.name.service() == nine)
            .map(|s| s.port)
            .collect();
        assert_eq!(ports, [81]);
    }
}
