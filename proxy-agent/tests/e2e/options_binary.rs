//! The built binary on a node: --init-only in a test namespace, and the start-up checks of
//! the ebpf mode, which stop it before it touches the node. The rest is in the pure tier.

use std::process::Command;

use crate::cleanup_common::NetNs;
use crate::options_common::{BIN, TempDir, run};

#[test]
fn init_only_sets_the_mode_sysctls_and_exits_0() {
    init_only_sets_the_sysctls_of("iptables", "7200", "1");
}

/// Upstream sets the kernel's conntrack parameters in every mode; so does
/// the ebpf mode (the kernel still tracks what the BPF datapath does not
/// translate, such as hostPorts).
#[test]
fn the_ebpf_mode_sets_the_kernels_conntrack_parameters_too() {
    init_only_sets_the_sysctls_of("ebpf", "7200", "0");
}

/// `--init-only` in `mode` inside a test namespace (route_localnet and the
/// conntrack timeouts are per-namespace): the established timeout and
/// route_localnet as the mode sets them.
fn init_only_sets_the_sysctls_of(mode: &str, established: &str, route_localnet: &str) {
    let ns = NetNs::new();
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
            &format!("--proxy-mode={mode}"),
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
    assert_eq!(read("net/ipv4/conf/all/route_localnet"), route_localnet);
    assert_eq!(
        read("net/netfilter/nf_conntrack_tcp_timeout_established"),
        established
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
