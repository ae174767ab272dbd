//! Upstream's `kubeproxy_*` metrics: every name registered with its type,
//! labels and buckets as the mode registers it upstream, and values that
//! move with changes and syncs driven through the real sync engine.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Service;
use prometheus_client::registry::Registry;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::{
    metrics::{ProxyMetrics, proxy::network_programming_buckets},
    model::{DesiredState, FamilySet, IpFamily},
    options::ProxyMode,
    sources::SourceEvent,
    sync::{
        FamilySyncError, Proxier, RulesRefused, SourceState, SyncChanges, Syncer, sync_each_family,
    },
};
use serde_json::json;

const NODE: &str = "node-a";

/// A scrape, parsed: `# TYPE` per metric family, and each sample's value by
/// its full text before the value (`name{labels}`).
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, f64>,
}

fn scrape(registry: &Registry) -> Scrape {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    let mut types = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            samples.insert(series.to_owned(), value.parse().unwrap());
        }
    }
    Scrape { types, samples }
}

impl Scrape {
    fn value(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no sample {series}; have {:#?}", self.samples.keys()))
    }
}

fn registry_for(metrics: &ProxyMetrics, mode: ProxyMode) -> Registry {
    let mut registry = Registry::with_prefix("kubeproxy");
    metrics.register(&mut registry, mode);
    registry
}

#[test]
fn every_upstream_metric_is_registered_with_its_type_labels_and_buckets() {
    let metrics = ProxyMetrics::new(vec![IpFamily::V4]);
    metrics.health_answered(false, 200);
    metrics.health_answered(true, 503);
    let s = scrape(&registry_for(&metrics, ProxyMode::Ebpf));
    // OpenMetrics names a counter family without its `_total` suffix.
    let expected = [
        ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "histogram",
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "histogram",
        ),
        ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
        (
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "gauge",
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "histogram",
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "gauge",
        ),
        ("kubeproxy_sync_proxy_rules_endpoint_changes", "counter"),
        (
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "gauge",
        ),
        ("kubeproxy_sync_proxy_rules_service_changes", "counter"),
        (
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "gauge",
        ),
        ("kubeproxy_proxy_healthz", "counter"),
        ("kubeproxy_proxy_livez", "counter"),
        ("kubeproxy_ebpf_sync_errors", "counter"),
    ];
    for (name, kind) in expected {
        assert_eq!(s.types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    // Samples as Prometheus stores them, labels included.
    for series in [
        r#"kubeproxy_sync_proxy_rules_endpoint_changes_total"#,
        r#"kubeproxy_sync_proxy_rules_service_changes_total"#,
        r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#,
        r#"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}"#,
        r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}"#,
        r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}"#,
        r#"kubeproxy_proxy_healthz_total{code="200"}"#,
        r#"kubeproxy_proxy_livez_total{code="503"}"#,
        r#"kubeproxy_ebpf_sync_errors_total{ip_family="IPv4"}"#,
        r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}"#,
    ] {
        s.value(series);
    }
    // Buckets: 0.001 × 2^n, 15 of them, then +Inf.
    let sync_buckets: Vec<String> = (0..15)
        .map(|n| format!("{}", 0.001 * 2f64.powi(n)))
        .chain(["+Inf".to_owned()])
        .collect();
    for le in &sync_buckets {
        s.value(&format!(
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le="{le}",ip_family="IPv4"}}"#
        ));
    }
    let count = |prefix: &str| s.samples.keys().filter(|k| k.starts_with(prefix)).count();
    assert_eq!(
        count("kubeproxy_sync_proxy_rules_duration_seconds_bucket{"),
        16
    );
    // Upstream's merge(make([]float64, 1), ...): a zero bucket first.
    let programming = network_programming_buckets();
    assert_eq!(programming.len(), 1 + 2 + 59 + 12 + 7);
    assert_eq!(
        (
            programming[0],
            programming[1],
            programming[2],
            programming[3],
            programming[61]
        ),
        (0.0, 0.25, 0.5, 1.0, 59.0)
    );
    assert_eq!(
        (
            programming[62],
            programming[73],
            programming[74],
            programming[80]
        ),
        (60.0, 115.0, 120.0, 300.0)
    );
    assert_eq!(
        count("kubeproxy_network_programming_duration_seconds_bucket{"),
        programming.len() + 1
    );
}

