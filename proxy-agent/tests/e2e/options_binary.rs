//! The built binary on a node: --init-only in a test namespace, with the start-up checks.
//! The rest is in the pure tier.

use std::process::Command;

use crate::cleanup_common::NetNs;
use crate::options_common::BIN;

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

/// §3.3 at start-up, in a test namespace (`--init-only`): the nodePortAddresses warning is
/// logged, and a specific IPv6 bindAddress makes the ebpf mode, which serves both families,
/// run IPv6-primary. (On a kernel without IPv6 that would be fatal: the pure tier.)
#[test]
fn startup_checks_warn_and_the_ebpf_mode_runs_ipv6_primary() {
    let ns = NetNs::new();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, BIN, "--init-only"])
        .args(["--proxy-mode=ebpf", "--bind-address=fd00::1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Kube-proxy configuration may be incomplete or incorrect")
            && err.contains("nodePortAddresses is unset"),
        "{err}"
    );
    assert!(
        err.contains("kube-proxy running in dual-stack mode (primary ipFamily IPv6)"),
        "{err}"
    );
}
