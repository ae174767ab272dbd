//! Upstream's `ProxyHealthServer` state (`pkg/proxy/healthcheck/proxy_health.go`):
//! per IP family, when the proxier last updated and the oldest change it has
//! not processed yet; plus whether this node may receive load-balancer traffic.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::{
    model::IpFamily,
    sync::{SyncObserver, SyncReport},
};

/// The taint the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// The time source; tests substitute their own.
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Shared by the sync engine (which reports) and the HTTP servers (which ask).
pub struct ProxyHealth {
    families: Vec<IpFamily>,
    timeout: Duration,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_queued: BTreeMap<IpFamily, SystemTime>,
    /// `None` until this node's Node object is known.
    node: Option<NodeFacts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeFacts {
    deleting: bool,
    to_be_deleted: bool,
}

/// `Health()`: the answer both endpoints build on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// `None`: never (Go's zero time).
    #[serde(serialize_with = "rfc3339nano_or_zero")]
    pub last_updated: Option<SystemTime>,
    #[serde(serialize_with = "rfc3339nano")]
    pub current_time: SystemTime,
    /// Only `/healthz` says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    pub healthy: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<&'static str, FamilyHealth>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FamilyHealth {
    #[serde(serialize_with = "rfc3339nano")]
    pub last_updated: SystemTime,
    pub healthy: bool,
}

impl ProxyHealth {
    /// `families`: those the mode's proxiers serve, each updated on its own;
    /// `timeout`: upstream's healthTimeout, 2 × syncPeriod.
    pub fn new(families: Vec<IpFamily>, timeout: Duration, clock: Arc<dyn Clock>) -> Self {
        ProxyHealth {
            families,
            timeout,
            clock,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// `Updated(family)`: the proxier caught up.
    pub fn updated(&self, family: IpFamily) {
        let now = self.clock.now();
        let mut state = self.state();
        state.oldest_queued.remove(&family);
        state.last_updated.insert(family, now);
    }

    /// `QueuedUpdate(family)`: a change waits; only the oldest one counts.
    pub fn queued_update(&self, family: IpFamily) {
        let now = self.clock.now();
        self.state().oldest_queued.entry(family).or_insert(now);
    }

    /// This node's Node object (`None`: not known, or deleted).
    pub fn set_node(&self, node: Option<&Node>) {
        self.state().node = node.map(|n| NodeFacts {
            deleting: n.metadata.deletion_timestamp.is_some(),
            to_be_deleted: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT)),
        });
    }

    /// A family that never updated is ignored; one whose oldest queued change
    /// is `timeout` old or older is unhealthy.
    pub fn health(&self) -> Health {
        let now = self.clock.now();
        let state = self.state();
        let mut health = Health {
            last_updated: None,
            current_time: now,
            node_eligible: None,
            healthy: true,
            status: BTreeMap::new(),
        };
        let mut latest = None;
        for (family, &updated) in &state.last_updated {
            latest = latest.max(Some(updated));
            let late = state
                .oldest_queued
                .get(family)
                .is_some_and(|q| now.duration_since(*q).unwrap_or_default() >= self.timeout);
            health.healthy &= !late;
            health.status.insert(
                family.api_name(),
                FamilyHealth {
                    last_updated: updated,
                    healthy: !late,
                },
            );
        }
        health.last_updated = latest;
        health
    }

    /// `NodeEligible()`: known, not being deleted, not about to be scaled down.
    pub fn node_eligible(&self) -> bool {
        self.state()
            .node
            .is_some_and(|n| !n.deleting && !n.to_be_deleted)
    }
}

impl SyncObserver for ProxyHealth {
    fn loop_started(&self) {
        self.families.iter().for_each(|f| self.updated(*f));
    }

    fn queued(&self) {
        self.families.iter().for_each(|f| self.queued_update(*f));
    }

    fn node(&self, node: Option<&Node>) {
        self.set_node(node);
    }

    /// A failed sync does not count: the queued change keeps ageing.
    fn synced(&self, report: &SyncReport<'_>) {
        (self.families.iter())
            .filter(|f| report.synced(**f))
            .for_each(|f| self.updated(*f));
    }
}

/// Go's zero `time.Time`, which upstream prints for "never".
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Go's `time.Time` JSON (RFC 3339, as many fractional digits as needed), in UTC.
pub fn format_time(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| GO_ZERO_TIME.into(), |ts| ts.to_string())
}

fn rfc3339nano<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_time(*t))
}

fn rfc3339nano_or_zero<S: serde::Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339nano(t, s),
        None => s.serialize_str(GO_ZERO_TIME),
    }
}
