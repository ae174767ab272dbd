use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt};

use super::{Proxier, SourceState, SyncObserver, SyncOutcome, Syncer};
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
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let wants_sync = source
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .handle_observed(event, observer.as_ref());
            if wants_sync {
                observer.queued();
                handle.run();
            }
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