#[test]
fn each_mode_registers_its_own_failure_counter_only() {
    let metrics = ProxyMetrics::new(vec![IpFamily::V4]);
    let has = |mode, name: &str| {
        scrape(&registry_for(&metrics, mode))
            .types
            .contains_key(name)
    };
    let nft = "kubeproxy_sync_proxy_rules_nftables_sync_failures";
    let ipt = "kubeproxy_sync_proxy_rules_iptables_restore_failures";
    assert!(has(ProxyMode::Nftables, nft) && !has(ProxyMode::Nftables, ipt));
    assert!(has(ProxyMode::Iptables, ipt) && !has(ProxyMode::Iptables, nft));
    assert!(has(ProxyMode::Ipvs, ipt));
    assert!(!has(ProxyMode::Ebpf, ipt) && !has(ProxyMode::Ebpf, nft));
}

#[derive(Clone, Default)]
struct Flaky {
    fail_next: Arc<Mutex<bool>>,
}

#[derive(Debug, thiserror::Error)]
#[error("injected")]
struct Injected;

impl Proxier for Flaky {
    type Error = Injected;
    fn sync(&mut self, _: &DesiredState, _: &SyncChanges) -> Result<(), Injected> {
        if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
            Err(Injected)
        } else {
            Ok(())
        }
    }
}

fn service(name: &str, itp: &str, etp: Option<&str>) -> SourceEvent {
    let mut spec = json!({
        "clusterIP": "198.19.0.10", "clusterIPs": ["198.19.0.10"],
        "internalTrafficPolicy": itp,
        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "nodePort": 30080}]
    });
    if let Some(etp) = etp {
        spec["type"] = json!("NodePort");
        spec["externalTrafficPolicy"] = json!(etp);
    }
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec}),
    )
    .unwrap();
    SourceEvent::ServiceApplied(Box::new(svc))
}

fn slice(service: &str, node: &str, trigger: Option<SystemTime>) -> SourceEvent {
    let mut meta = json!({"name": format!("{service}-1"), "namespace": "ns",
                          "labels": {"kubernetes.io/service-name": service}});
    if let Some(at) = trigger {
        let at = jiff::Timestamp::try_from(at).unwrap().to_string();
        meta["annotations"] = json!({"endpoints.kubernetes.io/last-change-trigger-time": at});
    }
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": meta, "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["198.18.2.10"], "nodeName": node}]
    }))
    .unwrap();
    SourceEvent::SliceApplied(Box::new(slice))
}

#[test]
fn values_move_with_changes_and_syncs() {
    let metrics = Arc::new(ProxyMetrics::new(vec![IpFamily::V4]));
    let registry = registry_for(&metrics, ProxyMode::Ebpf);
    let source = Arc::new(Mutex::new(SourceState::new(NODE)));
    let proxier = Flaky::default();
    let mut syncer = Syncer::new(source.clone(), proxier.clone(), Duration::from_secs(3600))
        .with_observer(metrics.clone());
    let feed = |event| {
        source
            .lock()
            .unwrap()
            .handle_observed(event, metrics.as_ref())
    };
    feed(SourceEvent::ServicesSynced);
    feed(SourceEvent::SlicesSynced);
    // Endpoints only on node-b: iTP Local counts under internal, eTP Local under external.
    feed(service("internal-local", "Local", None));
    feed(service("external-local", "Cluster", Some("Local")));
    feed(service("no-endpoints", "Local", None));
    let s = scrape(&registry);
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_service_changes_total"),
        3.0
    );
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_service_changes_pending"),
        3.0
    );

    // From before the agent started: not its latency, as upstream.
    let before_start = SystemTime::now() - Duration::from_secs(60);
    std::thread::sleep(Duration::from_millis(10));
    feed(slice("internal-local", "node-b", Some(SystemTime::now())));
    feed(slice("external-local", "node-b", Some(before_start)));
    std::thread::sleep(Duration::from_millis(1100));
    let s = scrape(&registry);
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_endpoint_changes_total"),
        2.0
    );
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        2.0
    );

    syncer.sync().unwrap();
    let s = scrape(&registry);
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_service_changes_pending"),
        0.0
    );
    assert_eq!(
        s.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );
    let family = r#"{ip_family="IPv4"}"#;
    assert_eq!(
        s.value(&format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_count{family}"
        )),
        1.0
    );
    assert_eq!(
        s.value(&format!(
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{family}"
        )),
        1.0
    );
    let last = s.value(&format!(
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{family}"
    ));
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - last).abs() < 5.0, "last sync {last}, now {now}");
    // One trigger time counts: a little over 1.1 s of latency.
    assert_eq!(
        s.value(&format!(
            "kubeproxy_network_programming_duration_seconds_count{family}"
        )),
        1.0
    );
    let latency = s.value(&format!(
        "kubeproxy_network_programming_duration_seconds_sum{family}"
    ));
    assert!((1.1..3.0).contains(&latency), "{latency}");
    assert_eq!(
        s.value(
            r#"kubeproxy_network_programming_duration_seconds_bucket{le="1.0",ip_family="IPv4"}"#
        ),
        0.0
    );
    assert_eq!(
        s.value(
            r#"kubeproxy_network_programming_duration_seconds_bucket{le="3.0",ip_family="IPv4"}"#
        ),
        1.0
    );
    // "no-endpoints" has none anywhere: rejected, not counted.
    assert_eq!(
        s.value(r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}"#),
        1.0
    );
    assert_eq!(
        s.value(r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}"#),
        1.0
    );

    // A local endpoint appears: nothing lacks one any more. The sync fails first.
    feed(slice("internal-local", NODE, None));
    *proxier.fail_next.lock().unwrap() = true;
    assert!(syncer.sync().is_err());
    let s = scrape(&registry);
    assert_eq!(
        s.value(&format!("kubeproxy_ebpf_sync_errors_total{family}")),
        1.0
    );
    assert_eq!(
        s.value(&format!(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{family}"
        )),
        1.0,
        "failed syncs are timed too"
    );
    assert_eq!(
        s.value(&format!(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{family}"
        )),
        last,
        "only a successful sync moves the last sync time"
    );
    syncer.sync().unwrap();
    let s = scrape(&registry);
    assert_eq!(
        s.value(r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}"#),
        0.0
    );
    assert_eq!(
        s.value(&format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_count{family}"
        )),
        3.0
    );
}

