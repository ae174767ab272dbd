//! `proxy-agent --cleanup` end to end, run inside a test network namespace (where `ip netns
//! exec` also gives it a fresh /sys, so no real BPF pin of the host is reachable).

use crate::cleanup_common::NetNs;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");

fn cleanup_in(ns: &NetNs) -> (i32, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, BIN, "--cleanup"])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cleanup_reports_removes_and_is_idempotent() {
    let ns = NetNs::new();
    let (code, out, err) = cleanup_in(&ns);
    assert_eq!((code, out.as_str()), (0, "nothing to clean up\n"), "{err}");

    ns.sh("nft", &["add", "table", "ip6", "kube-proxy"]);
    ns.sh("iptables", &["-t", "nat", "-N", "KUBE-NODEPORTS"]);
    ns.sh("iptables", &["-t", "filter", "-N", "KUBE-PROXY-FIREWALL"]);
    ns.sh(
        "iptables",
        &["-t", "filter", "-A", "INPUT", "-j", "KUBE-PROXY-FIREWALL"],
    );
    let (code, out, err) = cleanup_in(&ns);
    assert_eq!(code, 0, "{err}");
    for want in [
        "removed nftables table ip6 kube-proxy",
        "removed IPv4 iptables chain nat/KUBE-NODEPORTS",
        "removed IPv4 iptables chain filter/KUBE-PROXY-FIREWALL",
        "removed IPv4 iptables rule in filter: -A INPUT -j KUBE-PROXY-FIREWALL",
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "missing {want:?} in:\n{out}"
        );
    }
    assert!(!ns.sh("iptables-save", &[]).contains("KUBE-"));
    let (code, out, _) = cleanup_in(&ns);
    assert_eq!((code, out.as_str()), (0, "nothing to clean up\n"));
}
