//! Conntrack sysctls (config_rules.md §3.2), per-mode sysctls (--init-only) and the OOM score,
//! checked as exact writes against a fake; nothing on the host is touched.

use crate::options_common::*;
use proxy_agent::hostsetup::conntrack::{self, parse_cpu_list, wanted_max};
use proxy_agent::hostsetup::params::{FakeParams, HASHSIZE_KEY};
use proxy_agent::hostsetup::{oom, sysctls};
use proxy_agent::options::ProxyMode;

const MAX: &str = "proc/sys/net/netfilter/nf_conntrack_max";
const EST: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established";
const CW: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";
const UDP: &str = "proc/sys/net/netfilter/nf_conntrack_udp_timeout";
const UDPS: &str = "proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";
const LIB: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";

fn kernel() -> FakeParams {
    FakeParams::with(&[
        (MAX, "65536"),
        (HASHSIZE_KEY, "16384"),
        (EST, "432000"),
        (CW, "60"),
        (UDP, "30"),
        (UDPS, "120"),
        (LIB, "0"),
    ])
}

fn writes(p: &FakeParams) -> Vec<(&str, &str)> {
    p.writes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[test]
fn defaults_on_four_cpus() {
    let o = opts(&[]);
    let mut p = kernel();
    let r = conntrack::apply(&o.config, 4, &mut p).unwrap();
    // max(32768*4, 131072) = 131072; hashsize 131072/4 = 32768; 24h and 1h in seconds
    assert_eq!(
        writes(&p),
        [
            (MAX, "131072"),
            (HASHSIZE_KEY, "32768"),
            (EST, "86400"),
            (CW, "3600")
        ]
    );
    assert_eq!(r.writes.len(), 4);
    assert_eq!(r.writes[0].old.as_deref(), Some("65536"));
}

#[test]
fn max_is_only_raised_and_capped() {
    let o = opts(&[]);
    let mut p = kernel();
    p.values.insert(MAX.into(), "2000000".into());
    p.values.insert(HASHSIZE_KEY.into(), "500000".into());
    conntrack::apply(&o.config, 4, &mut p).unwrap();
    assert!(
        !p.writes.iter().any(|(k, _)| k == MAX || k == HASHSIZE_KEY),
        "{:?}",
        p.writes
    );
    assert_eq!(wanted_max(32768, 131072, 256), Some(1_048_576));
    let mut p = kernel();
    conntrack::apply(&o.config, 256, &mut p).unwrap();
    assert_eq!(p.values[MAX], "1048576");
    assert_eq!(p.values[HASHSIZE_KEY], "262144");
    assert_eq!(wanted_max(1000, 5000, 2), Some(5000), "min is the floor");
}

#[test]
fn max_per_core_zero_leaves_max_alone_and_ignores_min() {
    let o = opts(&["--conntrack-max-per-core=0", "--conntrack-min=999999999"]);
    let mut p = kernel();
    conntrack::apply(&o.config, 8, &mut p).unwrap();
    assert!(!p.writes.iter().any(|(k, _)| k == MAX || k == HASHSIZE_KEY));
}

#[test]
fn zero_timeouts_are_left_alone_others_are_written_in_seconds() {
    let o = opts(&[
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=90s",
        "--conntrack-udp-timeout=45s",
        "--conntrack-udp-timeout-stream=2m30s",
        "--conntrack-max-per-core=0",
    ]);
    let mut p = kernel();
    conntrack::apply(&o.config, 1, &mut p).unwrap();
    assert_eq!(writes(&p), [(CW, "90"), (UDP, "45"), (UDPS, "150")]);
}

#[test]
fn unchanged_values_are_not_rewritten() {
    let o = opts(&["--conntrack-max-per-core=0"]);
    let mut p = kernel();
    p.values.insert(EST.into(), "86400".into());
    p.values.insert(CW.into(), "3600".into());
    conntrack::apply(&o.config, 1, &mut p).unwrap();
    assert!(p.writes.is_empty(), "{:?}", p.writes);
}

#[test]
fn be_liberal_is_set_only_when_asked_and_never_reset() {
    let mut p = kernel();
    conntrack::apply(&opts(&["--conntrack-max-per-core=0"]).config, 1, &mut p).unwrap();
    assert!(!p.writes.iter().any(|(k, _)| k == LIB));
    let mut p = kernel();
    conntrack::apply(
        &opts(&["--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal"]).config,
        1,
        &mut p,
    )
    .unwrap();
    assert_eq!(p.values[LIB], "1");
    let mut p = kernel();
    p.values.insert(LIB.into(), "1".into());
    conntrack::apply(&opts(&["--conntrack-max-per-core=0"]).config, 1, &mut p).unwrap();
    assert_eq!(p.values[LIB], "1");
}

#[test]
fn failures_fatal_except_hashsize() {
    let o = opts(&[]);
    let mut p = kernel();
    p.read_only.push(HASHSIZE_KEY.into());
    let r = conntrack::apply(&o.config, 4, &mut p).unwrap();
    assert_eq!(p.values[MAX], "131072");
    assert!(r.warnings[0].contains("hashsize"), "{:?}", r.warnings);
    let mut p = kernel();
    p.read_only.push(EST.into());
    let e = conntrack::apply(&o.config, 4, &mut p).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("could not set conntrack parameters: "),
        "{e}"
    );
}

