//! What the sync engine tells the rest of the agent (the health server, the
//! metrics, the service health-check ports) as it runs, in upstream's
//! terms: a sync was queued, a sync ran (and how), the loop started.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Node;

use super::SyncChanges;
use crate::model::{DesiredState, FamilySet, IpFamily};

/// One sync as the observers see it.
pub struct SyncReport<'a> {
    pub desired: &'a DesiredState,
    pub changes: &'a SyncChanges,
    pub took: Duration,
    /// Every family synced.
    pub succeeded: bool,
    /// The families whose rules the sync could not write (empty when it
    /// succeeded): the others report a sync of their own.
    pub failed: FamilySet,
    /// Of those, the ones the mode's failure counter counts
    /// (`Proxier::counted_failures`).
    pub counted: FamilySet,
    /// `endpoints.kubernetes.io/last-change-trigger-time` of the EndpointSlice
    /// changes this sync applied.
    pub trigger_times: &'a [(IpFamily, SystemTime)],
}

impl SyncReport<'_> {
    /// Whether `family`'s rules were written.
    pub fn synced(&self, family: IpFamily) -> bool {
        !self.failed.contains(family)
    }

    /// Whether some family's rules were written.
    pub fn any_synced(&self) -> bool {
        IpFamily::BOTH.into_iter().any(|f| self.synced(f))
    }
}

/// Change-tracker events, counted as upstream's change metrics count them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackerEvent {
    /// A Service add/update/delete; `pending`: services with changes not synced yet.
    Service { pending: usize },
    /// An EndpointSlice add/update/delete; `changed`: it changed what is pending.
    Slice { changed: bool },
}

/// Every method has a do-nothing default.
pub trait SyncObserver: Send + Sync {
    /// The sync loop started (upstream `SyncLoop`): counts as an update, in
    /// case no sync ever succeeds.
    fn loop_started(&self) {}
    /// A change asks for a sync (upstream `Sync()`).
    fn queued(&self) {}
    fn tracker(&self, _event: TrackerEvent) {}
    /// A sync took the pending changes out of the trackers.
    fn applied(&self) {}
    /// This node's Node object, each time it changes (`None`: unknown or deleted).
    fn node(&self, _node: Option<&Node>) {}
    /// A sync ran (initialised sources only).
    fn synced(&self, _report: &SyncReport<'_>) {}
}

/// No observer.
impl SyncObserver for () {}

/// Several observers as one.
#[derive(Clone, Default)]
pub struct Observers(Vec<Arc<dyn SyncObserver>>);

impl Observers {
    pub fn new(list: Vec<Arc<dyn SyncObserver>>) -> Self {
        Observers(list)
    }

    pub fn push(&mut self, observer: Arc<dyn SyncObserver>) {
        self.0.push(observer);
    }
}

impl SyncObserver for Observers {
    fn loop_started(&self) {
        self.0.iter().for_each(|o| o.loop_started());
    }
    fn queued(&self) {
        self.0.iter().for_each(|o| o.queued());
    }
    fn tracker(&self, event: TrackerEvent) {
        self.0.iter().for_each(|o| o.tracker(event));
    }
    fn applied(&self) {
        self.0.iter().for_each(|o| o.applied());
    }
    fn node(&self, node: Option<&Node>) {
        self.0.iter().for_each(|o| o.node(node));
    }
    fn synced(&self, report: &SyncReport<'_>) {
        self.0.iter().for_each(|o| o.synced(report));
    }
}
