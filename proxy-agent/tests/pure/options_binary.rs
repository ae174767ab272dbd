//! The built binary: exit codes and one-line errors (before anything touches the node),
//! --version, --help, --write-config-to. Its start-up on a node is in the e2e tier.

use crate::options_common::{TempDir, run};

#[test]
fn bad_input_exits_1_with_one_line() {
    let dir = TempDir::new("bin");
    // A type error: an unknown field (`masqueradeBit` at the top level) only earns a warning,
    // as upstream, and the agent would start.
    let bad_file = dir.file("c.yaml", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBit: three\n");
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
            "iptables.masqueradeBit",
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
