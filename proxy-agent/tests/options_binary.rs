//! The built binary: exit codes and one-line errors (before anything touches the node),
//! --version, --help, --write-config-to.

mod options_common;
use options_common::TempDir;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_exits_1_with_one_line() {
    let dir = TempDir::new("bin");
    let bad_file = dir.file("c.yaml", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmasqueradeBit: 3\n");
    let invalid = dir.file("v.yaml", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 5000\n");
    for (args, needle) in [
        (vec!["--no-such-flag"], "--no-such-flag"),
        (vec!["--config-sync-period=soon"], "--config-sync-period"),
        (
            vec!["--healthz-bind-address=300.1.1.1:1"],
            "--healthz-bind-address",
        ),
        (
            vec!["--log-text-info-buffer-size=1KB"],
            "--log-text-info-buffer-size",
        ),
        (vec!["--cluster-cidr=10.0.0.0/99"], "clusterCIDR"),
        (vec!["--bind-address=1.2.3"], "bindAddress"),
        (
            vec!["--config", bad_file.to_str().unwrap()],
            "masqueradeBit",
        ),
        (
            vec!["--config", invalid.to_str().unwrap(), "--cleanup"],
            "failed validate: oomScoreAdj",
        ),
        (vec!["positional"], "does not take any arguments"),
    ] {
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr:?}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}

#[test]
fn version_and_help_exit_0() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(
        (code, out.trim_end().starts_with("Kubernetes v1.33.0")),
        (0, true),
        "{out}"
    );
    let (code, out, _) = run(&["--version=raw"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("version.Info{"), "{out}");
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--write-config-to") && out.contains("--ebpf-config"));
}

#[test]
fn write_config_to_exits_0_and_reloads() {
    let dir = TempDir::new("bin");
    let out = dir.path().join("kp.yaml");
    let ext = dir.path().join("ebpf.yaml");
    let (code, _, err) = run(&[
        "--write-config-to",
        out.to_str().unwrap(),
        "--ebpf-write-config-to",
        ext.to_str().unwrap(),
        "--proxy-mode=ipvs",
        "--ipvs-sync-period=40s",
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("mode: ipvs\n") && text.contains("syncPeriod: 40s\n"),
        "{text}"
    );
    // loading the written files back (and writing again) gives the same bytes
    let out2 = dir.path().join("kp2.yaml");
    let ext2 = dir.path().join("ebpf2.yaml");
    let (code, _, err) = run(&[
        "--config",
        out.to_str().unwrap(),
        "--ebpf-config",
        ext.to_str().unwrap(),
        "--write-config-to",
        out2.to_str().unwrap(),
        "--ebpf-write-config-to",
        ext2.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text, std::fs::read_to_string(&out2).unwrap());
    assert_eq!(
        std::fs::read_to_string(&ext).unwrap(),
        std::fs::read_to_string(&ext2).unwrap()
    );
}

#[path = "cleanup_common/mod.rs"]
mod cleanup_common;

#[test]
fn init_only_sets_the_mode_sysctls_and_exits_0() {
    // Inside a test namespace; route_localnet and the conntrack timeouts are per-namespace.
    let ns = cleanup_common::NetNs::new();
    let read = |k: &str| {
        ns.sh("cat", &[&format!("/proc/sys/{k}")])
            .trim()
            .to_string()
    };
    ns.sh(
        "sysctl",
        &["-q", "-w", "net.ipv4.conf.all.route_localnet=0"],
    );
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            BIN,
            "--init-only",
            "--proxy-mode=iptables",
            "--conntrack-max-per-core=0",
        ])
        .args([
            "--conntrack-tcp-timeout-established=2h",
            "--conntrack-tcp-timeout-close-wait=0",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read("net/ipv4/conf/all/route_localnet"), "1");
    assert_eq!(
        read("net/netfilter/nf_conntrack_tcp_timeout_established"),
        "7200"
    );
}

#[test]
fn startup_checks_warn_and_stop_before_touching_the_node() {
    // §3.3 at start-up: the nodePortAddresses warning is logged, and a primary family the
    // datapath cannot serve (our ebpf datapath is IPv4-only) stops the agent with upstream's
    // error before any leftover cleanup, sysctl or datapath load.
    let dir = TempDir::new("bin");
    let (code, _, err) = run(&[
        "--proxy-mode=ebpf",
        "--bind-address=fd00::1",
        "--manifests",
        dir.path().to_str().unwrap(),
    ]);
    if err.contains("can't use the ebpf proxier") {
        eprintln!("skipped: this host cannot run the ebpf mode: {err}");
        return;
    }
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Kube-proxy configuration may be incomplete or incorrect")
            && err.contains("nodePortAddresses is unset"),
        "{err}"
    );
    assert!(
        err.lines()
            .last()
            .unwrap()
            .contains("no support for primary IP family \"IPv6\""),
        "{err}"
    );
}
