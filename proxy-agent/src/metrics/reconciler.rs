//! Upstream's conntrack reconciler metrics (Kubernetes 1.33, registered by
//! the Linux modes): how long each family's cleanup of stale UDP flows took,
//! and how many flows it deleted. The rule modes clean the kernel's
//! conntrack table after every sync, as upstream does; the ebpf mode
//! flushes its own table when a UDP backend leaves.

use std::time::Duration;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{TypedMetric as _, counter::Counter, family::Family, histogram::Histogram},
};

use super::proxy::{FamilyLabel, sync_buckets};
use crate::model::IpFamily;

pub const SYNC_DURATION: &str = "conntrack_reconciler_sync_duration_seconds";
/// A counter: its samples are named `..._total`.
pub const DELETED_ENTRIES: &str = "conntrack_reconciler_deleted_entries";

/// Both metrics, cheap to clone (the clones share their values): the mode
/// keeps one to observe and hands one to the metrics server to encode.
#[derive(Clone, Debug)]
pub struct ConntrackReconcilerMetrics {
    duration: Family<FamilyLabel, Histogram, fn() -> Histogram>,
    deleted: Family<FamilyLabel, Counter>,
}

impl ConntrackReconcilerMetrics {
    /// With a series of each for each of `families` from the start.
    pub fn new(families: &[IpFamily]) -> Self {
        let metrics = Self {
            duration: Family::new_with_constructor(sync_buckets),
            deleted: Family::default(),
        };
        for family in families {
            let label = label(*family);
            drop(metrics.duration.get_or_create(&label));
            drop(metrics.deleted.get_or_create(&label));
        }
        metrics
    }

    /// One cleanup of `family`'s flows: how long it took, how many it deleted.
    pub fn observe(&self, family: IpFamily, took: Duration, deleted: usize) {
        let label = label(family);
        self.duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        self.deleted.get_or_create(&label).inc_by(deleted as u64);
    }
}

fn label(family: IpFamily) -> FamilyLabel {
    FamilyLabel {
        ip_family: family.api_name(),
    }
}

impl Collector for ConntrackReconcilerMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let duration = encoder.encode_descriptor(
            SYNC_DURATION,
            "[ALPHA] ReconcileConntrackFlowsLatency latency in seconds",
            None,
            Histogram::TYPE,
        )?;
        self.duration.encode(duration)?;
        let deleted = encoder.encode_descriptor(
            DELETED_ENTRIES,
            "[ALPHA] Cumulative conntrack flows deleted by conntrack reconciler",
            None,
            Counter::<u64>::TYPE,
        )?;
        self.deleted.encode(deleted)
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{encoding::text::encode, registry::Registry};

    use super::ConntrackReconcilerMetrics;
    use crate::model::IpFamily;

    fn scrape(metrics: &ConntrackReconcilerMetrics) -> String {
        let mut registry = Registry::with_prefix("kubeproxy");
        registry.register_collector(Box::new(metrics.clone()));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn each_familys_cleanups_are_timed_and_their_deletions_counted() {
        let metrics = ConntrackReconcilerMetrics::new(&IpFamily::BOTH);
        metrics.observe(IpFamily::V4, std::time::Duration::from_millis(3), 2);
        metrics.observe(IpFamily::V4, std::time::Duration::from_millis(5), 0);
        let text = scrape(&metrics);
        for line in [
            "# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram",
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} 2"#,
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_sum{ip_family="IPv4"} 0.008"#,
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le="0.004",ip_family="IPv4"} 1"#,
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv6"} 0"#,
            "# TYPE kubeproxy_conntrack_reconciler_deleted_entries counter",
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 2"#,
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
