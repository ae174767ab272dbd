//! Reading --config / --ebpf-config files: YAML and JSON, unknown and duplicate fields
//! (lenient upstream, strict in ours), kind checks,
//! the real-world example of seed 004.

use crate::options_common::*;
use proxy_agent::options::{OptionsError, ProxyMode};

#[test]
fn seed_004_example_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/pure/options_fixtures/seed004-kube-proxy-config.yaml"
    );
    let o = opts_with(&["--config", path], &[ProxyMode::Ipvs, ProxyMode::Iptables]);
    assert_eq!(o.mode, ProxyMode::Ipvs);
    assert_eq!(o.config.ipvs.scheduler, "rr");
    assert_eq!(o.config.cluster_cidr, "192.168.201.0/24");
    assert_eq!(o.config.healthz_bind_address, "127.0.0.1:10256");
    assert_eq!(
        o.config.client_connection.kubeconfig,
        "/var/lib/kube-proxy/kubeconfig.conf"
    );
    assert_eq!(o.config.node_port_addresses, ["192.168.201.0/24"]);
    assert!(o.config.ipvs.exclude_cidrs.is_empty(), "excludeCIDRs: null");
    assert_eq!(
        o.min_sync_period().to_string(),
        "0s",
        "ipvs.minSyncPeriod from the file"
    );
    assert_eq!(
        o.config.detect_local_mode, "ClusterCIDR",
        "blank -> platform default"
    );
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("udpIdleTimeout") && w.contains("removed")),
        "the removed field is reported: {:?}",
        o.warnings
    );
}

#[test]
fn json_files_load() {
    let dir = TempDir::new("json");
    let p = dir.file(
        "c.json",
        r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"nftables","conntrack":{"maxPerCore":0},"featureGates":{"LoggingBetaOptions":false}}"#,
    );
    let o = opts(&["--config", p.to_str().unwrap()]);
    assert_eq!(o.mode, ProxyMode::Nftables);
    assert_eq!(o.config.conntrack.max_per_core, Some(0));
    assert_eq!(
        o.config.feature_gates.get("LoggingBetaOptions"),
        Some(&false)
    );
}

/// The warnings about lenient decoding in `o`.
fn lenient_warnings(o: &proxy_agent::options::ProxyOptions) -> Vec<&String> {
    o.warnings
        .iter()
        .filter(|w| w.contains("Using lenient decoding as strict decoding failed"))
        .collect()
}

#[test]
fn unknown_fields_load_with_one_warning_naming_paths_and_file() {
    // Upstream decodes strictly first and, when that fails on unknown fields, leniently with a
    // warning (config_rules.md §3 step 4b, §4 "file contains an unknown field").
    let dir = TempDir::new("unknown");
    let path = config_file(
        &dir,
        "iptables:\n  masqueradeBitt: 3\n  syncPeriod: 7s\nfoo: bar\nlogging:\n  vmodule:\n  - filePattern: a\n    level: 2\n",
    );
    let o = opts(&["--config", &path]);
    assert_eq!(o.config.iptables.sync_period.to_string(), "7s");
    assert_eq!(o.config.iptables.masquerade_bit, Some(14), "ignored");
    assert_eq!(o.config.logging.vmodule[0].file_pattern, "a");
    let warned = lenient_warnings(&o);
    assert_eq!(warned.len(), 1, "one warning: {:?}", o.warnings);
    let w = warned[0];
    assert!(w.contains(&format!("config file {path:?}")), "{w}");
    assert!(
        w.contains(
            "unknown field \"iptables.masqueradeBitt\" (did you mean \"iptables.masqueradeBit\"?)"
        ),
        "{w}"
    );
    assert!(w.contains("unknown field \"foo\""), "{w}");
    assert!(
        w.contains("unknown field \"logging.vmodule[0].level\""),
        "{w}"
    );
    assert!(!w.contains('\n'), "{w:?}");
    // a clean file: no such warning
    let path = config_file(&dir, "mode: iptables\n");
    assert!(lenient_warnings(&opts(&["--config", &path])).is_empty());
}

#[test]
fn duplicate_fields_take_the_last_value_with_a_warning() {
    let dir = TempDir::new("duplicate");
    let path = config_file(
        &dir,
        "mode: ipvs\niptables:\n  syncPeriod: 5s\n  syncPeriod: 6s\nmode: iptables\nbogus: 1\n",
    );
    let o = opts(&["--config", &path]);
    assert_eq!(o.mode, ProxyMode::Iptables);
    assert_eq!(o.config.iptables.sync_period.to_string(), "6s");
    let warned = lenient_warnings(&o);
    assert_eq!(warned.len(), 1, "one warning: {:?}", o.warnings);
    let w = warned[0];
    assert!(w.contains(&path), "{w}");
    assert!(w.contains("duplicate field \"iptables.syncPeriod\""), "{w}");
    assert!(w.contains("duplicate field \"mode\""), "{w}");
    assert!(w.contains("unknown field \"bogus\""), "{w}");
    // JSON too
    let p = dir.file(
        "c.json",
        r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","oomScoreAdj":1,"oomScoreAdj":2}"#,
    );
    let o = opts(&["--config", p.to_str().unwrap()]);
    assert_eq!(o.config.oom_score_adj, Some(2));
    assert!(lenient_warnings(&o)[0].contains("duplicate field \"oomScoreAdj\""));
    // type errors stay fatal, as upstream (not a strict decoding error)
    let path = config_file(&dir, "bogus: 1\niptables:\n  masqueradeBit: fourteen\n");
    let e = try_parse(&["--config", &path]).unwrap_err();
    assert!(matches!(e, OptionsError::Decode { .. }), "{e}");
    assert!(e.to_string().contains("iptables.masqueradeBit"), "{e}");
}