/// Writes IPv4's rules and fails IPv6's, as a rule mode's sync does when
/// one family's restore is refused (`refused`), or a step before it failed.
struct FailsIpv6 {
    refused: bool,
}

impl Proxier for FailsIpv6 {
    type Error = FamilySyncError;
    fn sync(&mut self, _: &DesiredState, _: &SyncChanges) -> Result<(), FamilySyncError> {
        sync_each_family(&IpFamily::BOTH, |family| match family {
            IpFamily::V4 => Ok(()),
            IpFamily::V6 if self.refused => {
                Err(anyhow::anyhow!("exit status 2")).context(RulesRefused)
            }
            IpFamily::V6 => Err(anyhow::anyhow!("ip6tables -N KUBE-SERVICES failed")),
        })
    }
    fn failed_families(&self, error: &FamilySyncError) -> FamilySet {
        error.families()
    }
    fn counted_failures(&self, error: &FamilySyncError) -> FamilySet {
        error.refused()
    }
}

/// A family that failed keeps its last sync time and counts a failure of
/// its own when its rules were refused (upstream counts failed restores
/// only); the other reports its sync, as upstream's proxier per family.
#[test]
fn each_family_reports_its_own_sync() {
    for refused in [true, false] {
        let metrics = Arc::new(ProxyMetrics::new(IpFamily::BOTH.to_vec()));
        let registry = registry_for(&metrics, ProxyMode::Iptables);
        let source = Arc::new(Mutex::new(SourceState::new(NODE)));
        let proxier = FailsIpv6 { refused };
        let mut syncer = Syncer::new(source.clone(), proxier, Duration::from_secs(3600))
            .with_observer(metrics.clone());
        {
            let mut source = source.lock().unwrap();
            source.handle_observed(SourceEvent::ServicesSynced, metrics.as_ref());
            source.handle_observed(SourceEvent::SlicesSynced, metrics.as_ref());
        }
        assert!(syncer.sync().is_err());
        let s = scrape(&registry);
        let failures = |family: &str| {
            s.value(&format!(
                r#"kubeproxy_sync_proxy_rules_iptables_restore_failures_total{{ip_family="{family}"}}"#
            ))
        };
        let last = |family: &str| {
            s.value(&format!(
                r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family="{family}"}}"#
            ))
        };
        let counted = if refused { 1.0 } else { 0.0 };
        assert_eq!(
            (failures("IPv4"), failures("IPv6")),
            (0.0, counted),
            "refused: {refused}"
        );
        assert!(last("IPv4") > 1.7e9);
        assert_eq!(last("IPv6"), 0.0);
    }
}
