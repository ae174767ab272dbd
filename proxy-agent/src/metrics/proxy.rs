//! Upstream's `kubeproxy_*` metrics (`pkg/proxy/metrics/metrics.go`), with
//! the same names, types, labels and buckets, fed by the sync engine.

use std::{
    sync::{Mutex, atomic::AtomicU64},
    time::{Duration, SystemTime},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::no_local::NoLocalCounts;
use crate::{
    model::IpFamily,
    options::ProxyMode,
    sync::{SyncObserver, SyncReport, TrackerEvent},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub ip_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub ip_family: &'static str,
    pub traffic_policy: &'static str,
}

type Timestamp = Gauge<f64, AtomicU64>;
type Histograms = Family<FamilyLabel, Histogram, fn() -> Histogram>;

/// The sync engine's and health servers' metrics, registered as the mode
/// registers them upstream (`RegisterMetrics(mode)`).
pub struct ProxyMetrics {
    families: Vec<IpFamily>,
    sync_duration: Histograms,
    sync_full_duration: Histograms,
    sync_partial_duration: Histograms,
    last_sync: Family<FamilyLabel, Timestamp>,
    last_queued: Family<FamilyLabel, Timestamp>,
    network_programming: Histograms,
    endpoint_changes_pending: Gauge,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    service_changes: Counter,
    no_local_endpoints: Family<PolicyLabel, Gauge>,
    no_local: Mutex<NoLocalCounts>,
    healthz: Family<CodeLabel, Counter>,
    livez: Family<CodeLabel, Counter>,
    sync_failures: Family<FamilyLabel, Counter>,
}

/// Upstream's sync histograms' buckets: 1 ms doubling to about 16 s.
pub fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// 0 (upstream's `merge` starts from a zero bucket), 0.25 s and 0.5 s, every
/// second to 59 s, every 5 s to 115 s, every 30 s to 5 min.
pub fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

fn network_programming_histogram() -> Histogram {
    Histogram::new(network_programming_buckets())
}

impl ProxyMetrics {
    /// Metrics for the `families` the mode serves; their labelled series
    /// exist from the start.
    pub fn new(families: Vec<IpFamily>) -> Self {
        let metrics = ProxyMetrics {
            families,
            sync_duration: Family::new_with_constructor(sync_buckets),
            sync_full_duration: Family::new_with_constructor(sync_buckets),
            sync_partial_duration: Family::new_with_constructor(sync_buckets),
            last_sync: Family::default(),
            last_queued: Family::default(),
            network_programming: Family::new_with_constructor(network_programming_histogram),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            no_local_endpoints: Family::default(),
            no_local: Mutex::default(),
            healthz: Family::default(),
            livez: Family::default(),
            sync_failures: Family::default(),
        };
        for label in metrics.labels() {
            drop(metrics.sync_duration.get_or_create(&label));
            drop(metrics.sync_full_duration.get_or_create(&label));
            drop(metrics.sync_partial_duration.get_or_create(&label));
            drop(metrics.last_sync.get_or_create(&label));
            drop(metrics.last_queued.get_or_create(&label));
            drop(metrics.network_programming.get_or_create(&label));
            drop(metrics.sync_failures.get_or_create(&label));
            for traffic_policy in ["internal", "external"] {
                drop(metrics.no_local_endpoints.get_or_create(&PolicyLabel {
                    ip_family: label.ip_family,
                    traffic_policy,
                }));
            }
        }
        metrics
    }

    fn labels(&self) -> impl Iterator<Item = FamilyLabel> + '_ {
        self.families.iter().map(|f| FamilyLabel {
            ip_family: f.api_name(),
        })
    }

    /// Registers under `registry` (prefixed `kubeproxy`) what `mode` registers,
    /// with upstream's help texts (all its metrics are ALPHA).
    pub fn register(&self, registry: &mut Registry, mode: ProxyMode) {
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "[ALPHA] SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        registry.register(
            "sync_full_proxy_rules_duration_seconds",
            "[ALPHA] SyncProxyRules latency in seconds for full resyncs",
            self.sync_full_duration.clone(),
        );
        registry.register(
            "sync_partial_proxy_rules_duration_seconds",
            "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
            self.sync_partial_duration.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "[ALPHA] The last time proxy rules were successfully synced",
            self.last_sync.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "[ALPHA] The last time a sync of proxy rules was queued",
            self.last_queued.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "[ALPHA] In Cluster Network Programming Latency in seconds",
            self.network_programming.clone(),
        );
        registry.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "[ALPHA] Pending proxy rules Endpoint changes",
            self.endpoint_changes_pending.clone(),
        );
        registry.register(
            "sync_proxy_rules_endpoint_changes",
            "[ALPHA] Cumulative proxy rules Endpoint changes",
            self.endpoint_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_service_changes_pending",
            "[ALPHA] Pending proxy rules Service changes",
            self.service_changes_pending.clone(),
        );
        registry.register(
            "sync_proxy_rules_service_changes",
            "[ALPHA] Cumulative proxy rules Service changes",
            self.service_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "[ALPHA] Number of services with a Local traffic policy and no endpoints",
            self.no_local_endpoints.clone(),
        );
        registry.register(
            "proxy_healthz",
            "[ALPHA] Cumulative proxy healthz HTTP status",
            self.healthz.clone(),
        );
        registry.register(
            "proxy_livez",
            "[ALPHA] Cumulative proxy livez HTTP status",
            self.livez.clone(),
        );
        let (name, help) = match mode {
            ProxyMode::Ebpf => (
                "ebpf_sync_errors",
                "Syncs of the eBPF maps that failed (the next sync is full)",
            ),
            ProxyMode::Nftables => (
                "sync_proxy_rules_nftables_sync_failures",
                "[ALPHA] Cumulative proxy nftables sync failures",
            ),
            ProxyMode::Iptables | ProxyMode::Ipvs => (
                "sync_proxy_rules_iptables_restore_failures",
                "[ALPHA] Cumulative proxy iptables restore failures",
            ),
        };
        registry.register(name, help, self.sync_failures.clone());
    }

    /// One answer of `/healthz` (`livez: false`) or `/livez`.
    pub fn health_answered(&self, livez: bool, status: u16) {
        let code = if status == 200 { "200" } else { "503" };
        let family = if livez { &self.livez } else { &self.healthz };
        family.get_or_create(&CodeLabel { code }).inc();
    }

    fn queued_now(&self) {
        let now = unix_seconds(SystemTime::now());
        for label in self.labels() {
            self.last_queued.get_or_create(&label).set(now);
        }
    }

    fn count_no_local_endpoints(&self, report: &SyncReport<'_>) {
        let mut counts = self.no_local.lock().unwrap_or_else(|e| e.into_inner());
        counts.update(report.desired, report.changes);
        for family in self.families.iter().filter(|f| report.synced(**f)) {
            let (internal, external) = counts.get(*family);
            for (traffic_policy, count) in [("internal", internal), ("external", external)] {
                self.no_local_endpoints
                    .get_or_create(&PolicyLabel {
                        ip_family: family.api_name(),
                        traffic_policy,
                    })
                    .set(count);
            }
        }
    }
}