#[test]
fn wrong_or_missing_kind() {
    let dir = TempDir::new("kind");
    let p = dir.file(
        "c.yaml",
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    );
    let e = try_parse(&["--config", p.to_str().unwrap()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("no kind \"KubeSchedulerConfiguration\" is registered"),
        "{e}"
    );
    let p = dir.file(
        "c.yaml",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
    );
    assert!(
        try_parse(&["--config", p.to_str().unwrap()])
            .unwrap_err()
            .to_string()
            .contains("no kind")
    );
    let p = dir.file("c.yaml", "mode: iptables\n");
    assert!(
        try_parse(&["--config", p.to_str().unwrap()])
            .unwrap_err()
            .to_string()
            .contains("Object 'Kind' is missing")
    );
    // upstream checks the kind first, then the version
    let p = dir.file("c.yaml", "kind: KubeProxyConfiguration\nmode: iptables\n");
    let e = try_parse(&["--config", p.to_str().unwrap()]).unwrap_err();
    assert!(matches!(e, OptionsError::MissingVersion { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "failed to decode config file {:?}: Object 'apiVersion' is missing",
            p
        )
    );
    let p = dir.file("c.yaml", "apiVersion: \"\"\nkind: KubeProxyConfiguration\n");
    assert!(
        try_parse(&["--config", p.to_str().unwrap()])
            .unwrap_err()
            .to_string()
            .contains("Object 'apiVersion' is missing")
    );
}

#[test]
fn yaml_syntax_errors_are_fatal() {
    let e = parse_file("bindAddress: ::\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("mapping values are not allowed in this context"),
        "{e}"
    );
    let e = parse_file("mode iptables\nfoo\n").unwrap_err();
    assert!(matches!(e, OptionsError::Decode { .. }), "{e}");
}

#[test]
fn type_errors_name_the_field() {
    let e = parse_file("iptables:\n  masqueradeBit: fourteen\n").unwrap_err();
    assert!(e.to_string().contains("iptables.masqueradeBit"), "{e}");
    let e = parse_file("configSyncPeriod: 15 minutes\n").unwrap_err();
    assert!(
        e.to_string().contains("configSyncPeriod") && e.to_string().contains("time: "),
        "{e}"
    );
    let e = parse_file("conntrack:\n  tcpCloseWaitTimeout: 60\n").unwrap_err();
    assert!(
        e.to_string().contains("conntrack.tcpCloseWaitTimeout"),
        "durations must be strings: {e}"
    );
    let e = parse_file("oomScoreAdj: 99999999999\n").unwrap_err();
    assert!(e.to_string().contains("oomScoreAdj"), "{e}");
    let e = parse_file("logging:\n  options:\n    text:\n      infoBufferSize: 1KB\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("logging.options.text.infoBufferSize"),
        "{e}"
    );
}

#[test]
fn unreadable_file() {
    let e = try_parse(&["--config", "/nonexistent/kube-proxy.yaml"]).unwrap_err();
    assert!(matches!(e, OptionsError::ReadFile { .. }));
    assert!(
        e.to_string().contains("/nonexistent/kube-proxy.yaml"),
        "{e}"
    );
}

#[test]
fn flush_frequency_accepts_nanoseconds_or_a_string() {
    let o = match parse_file("logging:\n  flushFrequency: 2000000000\n").unwrap() {
        proxy_agent::options::Parsed::Run(o) => o,
        other => panic!("{other:?}"),
    };
    assert_eq!(o.config.logging.flush_frequency.to_string(), "2s");
}

#[test]
fn ebpf_file_is_strict() {
    // Our own document stays strict: unknown and duplicate fields are errors.
    let dir = TempDir::new("ebpfdec");
    let p = dir.file(
        "e.yaml",
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nmaps:\n  service: 10\n",
    );
    let e = try_parse(&["--ebpf-config", p.to_str().unwrap()]).unwrap_err();
    assert!(
        matches!(e, OptionsError::UnknownField { ref field, ref suggestion, .. }
        if field == "maps.service" && suggestion.as_deref() == Some("maps.services")),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("unknown field \"maps.service\" in ebpf config file"),
        "{e}"
    );
    let p = dir.file(
        "e.yaml",
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nxdpMode: auto\nxdpMode: native\n",
    );
    let e = try_parse(&["--ebpf-config", p.to_str().unwrap()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("duplicate entry with key \"xdpMode\""),
        "{e}"
    );
    let p = dir.file("e.yaml", "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nxdpMode: turbo\n");
    let e = try_parse(&["--ebpf-config", p.to_str().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("xdpMode"), "{e}");
    // our extension kind is not accepted as --config (upstream file stays upstream)
    let e = try_parse(&["--config", p.to_str().unwrap()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("no kind \"EbpfDatapathConfiguration\""),
        "{e}"
    );
}
