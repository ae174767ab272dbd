//! Flag vs file precedence (config_rules.md §3 step 4, §3.1, §4).

use crate::options_common::*;
use proxy_agent::options::{OptionsError, ProxyMode};

#[test]
fn iptables_sync_flag_applies_to_nftables_mode() {
    let o = opts(&["--proxy-mode=nftables", "--iptables-sync-period=10s"]);
    assert_eq!(o.sync_period().to_string(), "10s");
    let o = opts(&["--proxy-mode=nftables", "--iptables-min-sync-period=3s"]);
    assert_eq!(o.min_sync_period().to_string(), "3s");
}

#[test]
fn iptables_sync_flag_is_ignored_in_ipvs_mode() {
    let o = opts(&["--proxy-mode=ipvs", "--iptables-sync-period=10s"]);
    assert_eq!(o.sync_period().to_string(), "30s");
    let o = opts(&[
        "--proxy-mode=ipvs",
        "--ipvs-sync-period=7s",
        "--ipvs-min-sync-period=2s",
    ]);
    assert_eq!(
        (o.sync_period().to_string(), o.min_sync_period().to_string()),
        ("7s".into(), "2s".into())
    );
    let o = opts(&["--proxy-mode=iptables", "--ipvs-sync-period=7s"]);
    assert_eq!(
        o.sync_period().to_string(),
        "30s",
        "ipvs flags only count in ipvs mode"
    );
}

#[test]
fn healthz_port_zero_turns_the_server_off() {
    let o = opts(&["--healthz-port=0"]);
    assert_eq!(o.config.healthz_bind_address, "");
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("--healthz-port has been deprecated")),
        "{:?}",
        o.warnings
    );
    let o = opts(&["--metrics-port=0"]);
    assert_eq!(o.config.metrics_bind_address, "");
}

#[test]
fn explicit_bind_port_beats_deprecated_port_flag() {
    let o = opts(&[
        "--healthz-bind-address=1.2.3.4:12345",
        "--healthz-port=23456",
    ]);
    assert_eq!(o.config.healthz_bind_address, "1.2.3.4:12345");
    let o = opts(&["--healthz-bind-address=1.2.3.4", "--healthz-port=23456"]);
    assert_eq!(
        o.config.healthz_bind_address, "1.2.3.4:23456",
        "port appended to a bare address"
    );
}

