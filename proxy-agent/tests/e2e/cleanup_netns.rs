//! `--cleanup` against real iptables / ip6tables / iptables-legacy / nft state inside a network
//! namespace this test creates, and against real pins in a private bpffs.

use crate::cleanup_common::*;
use proxy_agent::cleanup::{FakeGenl, ProcessRunner, Removed, cleanup_all};
use proxy_agent::modes::ipvs::cleanup::reply;

/// A kernel without IPVS, as these test machines are (and never the root namespace's IPVS).
fn no_ipvs() -> FakeGenl {
    let mut g = FakeGenl::default();
    g.replies.push_back(vec![reply::ack(libc::ENOENT)]);
    g
}

fn install_leftovers(ns: &NetNs) {
    // upstream kube-proxy (iptables mode) + ours, nat table
    for args in [
        &["-t", "nat", "-N", "KUBE-SERVICES"][..],
        &["-t", "nat", "-N", "KUBE-SVC-ABCDEF"],
        &["-t", "nat", "-N", "KUBE-SEP-123456"],
        &["-t", "nat", "-N", "KUBE-POSTROUTING"],
        &["-t", "nat", "-N", "KUBE-MARK-MASQ"],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "198.18.0.10/32",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "KUBE-SVC-ABCDEF",
        ],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SVC-ABCDEF",
            "-j",
            "KUBE-SEP-123456",
        ],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SEP-123456",
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            "198.18.1.1:8080",
        ],
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            "KUBE-SERVICES",
        ],
        &["-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"],
        &["-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"],
        &["-t", "filter", "-N", "KUBE-FORWARD"],
        &["-t", "filter", "-A", "FORWARD", "-j", "KUBE-FORWARD"],
        // kubelet's chain and an unrelated one must survive
        &["-t", "filter", "-N", "KUBE-FIREWALL"],
        &["-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"],
        &["-t", "filter", "-N", "SOMEONE-ELSE"],
        &["-t", "filter", "-A", "INPUT", "-j", "SOMEONE-ELSE"],
    ] {
        ns.sh("iptables", args);
    }
    ns.sh("ip6tables", &["-t", "nat", "-N", "KUBE-SERVICES"]);
    ns.sh(
        "ip6tables",
        &["-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"],
    );
    ns.sh(
        "iptables-legacy",
        &["-t", "mangle", "-N", "KUBE-KUBELET-CANARY"],
    );
    ns.sh(
        "iptables-legacy",
        &["-t", "mangle", "-N", "KUBE-PROXY-CANARY"],
    );
    // nftables: upstream's tables, ours, and one that is not ours
    ns.sh("nft", &["add", "table", "ip", "kube-proxy"]);
    ns.sh("nft", &["add", "chain", "ip", "kube-proxy", "services"]);
    ns.sh("nft", &["add", "table", "ip6", "kube-proxy"]);
    ns.sh("nft", &["add", "table", "inet", "kube-ebpf-proxy"]);
    ns.sh("nft", &["add", "table", "inet", "someone-else"]);
    // a kube-ipvs0 that is not a dummy (this kernel has no dummy driver): must be left alone
    ns.sh("ip", &["link", "add", "kube-ipvs0", "type", "bridge"]);
}

fn kube_chains(ns: &NetNs, save: &str) -> Vec<String> {
    ns.sh(save, &[])
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-"))
        .map(str::to_string)
        .collect()
}