#[test]
fn cpu_list_parsing() {
    assert_eq!(parse_cpu_list("0-3"), Some(4));
    assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(7));
    assert_eq!(parse_cpu_list("0"), Some(1));
    assert_eq!(parse_cpu_list(""), None);
    assert_eq!(parse_cpu_list("x"), None);
}

#[test]
fn per_mode_sysctls() {
    let s = |args: &[&str]| {
        let o = opts_with(args, &ProxyMode::ALL);
        proxy_agent::modes::of(o.mode).sysctls(&o)
    };
    assert_eq!(
        s(&["--proxy-mode=iptables"]),
        [("net/ipv4/conf/all/route_localnet", "1")]
    );
    assert!(
        s(&[
            "--proxy-mode=iptables",
            "--iptables-localhost-nodeports=false"
        ])
        .is_empty()
    );
    assert!(s(&["--proxy-mode=iptables", "--nodeport-addresses=10.0.0.0/8"]).is_empty());
    assert_eq!(
        s(&["--proxy-mode=iptables", "--nodeport-addresses=127.0.0.0/8"]).len(),
        1
    );
    assert_eq!(
        s(&["--proxy-mode=ipvs"]),
        [
            ("net/ipv4/vs/conntrack", "1"),
            ("net/ipv4/vs/expire_nodest_conn", "1"),
            ("net/ipv4/vs/expire_quiescent_template", "1"),
            ("net/ipv4/ip_forward", "1"),
        ]
    );
    assert_eq!(s(&["--proxy-mode=ipvs", "--ipvs-strict-arp"]).len(), 6);
    assert!(s(&["--proxy-mode=nftables"]).is_empty());
    assert!(s(&["--proxy-mode=ebpf"]).is_empty());
    let mut p = FakeParams::with(&[("proc/sys/net/ipv4/ip_forward", "1")]);
    let w = sysctls::apply(&opts_with(&["--proxy-mode=ipvs"], &ProxyMode::ALL), &mut p).unwrap();
    assert_eq!(w.len(), 3, "ip_forward already 1");
}

#[test]
fn oom_score_adj_is_written() {
    let dir = TempDir::new("oom");
    let path = dir.path().join("oom_score_adj");
    oom::apply(opts(&[]).config.oom_score_adj.unwrap(), &path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "-999");
    assert!(oom::apply(5, std::path::Path::new("/nonexistent/oom")).is_err());
}
