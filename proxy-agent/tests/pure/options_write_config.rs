//! `--write-config-to`: the written file is exactly the golden one, and loading it back gives
//! the identical configuration (config_rules.md §3 step 7).

use crate::options_common::*;
use proxy_agent::options::{ProxyMode, write};

const GOLDEN: &str = include_str!("options_fixtures/write-config-ipvs.golden.yaml");
const GOLDEN_EBPF: &str = include_str!("options_fixtures/write-ebpf-config.golden.yaml");

#[test]
fn golden_output_for_ipvs_flags() {
    let dir = TempDir::new("write");
    let out = dir.path().join("kube-proxy.yaml");
    let o = opts(&[
        "--write-config-to",
        out.to_str().unwrap(),
        "--proxy-mode=ipvs",
        "--hostname-override=Node-A",
        "--healthz-port=0",
    ]);
    assert_eq!(o.write_config_to.as_deref(), Some(out.as_path()));
    let text = write::to_yaml(&o.config);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/pure/options_fixtures/write-config-ipvs.golden.yaml"
            ),
            &text,
        )
        .unwrap();
    }
    assert_eq!(text, GOLDEN);
    assert!(text.contains("mode: ipvs\n"));
    assert!(text.contains("hostnameOverride: node-a\n"));
    assert!(
        text.contains("healthzBindAddress: 0.0.0.0:10256\n"),
        "--healthz-port is not applied here"
    );
    // the unified sync period is written only into the active mode's section
    assert!(
        text.contains("ipvs:\n  excludeCIDRs: null\n  minSyncPeriod: 1s\n"),
        "{text}"
    );
    assert!(
        text.contains("  minSyncPeriod: 0s\n  syncPeriod: 0s\n"),
        "{text}"
    );
}

#[test]
fn values_are_written_as_upstream_writes_them() {
    // Upstream's conversion leaves the inactive sections' minSyncPeriod a zero metav1.Duration,
    // written `0s`; `null` there would make upstream's decoder fail. Go writes float32 5 as
    // `5` and a nil slice as `null`.
    for mode in ["iptables", "nftables", "ipvs", "ebpf"] {
        let o = opts(&[&format!("--proxy-mode={mode}")]);
        let text = write::to_yaml(&o.config);
        assert!(!text.contains("minSyncPeriod: null"), "{mode}: {text}");
        assert!(!text.contains("syncPeriod: null"), "{mode}: {text}");
        assert!(text.contains("  qps: 5\n"), "{mode}: {text}");
        assert!(text.contains("  excludeCIDRs: null\n"), "{mode}: {text}");
        let v: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        for section in ["iptables", "ipvs", "nftables"] {
            let min = value_at(&v, &format!("{section}.minSyncPeriod"));
            assert!(
                min.is_string(),
                "{mode}: {section}.minSyncPeriod is {min:?}"
            );
        }
    }
    let text = write::to_yaml(&opts(&[]).config);
    assert!(text.contains("\nnodePortAddresses: null\n"), "{text}");
    let text = write::to_yaml(&opts(&["--kube-api-qps=7.5"]).config);
    assert!(text.contains("  qps: 7.5\n"), "{text}");
}