#[test]
fn removes_iptables_nftables_leftovers_and_is_idempotent() {
    let ns = NetNs::new();
    install_leftovers(&ns);
    let mut run = ProcessRunner {
        netns: Some(ns.name.clone()),
    };
    let missing_root =
        std::env::temp_dir().join(format!("no-such-pin-root-{}", std::process::id()));

    let report = cleanup_all(&mut run, &mut no_ipvs(), &missing_root);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let text: Vec<String> = report.removed.iter().map(|r| r.to_string()).collect();
    for want in [
        "IPv4 iptables chain nat/KUBE-SERVICES",
        "IPv4 iptables chain nat/KUBE-SVC-ABCDEF",
        "IPv4 iptables chain nat/KUBE-SEP-123456",
        "IPv4 iptables chain nat/KUBE-POSTROUTING",
        "IPv4 iptables chain nat/KUBE-MARK-MASQ",
        "IPv4 iptables chain filter/KUBE-FORWARD",
        "IPv6 iptables chain nat/KUBE-SERVICES",
        "IPv4 legacy iptables chain mangle/KUBE-PROXY-CANARY",
        "nftables table ip kube-proxy",
        "nftables table ip6 kube-proxy",
        "nftables table inet kube-ebpf-proxy",
    ] {
        assert!(
            text.iter().any(|t| t == want),
            "missing {want:?} in {text:#?}"
        );
    }
    let jumps = report
        .removed
        .iter()
        .filter(|r| matches!(r, Removed::IptablesRule { .. }))
        .count();
    assert_eq!(
        jumps, 5,
        "PREROUTING, OUTPUT, POSTROUTING, FORWARD (v4) and OUTPUT (v6) jumps: {text:#?}"
    );

    assert_eq!(
        kube_chains(&ns, "iptables-save"),
        ["KUBE-FIREWALL"],
        "kubelet's chain stays"
    );
    assert!(kube_chains(&ns, "ip6tables-save").is_empty());
    assert_eq!(
        kube_chains(&ns, "iptables-legacy-save"),
        ["KUBE-KUBELET-CANARY"]
    );
    let filter = ns.sh("iptables-save", &["-t", "filter"]);
    assert!(
        filter.contains("-A INPUT -j SOMEONE-ELSE") && filter.contains("-A INPUT -j KUBE-FIREWALL"),
        "{filter}"
    );
    let tables = ns.sh("nft", &["list", "tables"]);
    assert!(
        !tables.contains("kube-proxy") && !tables.contains("kube-ebpf-proxy"),
        "{tables}"
    );
    assert!(tables.contains("table inet someone-else"), "{tables}");
    assert!(
        ns.ok("ip", &["link", "show", "kube-ipvs0"]),
        "a non-dummy kube-ipvs0 is not ours to delete"
    );
    assert!(
        report.notes.iter().any(|n| n.contains("kube-ipvs0")),
        "{:?}",
        report.notes
    );

    // second run: nothing left, nothing fails
    let again = cleanup_all(&mut run, &mut no_ipvs(), &missing_root);
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert!(again.removed.is_empty(), "{:?}", again.removed);
}

#[test]
fn clean_namespace_reports_nothing() {
    let ns = NetNs::new();
    let mut run = ProcessRunner {
        netns: Some(ns.name.clone()),
    };
    let r = cleanup_all(
        &mut run,
        &mut no_ipvs(),
        std::path::Path::new("/nonexistent/pins"),
    );
    assert!(r.errors.is_empty() && r.removed.is_empty(), "{r:?}");
    // Looking for leftovers created no legacy table (whose hooks every packet
    // would pass): the kernel lists none in the namespace.
    for names in ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"] {
        if ns.ok("test", &["-e", names]) {
            assert_eq!(ns.sh("cat", &[names]), "", "{names}");
        }
    }
}

#[test]
fn removes_bpf_pins_under_the_pin_root() {
    let fs = BpfFs::new();
    let root = fs.dir.join("kube-ebpf-proxy");
    std::fs::create_dir_all(root.join("v1")).unwrap();
    fs.pin_map(&root.join("v1").join("services"));
    fs.pin_map(&root.join("conntrack"));
    fs.pin_map(&fs.dir.join("not-ours"));
    let ns = NetNs::new();
    let mut run = ProcessRunner {
        netns: Some(ns.name.clone()),
    };
    let r = cleanup_all(&mut run, &mut no_ipvs(), &root);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let pins: Vec<String> = r
        .removed
        .iter()
        .filter_map(|x| match x {
            Removed::BpfPin { path } => {
                Some(path.strip_prefix(&root).unwrap().display().to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(pins, ["conntrack", "v1/services"]);
    assert!(!root.exists());
    assert!(
        fs.dir.join("not-ours").exists(),
        "pins outside our root stay"
    );
    let again = cleanup_all(&mut run, &mut no_ipvs(), &root);
    assert!(
        again.removed.is_empty() && again.errors.is_empty(),
        "{again:?}"
    );
}