#[test]
fn deprecated_ports_are_not_applied_with_write_config_to() {
    let dir = TempDir::new("prec");
    let out = dir.path().join("out.yaml");
    let o = opts(&[
        "--healthz-port=0",
        "--write-config-to",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.config.healthz_bind_address, "0.0.0.0:10256");
}

#[test]
fn file_wins_over_config_flags_but_logging_flags_win_over_file() {
    let dir = TempDir::new("prec");
    let path = config_file(
        &dir,
        "mode: ipvs\nipvs:\n  scheduler: wrr\nlogging:\n  verbosity: 2\n  vmodule:\n  - filePattern: foo.go\n    verbosity: 6\n  - filePattern: bar.go\n    verbosity: 8\n",
    );
    let o = opts(&[
        "--config",
        &path,
        "--ipvs-scheduler=rr",
        "-v=7",
        "--vmodule",
        "goo.go=8",
        "--proxy-mode=iptables",
    ]);
    assert_eq!(o.config.ipvs.scheduler, "wrr", "flag ignored with --config");
    assert_eq!(o.mode, ProxyMode::Ipvs);
    assert_eq!(o.config.logging.verbosity, 7, "logging flag wins");
    let vm: Vec<(String, u32)> = o
        .config
        .logging
        .vmodule
        .iter()
        .map(|i| (i.file_pattern.clone(), i.verbosity))
        .collect();
    assert_eq!(
        vm,
        [
            ("goo.go".into(), 8),
            ("foo.go".into(), 6),
            ("bar.go".into(), 8)
        ]
    );
    let ignored = o
        .warnings
        .iter()
        .find(|w| w.contains("ignored because --config"))
        .expect("warning");
    assert!(
        ignored.contains("--ipvs-scheduler") && ignored.contains("--proxy-mode"),
        "{ignored}"
    );
    assert!(
        !ignored.contains("--v") && !ignored.contains("--vmodule"),
        "{ignored}"
    );
}

#[test]
fn logging_flags_only_win_when_given() {
    let dir = TempDir::new("prec");
    let path = config_file(&dir, "logging:\n  verbosity: 3\n  flushFrequency: 9s\n");
    let o = opts(&["--config", &path]);
    assert_eq!(o.config.logging.verbosity, 3);
    assert_eq!(o.config.logging.flush_frequency.to_string(), "9s");
    let o = opts(&["--config", &path, "--log-flush-frequency=1s"]);
    assert_eq!(o.config.logging.flush_frequency.to_string(), "1s");
}

#[test]
fn every_config_flag_is_silenced_by_config() {
    let dir = TempDir::new("prec");
    let path = config_file(&dir, "");
    let o = opts(&[
        "--config",
        &path,
        "--masquerade-all",
        "--conntrack-min=5",
        "--kube-api-qps=50",
        "--kubeconfig=/x",
        "--config-sync-period=1m",
        "--bind-address-hard-fail",
        "--oom-score-adj=10",
        "--cluster-cidr=10.0.0.0/8",
    ]);
    assert!(!o.config.iptables.masquerade_all);
    assert_eq!(o.config.conntrack.min, Some(131072));
    assert_eq!(o.config.client_connection.qps, 5.0);
    assert_eq!(o.config.client_connection.kubeconfig, "");
    assert_eq!(o.config.config_sync_period.to_string(), "15m0s");
    assert!(!o.config.bind_address_hard_fail);
    assert_eq!(o.config.oom_score_adj, Some(-999));
    assert_eq!(o.config.cluster_cidr, "");
}

#[test]
fn hostname_override_flag_beats_file_and_is_normalised() {
    let dir = TempDir::new("prec");
    let path = config_file(&dir, "hostnameOverride: foo\n");
    assert_eq!(opts(&["--config", &path]).node_name, "foo");
    let o = opts(&["--config", &path, "--hostname-override=  BAR "]);
    assert_eq!(o.node_name, "bar");
    assert_eq!(o.config.hostname_override, "bar");
    assert!(matches!(
        err(&["--hostname-override=   "]),
        OptionsError::EmptyHostnameOverride
    ));
    assert_eq!(
        err(&["--hostname-override=   "]).to_string(),
        "empty hostname-override is invalid"
    );
}

#[test]
fn masquerade_all_follows_the_mode_section() {
    let dir = TempDir::new("prec");
    let path = config_file(
        &dir,
        "mode: nftables\niptables:\n  masqueradeAll: true\n  syncPeriod: 1m\nnftables:\n  masqueradeBit: 3\n",
    );
    let o = opts(&["--config", &path]);
    assert!(
        !o.masquerade_all(),
        "iptables.masqueradeAll is ignored in nftables mode"
    );
    assert_eq!(
        o.sync_period().to_string(),
        "30s",
        "iptables.syncPeriod is ignored in nftables mode"
    );
    assert_eq!(o.masquerade_bit(), 3);
    let o = opts(&["--proxy-mode=nftables", "--masquerade-all"]);
    assert!(o.masquerade_all(), "--masquerade-all reaches nftables too");
}

#[test]
fn ebpf_flags_override_the_ebpf_file() {
    let dir = TempDir::new("prec");
    let p = dir.file(
        "ebpf.yaml",
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nxdpMode: generic\nmaps:\n  services: 1000\n  backends: 2000\n",
    );
    let o = opts(&[
        "--ebpf-config",
        p.to_str().unwrap(),
        "--ebpf-map-size-services=3000",
    ]);
    assert_eq!(o.ebpf.maps.services, 3000);
    assert_eq!(o.ebpf.maps.backends, 2000);
    assert_eq!(
        o.ebpf.xdp_mode,
        proxy_agent::options::ebpf::XdpMode::Generic
    );
    // and the ebpf flags do not count as "ignored" upstream flags with --config
    let path = config_file(&dir, "");
    let o = opts(&[
        "--config",
        &path,
        "--ebpf-lb-algorithm=maglev",
        "--manifests=/tmp",
    ]);
    assert_eq!(
        o.ebpf.load_balancing.algorithm,
        proxy_agent::options::ebpf::LbAlgorithm::Maglev
    );
    assert!(
        !o.warnings.iter().any(|w| w.contains("ignored")),
        "{:?}",
        o.warnings
    );
    assert_eq!(o.manifests.as_deref(), Some(std::path::Path::new("/tmp")));
}

#[test]
fn cleanup_with_an_invalid_config_fails_before_anything() {
    let e = {
        let dir = TempDir::new("prec");
        let path = config_file(&dir, "oomScoreAdj: 5000\n");
        try_parse(&["--config", &path, "--cleanup"]).unwrap_err()
    };
    assert!(
        e.to_string().starts_with("failed validate: oomScoreAdj"),
        "{e}"
    );
}

#[test]
fn explicit_empty_bind_flags_turn_the_servers_off() {
    // Upstream lays flags over a defaulted configuration: an explicitly empty address stays
    // empty (server off) instead of being defaulted again. The help says "Set empty to disable".
    let o = opts(&["--healthz-bind-address=", "--metrics-bind-address=  "]);
    assert_eq!(o.config.healthz_bind_address, "");
    assert_eq!(o.config.metrics_bind_address, "");
    // not given at all: the defaults
    let o = opts(&[]);
    assert_eq!(o.config.healthz_bind_address, "0.0.0.0:10256");
}

#[test]
fn explicit_zero_sync_periods_reach_validation() {
    // A zero period given on the command line is not "unset": upstream rejects it.
    for (args, want) in [
        (
            &["--iptables-sync-period=0"][..],
            "iptables.syncPeriod: Invalid value: 0s: must be greater than 0",
        ),
        (
            &["--proxy-mode=nftables", "--iptables-sync-period=0s"][..],
            "nftables.syncPeriod: Invalid value: 0s: must be greater than 0",
        ),
        (
            &["--proxy-mode=ipvs", "--ipvs-sync-period=0"][..],
            "ipvs.syncPeriod: Invalid value: 0s: must be greater than 0",
        ),
        (
            &["--config-sync-period=0"][..],
            "configSyncPeriod: Invalid value: 0s: must be greater than 0",
        ),
    ] {
        let e = err(args);
        assert!(e.to_string().contains(want), "{args:?}: {e}");
    }
    // the ipvs flag does not count outside ipvs mode, nor the iptables one in ipvs mode
    assert_eq!(
        opts(&["--ipvs-sync-period=0"]).sync_period().to_string(),
        "30s"
    );
    assert_eq!(
        opts(&["--proxy-mode=ipvs", "--iptables-sync-period=0"])
            .sync_period()
            .to_string(),
        "30s"
    );
}

#[test]
fn explicit_zero_min_sync_period_flag_is_kept() {
    // Flags are laid over a defaulted configuration: `--iptables-min-sync-period=0` syncs on
    // every change, while `minSyncPeriod: 0s` in a file is defaulted to 1s.
    let o = opts(&["--iptables-min-sync-period=0"]);
    assert_eq!(o.min_sync_period().to_string(), "0s");
    let o = opts_with(
        &["--proxy-mode=nftables", "--iptables-min-sync-period=0s"],
        &[ProxyMode::Nftables],
    );
    assert_eq!(o.min_sync_period().to_string(), "0s");
    // not given: the default; in ipvs mode the iptables flag does not count
    assert_eq!(opts(&[]).min_sync_period().to_string(), "1s");
    let o = opts_with(
        &["--proxy-mode=ipvs", "--iptables-min-sync-period=0"],
        &[ProxyMode::Ipvs],
    );
    assert_eq!(o.min_sync_period().to_string(), "1s");
}