#[test]
fn only_the_active_sections_periods_and_masquerade_all_are_written() {
    // Upstream converts its internal config back to v1alpha1 with the unified SyncPeriod,
    // MinSyncPeriod and Linux.MasqueradeAll only in the active mode's section (config_rules §2).
    let dir = TempDir::new("write");
    let path = config_file(
        &dir,
        "mode: nftables\niptables:\n  masqueradeAll: true\n  syncPeriod: 1m\nnftables:\n  masqueradeAll: true\n  syncPeriod: 2m\n  minSyncPeriod: 3s\nipvs:\n  syncPeriod: 4m\n",
    );
    let o = opts(&["--config", &path]);
    let v: serde_yaml::Value = serde_yaml::from_str(&write::to_yaml(&o.config)).unwrap();
    let get = |p: &str| {
        serde_yaml::to_string(&value_at(&v, p))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(get("nftables.syncPeriod"), "2m0s");
    assert_eq!(get("nftables.minSyncPeriod"), "3s");
    assert_eq!(get("nftables.masqueradeAll"), "true");
    assert_eq!(get("iptables.syncPeriod"), "0s");
    assert_eq!(get("iptables.minSyncPeriod"), "0s");
    assert_eq!(get("iptables.masqueradeAll"), "false");
    assert_eq!(get("ipvs.syncPeriod"), "0s");
    assert_eq!(get("ipvs.minSyncPeriod"), "0s");
    // the running configuration itself is untouched
    assert!(o.config.iptables.masquerade_all);
    // ebpf uses the iptables section, like every mode but ipvs and nftables
    let o = opts_with(&["--proxy-mode=ebpf", "--iptables-sync-period=7s"], &[]);
    let v: serde_yaml::Value = serde_yaml::from_str(&write::to_yaml(&o.config)).unwrap();
    assert_eq!(value_at(&v, "iptables.syncPeriod").as_str(), Some("7s"));
    assert_eq!(value_at(&v, "nftables.syncPeriod").as_str(), Some("0s"));
}

#[test]
fn written_file_reloads_identically_in_every_mode() {
    let all = [
        ProxyMode::Ebpf,
        ProxyMode::Nftables,
        ProxyMode::Iptables,
        ProxyMode::Ipvs,
    ];
    for args in [
        &[][..],
        &["--proxy-mode=nftables", "--iptables-sync-period=10s"],
        &[
            "--proxy-mode=ipvs",
            "--ipvs-scheduler=wrr",
            "--ipvs-exclude-cidrs=10.0.0.0/8",
        ],
        &[
            "--proxy-mode=iptables",
            "--bind-address=fd00::1",
            "-v=4",
            "--vmodule=x.go=3",
            "--masquerade-all",
        ],
        &[
            "--feature-gates=LoggingAlphaOptions=true",
            "--log-text-split-stream",
            "--log-text-info-buffer-size=5Mi",
        ],
        &[
            "--kube-api-qps=7.5",
            "--nodeport-addresses=10.0.0.0/8",
            "--iptables-min-sync-period=2s",
        ],
    ] {
        let dir = TempDir::new("roundtrip");
        let out = dir.path().join("c.yaml");
        let mut a = args.to_vec();
        a.extend(["--write-config-to", out.to_str().unwrap()]);
        let first = opts_with(&a, &all);
        write::write_file(&out, &first.config).unwrap();
        let again = opts_with(&["--config", out.to_str().unwrap()], &[]);
        // Identical as written (the inactive sections' periods are defaulted again on load)
        // and in effect.
        assert_eq!(
            write::as_written(&again.config),
            write::as_written(&first.config),
            "{args:?}"
        );
        assert_eq!(again.mode, first.mode);
        assert_eq!(again.masquerade_all(), first.masquerade_all(), "{args:?}");
        assert_eq!(again.sync_period(), first.sync_period(), "{args:?}");
        assert_eq!(again.min_sync_period(), first.min_sync_period(), "{args:?}");
        // and writing it again gives the same bytes
        assert_eq!(
            write::to_yaml(&again.config),
            std::fs::read_to_string(&out).unwrap()
        );
    }
}

#[test]
fn seed_004_written_back_reloads_identically() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/pure/options_fixtures/seed004-kube-proxy-config.yaml"
    );
    let first = opts(&["--config", path]);
    let dir = TempDir::new("seed");
    let out = dir.path().join("c.yaml");
    write::write_file(&out, &first.config).unwrap();
    assert_eq!(
        opts(&["--config", out.to_str().unwrap()]).config,
        first.config
    );
}

#[test]
fn ebpf_extension_golden_and_reload() {
    let dir = TempDir::new("ebpfw");
    let out = dir.path().join("ebpf.yaml");
    let o = opts(&[
        "--ebpf-write-config-to",
        out.to_str().unwrap(),
        "--ebpf-lb-algorithm=maglev",
        "--ebpf-external-interfaces=eth0",
    ]);
    let text = write::to_yaml(&o.ebpf);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/pure/options_fixtures/write-ebpf-config.golden.yaml"
            ),
            &text,
        )
        .unwrap();
    }
    assert_eq!(text, GOLDEN_EBPF);
    write::write_file(&out, &o.ebpf).unwrap();
    let again = opts(&["--ebpf-config", out.to_str().unwrap()]);
    assert_eq!(again.ebpf, o.ebpf);
}

#[test]
fn unwritable_target_is_an_error() {
    let o = opts(&[]);
    let e =
        write::write_file(std::path::Path::new("/nonexistent-dir/x.yaml"), &o.config).unwrap_err();
    assert!(e.to_string().contains("/nonexistent-dir/x.yaml"), "{e}");
}
