//! The iptables rules beside upstream's ipvs proxier (its
//! `writeIptablesRules` and `createAndLinkKubeChain`): masquerade marks
//! and accepts matched by the ipsets, the NodePort and load-balancer
//! chains, the source-range firewall, and `KUBE-IPVS-FILTER`, which rejects
//! new connections to a `kube-ipvs0` address on a port no service has.
//! One `iptables-restore --noflush` input per family. Pure.

use std::fmt::Write as _;

use super::ipsets::{Ipsets, comment, set_name};
use crate::{
    model::{IpFamily, Protocol},
    modes::nftables::ruleset::LocalDetector,
};

/// What the rules depend on besides the sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSettings {
    pub family: IpFamily,
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    pub local: LocalDetector,
    /// Load-balancer frontends (ip, protocol, port) the node itself must
    /// not reach (source ranges that leave the node out).
    pub lb_no_node_access: Vec<(std::net::IpAddr, Protocol, u16)>,
}

const NAT_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
];
const FILTER_CHAINS: [&str; 6] = [
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// The jumps from the built-in chains, ensured outside the restore:
/// (table, chain, rule arguments), upstream's `iptablesJumpChain`.
pub fn jumps() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    [
        (
            "nat",
            "OUTPUT",
            "KUBE-SERVICES",
            "kubernetes service portals",
        ),
        (
            "nat",
            "PREROUTING",
            "KUBE-SERVICES",
            "kubernetes service portals",
        ),
        (
            "nat",
            "POSTROUTING",
            "KUBE-POSTROUTING",
            "kubernetes postrouting rules",
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-FORWARD",
            "kubernetes forwarding rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-NODE-PORT",
            "kubernetes health check rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-PROXY-FIREWALL",
            "kube-proxy firewall rules",
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-PROXY-FIREWALL",
            "kube-proxy firewall rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-IPVS-FILTER",
            "kubernetes ipvs access filter",
        ),
        (
            "filter",
            "OUTPUT",
            "KUBE-IPVS-OUT-FILTER",
            "kubernetes ipvs access filter",
        ),
    ]
    .into_iter()
    .map(|(table, from, to, c)| (table, from, vec!["-m", "comment", "--comment", c, "-j", to]))
    .collect()
}