impl SyncObserver for ProxyMetrics {
    fn loop_started(&self) {
        self.queued_now();
    }

    fn queued(&self) {
        self.queued_now();
    }

    fn tracker(&self, event: TrackerEvent) {
        match event {
            TrackerEvent::Service { pending } => {
                self.service_changes.inc();
                self.service_changes_pending
                    .set(i64::try_from(pending).unwrap_or(i64::MAX));
            }
            TrackerEvent::Slice { changed } => {
                self.endpoint_changes.inc();
                if changed {
                    self.endpoint_changes_pending.inc();
                }
            }
        }
    }

    fn applied(&self) {
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
    }

    fn synced(&self, report: &SyncReport<'_>) {
        let seconds = report.took.as_secs_f64();
        let now = SystemTime::now();
        // One sync writes both families: each is reported as upstream's
        // proxier of that family reports itself.
        for family in &self.families {
            let label = FamilyLabel {
                ip_family: family.api_name(),
            };
            self.sync_duration.get_or_create(&label).observe(seconds);
            let kind = if report.changes.full {
                &self.sync_full_duration
            } else {
                &self.sync_partial_duration
            };
            kind.get_or_create(&label).observe(seconds);
            if report.synced(*family) {
                self.last_sync.get_or_create(&label).set(unix_seconds(now));
            }
            if report.counted.contains(*family) {
                self.sync_failures.get_or_create(&label).inc();
            }
        }
        for (family, at) in report.trigger_times {
            if self.families.contains(family) && report.synced(*family) {
                let latency = now.duration_since(*at).unwrap_or(Duration::ZERO);
                self.network_programming
                    .get_or_create(&FamilyLabel {
                        ip_family: family.api_name(),
                    })
                    .observe(latency.as_secs_f64());
            }
        }
        self.count_no_local_endpoints(report);
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}
