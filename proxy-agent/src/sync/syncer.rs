use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use super::{Proxier, SourceState, SyncChanges, SyncObserver, SyncReport};
use crate::model::{DesiredState, FamilySet, NamespacedName, NodeTopology};

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The cause is in the message: the runner logs this error's text alone.
    #[error("{what} failed: {source}; the next sync will be full")]
    Proxier {
        /// `full sync` or `partial sync of N service ports`.
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Services or EndpointSlices not listed yet.
    NotInitialized,
    Synced(SyncChanges),
}

/// Owns the desired state and the proxier; `sync` is the runner's function.
pub struct Syncer<P> {
    source: Arc<Mutex<SourceState>>,
    proxier: P,
    desired: DesiredState,
    applied_node: NodeTopology,
    need_full_sync: bool,
    full_sync_period: Duration,
    last_full_sync: Option<Instant>,
    observer: Arc<dyn SyncObserver>,
}

impl<P: Proxier> Syncer<P> {
    /// `full_sync_period`: how often a sync is forced to be full even without failures.
    pub fn new(source: Arc<Mutex<SourceState>>, proxier: P, full_sync_period: Duration) -> Self {
        Syncer {
            source,
            proxier,
            desired: DesiredState::default(),
            applied_node: NodeTopology::default(),
            need_full_sync: true,
            full_sync_period,
            last_full_sync: None,
            observer: Arc::new(()),
        }
    }

    /// Tells `observer` about every sync from now on.
    pub fn with_observer(mut self, observer: Arc<dyn SyncObserver>) -> Self {
        self.observer = observer;
        self
    }

    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }

    pub fn proxier(&self) -> &P {
        &self.proxier
    }

    pub fn sync(&mut self) -> Result<SyncOutcome, SyncError> {
        let started = std::time::Instant::now();
        let (changes, trigger_times) = {
            let mut guard = self.source.lock().unwrap_or_else(|e| e.into_inner());
            let src = &mut *guard;
            if !src.is_initialized() {
                return Ok(SyncOutcome::NotInitialized);
            }
            let touched = apply_trackers(src);
            let trigger_times = src.endpoints.take_trigger_times();
            self.observer.applied();
            let periodic = self
                .last_full_sync
                .is_none_or(|t| t.elapsed() >= self.full_sync_period);
            let full =
                self.need_full_sync || periodic || src.node.topology_differs(&self.applied_node);
            self.applied_node = src.node.clone();
            let changes = if full {
                self.desired = DesiredState::rebuild(&src.services, &src.endpoints, &src.node);
                SyncChanges {
                    full: true,
                    changed: Default::default(),
                }
            } else {
                let changed = self.desired.update_services(
                    &touched,
                    &src.services,
                    &src.endpoints,
                    &src.node,
                );
                SyncChanges {
                    full: false,
                    changed,
                }
            };
            self.desired.node = src.node_model().clone();
            self.desired.service_cidrs = src.service_cidrs();
            (changes, trigger_times)
        };
        let result = self.proxier.sync(&self.desired, &changes);
        self.observer.synced(&SyncReport {
            desired: &self.desired,
            changes: &changes,
            took: started.elapsed(),
            succeeded: result.is_ok(),
            failed: match &result {
                Ok(()) => FamilySet::default(),
                Err(e) => self.proxier.failed_families(e),
            },
            counted: match &result {
                Ok(()) => FamilySet::default(),
                Err(e) => self.proxier.counted_failures(e),
            },
            trigger_times: &trigger_times,
        });
        if let Err(err) = result {
            // The trackers were already flushed into `desired`, so only a full
            // sync can be sure to catch the backend up.
            self.need_full_sync = true;
            return Err(SyncError::Proxier {
                what: if changes.full {
                    "full sync".to_owned()
                } else {
                    format!("partial sync of {} service ports", changes.changed.len())
                },
                source: Box::new(err),
            });
        }
        super::report_log::log_sync(&self.desired, &changes);
        self.proxier.after_sync(&self.desired, &changes);
        if changes.full {
            self.need_full_sync = false;
            self.last_full_sync = Some(Instant::now());
        }
        Ok(SyncOutcome::Synced(changes))
    }
}

/// From this many services pending in each tracker (a first listing), the
/// two apply on two threads: 50,000 services took 0.1 s on one.
const PARALLEL_APPLY: usize = 1_024;

/// Applies both trackers' pending changes: the services they touched.
fn apply_trackers(src: &mut SourceState) -> BTreeSet<NamespacedName> {
    let (services, endpoints) = (&mut src.services, &mut src.endpoints);
    if services.pending_len().min(endpoints.pending_len()) < PARALLEL_APPLY {
        let mut touched = services.apply();
        touched.append(&mut endpoints.apply());
        return touched;
    }
    std::thread::scope(|scope| {
        let applying = scope.spawn(|| services.apply());
        let mut touched = endpoints.apply();
        let mut more = applying
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        touched.append(&mut more);
        touched
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::SourceEvent;

    /// A first listing past [`PARALLEL_APPLY`]: the trackers applied on two
    /// threads leave the same state, and touch the same services, as
    /// applied one after the other.
    #[test]
    fn trackers_applied_on_two_threads_match_one_after_the_other() {
        let listing = || {
            let mut source = SourceState::new("node-a");
            for i in 0..2 * PARALLEL_APPLY {
                let svc = serde_json::json!({
                    "metadata": {"name": format!("svc-{i}"), "namespace": "ns"},
                    "spec": {"clusterIP": format!("198.19.{}.{}", i / 250, i % 250 + 1),
                             "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
                });
                source.handle(SourceEvent::ServiceApplied(Box::new(
                    serde_json::from_value(svc).unwrap(),
                )));
                // Every third service has no slice: touched by its tracker alone.
                if i % 3 != 0 {
                    let slice = serde_json::json!({
                        "metadata": {"name": format!("svc-{i}-1"), "namespace": "ns",
                                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
                        "addressType": "IPv4",
                        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                        "endpoints": [{"addresses": [format!("198.18.{}.{}", i / 250, i % 250 + 1)]}]
                    });
                    source.handle(SourceEvent::SliceApplied(Box::new(
                        serde_json::from_value(slice).unwrap(),
                    )));
                }
            }
            source
        };
        let (mut threaded, mut sequential) = (listing(), listing());
        assert!(
            threaded.endpoints.pending_len() >= PARALLEL_APPLY,
            "the threaded path"
        );
        let touched = apply_trackers(&mut threaded);
        let mut expected = sequential.services.apply();
        expected.append(&mut sequential.endpoints.apply());
        assert_eq!(touched.len(), 2 * PARALLEL_APPLY);
        assert_eq!(touched, expected);
        let rebuilt = |s: &SourceState| DesiredState::rebuild(&s.services, &s.endpoints, &s.node);
        assert_eq!(rebuilt(&threaded).services, rebuilt(&sequential).services);
        assert!(!threaded.services.has_pending() && !threaded.endpoints.has_pending());
    }
}