/// Upstream's `ipsetWithIptablesChain`: (set, table, from, to, match, protocol).
const SET_RULES: [(&str, &str, &str, &str, &str, &str); 12] = [
    (
        "KUBE-LOOP-BACK",
        "nat",
        "KUBE-POSTROUTING",
        "MASQUERADE",
        "dst,dst,src",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER",
        "nat",
        "KUBE-SERVICES",
        "KUBE-LOAD-BALANCER",
        "dst,dst",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-LOCAL",
        "nat",
        "KUBE-LOAD-BALANCER",
        "RETURN",
        "dst,dst",
        "",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-TCP",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "tcp",
    ),
    (
        "KUBE-NODE-PORT-TCP",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "tcp",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-UDP",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "udp",
    ),
    (
        "KUBE-NODE-PORT-UDP",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "udp",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst,dst",
        "sctp",
    ),
    (
        "KUBE-NODE-PORT-SCTP-HASH",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst,dst",
        "sctp",
    ),
    (
        "KUBE-LOAD-BALANCER-FW",
        "filter",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "dst,dst",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "filter",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        "filter",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
];

fn local_not(local: &LocalDetector) -> Option<String> {
    match local {
        LocalDetector::None => None,
        LocalDetector::Cidr(net) => Some(format!("! -s {net}")),
        LocalDetector::Bridge(name) => Some(format!("! -i {name}")),
        LocalDetector::InterfacePrefix(p) => Some(format!("! -i {p}+")),
    }
}

/// The restore input (nat, then filter) for `sets`.
pub fn build(r: &RuleSettings, sets: &Ipsets) -> String {
    let f = r.family;
    let name = |s: &str| set_name(s, f);
    let quoted = |s: &str| format!("\"{}\"", comment(s));
    let mark = format!("{:#08x}", r.masquerade_mark);
    let mut nat = Vec::new();
    let mut filter = Vec::new();

    let lo = match f {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    nat.push(format!("-A KUBE-SERVICES -s {lo} -j RETURN"));
    for (set, table, from, to, matching, proto) in SET_RULES {
        if sets.is_empty(set) {
            continue;
        }
        let p = if proto.is_empty() {
            String::new()
        } else {
            format!(" -p {proto}")
        };
        let line = format!(
            "-A {from}{p} -m comment --comment {} -m set --match-set {} {matching} -j {to}",
            quoted(set),
            name(set)
        );
        if table == "nat" {
            nat.push(line)
        } else {
            filter.push(line)
        }
    }
    if !sets.is_empty("KUBE-CLUSTER-IP") {
        let head = format!(
            "-A KUBE-SERVICES -m comment --comment {} -m set --match-set {}",
            quoted("KUBE-CLUSTER-IP"),
            name("KUBE-CLUSTER-IP")
        );
        nat.push(if r.masquerade_all {
            format!("{head} dst,dst -j KUBE-MARK-MASQ")
        } else if let Some(not_local) = local_not(&r.local) {
            format!("{head} dst,dst {not_local} -j KUBE-MARK-MASQ")
        } else {
            // The VIPs are on kube-ipvs0, so the node picks one as the source
            // of its own connections to them: masquerade those.
            format!("{head} src,dst -j KUBE-MARK-MASQ")
        });
    }
    for (set, masquerade) in [
        ("KUBE-EXTERNAL-IP", true),
        ("KUBE-EXTERNAL-IP-LOCAL", false),
    ] {
        if sets.is_empty(set) {
            continue;
        }
        let head = format!(
            "-A KUBE-SERVICES -m comment --comment {} -m set --match-set {} dst,dst",
            quoted(set),
            name(set)
        );
        if masquerade {
            nat.push(format!("{head} -j KUBE-MARK-MASQ"));
        }
        nat.push(format!(
            "{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        ));
        nat.push(format!("{head} -m addrtype --dst-type LOCAL -j ACCEPT"));
    }
    nat.push("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT".into());
    nat.push("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ".into());
    filter.push("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP".into());
    for (ip, proto, port) in &r.lb_no_node_access {
        let p = proto.to_string().to_lowercase();
        filter.push(format!(
            "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {p} --vport {port} -j DROP"
        ));
    }
    for set in ["KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"] {
        if !sets.is_empty(set) {
            nat.push(format!(
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                name(set)
            ));
        }
    }
    filter.push(format!(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    ));
    filter.push("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into());
    filter.push(format!(
        "-A KUBE-NODE-PORT -m comment --comment {} -m set --match-set {} dst -j ACCEPT",
        quoted("KUBE-HEALTH-CHECK-NODE-PORT"),
        name("KUBE-HEALTH-CHECK-NODE-PORT")
    ));
    for (set, matching) in [
        ("KUBE-LOAD-BALANCER", "dst,dst"),
        ("KUBE-CLUSTER-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP-LOCAL", "dst,dst"),
        ("KUBE-HEALTH-CHECK-NODE-PORT", "dst"),
    ] {
        filter.push(format!(
            "-A KUBE-IPVS-FILTER -m set --match-set {} {matching} -j RETURN",
            name(set)
        ));
    }
    filter.push(format!(
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        name("KUBE-IPVS-IPS")
    ));
    nat.push(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    nat.push(format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
    nat.push("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into());
    nat.push(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));

    let mut out = String::new();
    for (table, chains, rules) in [
        ("nat", &NAT_CHAINS[..], &nat),
        ("filter", &FILTER_CHAINS[..], &filter),
    ] {
        let _ = writeln!(out, "*{table}");
        for c in chains {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for r in rules {
            let _ = writeln!(out, "{r}");
        }
        let _ = writeln!(out, "COMMIT");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(local: LocalDetector) -> RuleSettings {
        RuleSettings {
            family: IpFamily::V4,
            masquerade_mark: 1 << 14,
            masquerade_all: false,
            local,
            lb_no_node_access: vec![("198.18.3.20".parse().unwrap(), Protocol::Tcp, 80)],
        }
    }

    #[test]
    fn cluster_ip_masquerade_follows_the_local_detector_as_upstream() {
        let mut sets = Ipsets {
            family: Some(IpFamily::V4),
            ..Default::default()
        };
        sets.entries
            .insert("KUBE-CLUSTER-IP", ["198.19.0.10,tcp:80".to_owned()].into());
        sets.entries
            .insert("KUBE-NODE-PORT-TCP", ["30080".to_owned()].into());
        let with_cidr = build(
            &settings(LocalDetector::Cidr("198.18.0.0/16".parse().unwrap())),
            &sets,
        );
        assert!(with_cidr.contains("-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 198.18.0.0/16 -j KUBE-MARK-MASQ\n"), "{with_cidr}");
        assert!(with_cidr.contains("-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ\n"));
        assert!(with_cidr.contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x004000\n"));
        assert!(with_cidr.contains("-A KUBE-IPVS-OUT-FILTER -s 198.18.3.20 -m ipvs --vaddr 198.18.3.20 --vproto tcp --vport 80 -j DROP\n"));
        // Empty sets get no rules of their own.
        assert!(!with_cidr.contains("KUBE-LOOP-BACK"));
        let without = build(&settings(LocalDetector::None), &sets);
        assert!(
            without.contains("--match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ\n"),
            "{without}"
        );
    }
}
