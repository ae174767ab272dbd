//! The binary with capabilities dropped (`setpriv`, as root): one line naming
//! what is missing, exit 1; the steps that need none still work. Each run is
//! in a network and mount namespace of its own (`unshare`) with a fresh
//! /sys, so even a run that got further would reach no real interface,
//! firewall rule or BPF pin of this machine.

use std::{
    path::Path,
    process::{Command, Output},
};

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");

/// Runs the agent without the capabilities `drop` (setpriv's syntax:
/// `all`, or `bpf,net_admin`), with `args` after the usual node flags.
fn run_without(drop: &str, dir: &Path, args: &[&str]) -> Output {
    let dropped: String = drop
        .split(',')
        .map(|c| format!("-{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let script = r#"mount -t sysfs sysfs /sys && exec "$@""#;
    Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .args([
            "setpriv",
            &format!("--inh-caps={dropped}"),
            &format!("--bounding-set={dropped}"),
        ])
        .args(["--", BIN, "--hostname-override", "node-a", "--manifests"])
        .arg(dir)
        .arg("--ebpf-pin-root")
        .arg(dir.join("pins"))
        .arg("--ebpf-state-dir")
        .arg(dir.join("state"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("running unshare and setpriv")
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn without_any_capability_the_ebpf_mode_names_all_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_without("all", dir.path(), &["--proxy-mode", "ebpf", "--init-only"]);
    let lines = stderr_lines(&out);
    assert_eq!(out.status.code(), Some(1), "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        line.starts_with("error: missing capabilities for the ebpf mode: "),
        "{line}"
    );
    for (name, why) in [
        ("CAP_BPF", "(create the maps and load the programs)"),
        ("CAP_PERFMON", "(the verifier allows"),
        ("CAP_NET_ADMIN", "(load and attach TC and XDP programs"),
    ] {
        assert!(
            line.contains(&format!("{name} {why}")),
            "{name} missing in {line}"
        );
    }
    assert!(
        line.ends_with("; CAP_SYS_ADMIN also does for CAP_BPF and CAP_PERFMON"),
        "{line}"
    );
}

#[test]
fn root_without_bpf_and_net_admin_lacks_only_net_admin() {
    // CAP_SYS_ADMIN, still there, does for CAP_BPF (and CAP_PERFMON).
    let dir = tempfile::tempdir().unwrap();
    let out = run_without(
        "bpf,net_admin",
        dir.path(),
        &["--proxy-mode", "ebpf", "--init-only"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&out),
        [
            "error: missing capability for the ebpf mode: CAP_NET_ADMIN \
          (load and attach TC and XDP programs, remove other modes' rules)"
        ]
    );
}

#[test]
fn the_netfilter_modes_need_net_admin_and_net_raw() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_without(
        "net_admin,net_raw",
        dir.path(),
        &["--proxy-mode", "nftables"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&out),
        ["error: missing capabilities for the nftables mode: \
          CAP_NET_ADMIN (program netfilter and IPVS, and the conntrack settings), \
          CAP_NET_RAW (run iptables, whose legacy backend opens a raw socket)"]
    );
}

#[test]
fn help_version_write_config_and_cleanup_need_no_capability() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let config_flag = format!("--write-config-to={}", config.display());
    for args in [
        &["--version"][..],
        &["--help"],
        &["--proxy-mode", "ebpf", &config_flag],
    ] {
        let out = run_without("all", dir.path(), args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {:?}",
            stderr_lines(&out)
        );
    }
    assert!(config.exists());
    // The cleanup itself runs (and, without CAP_NET_ADMIN, cannot list nftables).
    let out = run_without("all", dir.path(), &["--proxy-mode", "ebpf", "--cleanup"]);
    let lines = stderr_lines(&out);
    assert!(
        !lines.iter().any(|l| l.contains("missing capabilit")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("tearing down")),
        "{lines:?}"
    );
}
