//! The ipsets of upstream's ipvs proxier (`pkg/proxy/ipvs/ipset.go` and its
//! `syncProxyRules`), from the model: which service addresses, ports and
//! sources the companion iptables rules match, and the `ipset restore`
//! input that brings a node's sets there. IPv6 sets are named `KUBE-6-…`,
//! as upstream names them. Pure.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::IpAddr,
};

use crate::model::{DesiredState, IpFamily, Protocol};

/// Upstream's sets: name (IPv4), type, and the comment its iptables rules carry.
pub const SETS: [(&str, &str, &str); 17] = [
    (
        "KUBE-LOOP-BACK",
        "hash:ip,port,ip",
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    (
        "KUBE-CLUSTER-IP",
        "hash:ip,port",
        "Kubernetes service cluster ip + port for masquerade purpose",
    ),
    (
        "KUBE-EXTERNAL-IP",
        "hash:ip,port",
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    (
        "KUBE-EXTERNAL-IP-LOCAL",
        "hash:ip,port",
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER",
        "hash:ip,port",
        "Kubernetes service lb portal",
    ),
    (
        "KUBE-LOAD-BALANCER-FW",
        "hash:ip,port",
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    (
        "KUBE-LOAD-BALANCER-LOCAL",
        "hash:ip,port",
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        "hash:ip,port,ip",
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "hash:ip,port,net",
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    (
        "KUBE-NODE-PORT-TCP",
        "bitmap:port",
        "Kubernetes nodeport TCP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-TCP",
        "bitmap:port",
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-UDP",
        "bitmap:port",
        "Kubernetes nodeport UDP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-UDP",
        "bitmap:port",
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-SCTP-HASH",
        "hash:ip,port",
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        "hash:ip,port",
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    (
        "KUBE-HEALTH-CHECK-NODE-PORT",
        "bitmap:port",
        "Kubernetes health check node port",
    ),
    (
        "KUBE-IPVS-IPS",
        "hash:ip",
        "Addresses on the ipvs interface",
    ),
];

/// A set's name in `family` (`KUBE-6-…` for IPv6, at most 31 characters).
pub fn set_name(name: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => name.to_owned(),
        IpFamily::V6 => {
            let mut n = name.replacen("KUBE-", "KUBE-6-", 1);
            n.truncate(31);
            n
        }
    }
}

pub fn comment(name: &str) -> &'static str {
    SETS.iter()
        .find(|(n, ..)| *n == name)
        .map_or("", |(_, _, c)| c)
}

/// Each set's entries (by its IPv4 name), as `ipset save` prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipsets {
    pub family: Option<IpFamily>,
    pub entries: BTreeMap<&'static str, BTreeSet<String>>,
}

impl Ipsets {
    pub fn is_empty(&self, set: &str) -> bool {
        self.entries.get(set).is_none_or(BTreeSet::is_empty)
    }

    fn add(&mut self, set: &'static str, entry: String) {
        self.entries.entry(set).or_default().insert(entry);
    }
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// The sets of `family` for `desired`: `node_ips` are the NodePort
/// addresses (for SCTP's `hash:ip,port`), `bound` the addresses on
/// `kube-ipvs0`.
pub fn ipsets(
    desired: &DesiredState,
    family: IpFamily,
    node_ips: &[IpAddr],
    bound: &BTreeSet<IpAddr>,
) -> Ipsets {
    let mut s = Ipsets {
        family: Some(family),
        ..Ipsets::default()
    };
    let of = |a: &IpAddr| IpFamily::of(a) == family;
    let node_ip = match family {
        IpFamily::V4 => desired.node.primary_ipv4.map(IpAddr::V4),
        IpFamily::V6 => desired.node.primary_ipv6.map(IpAddr::V6),
    };
    for svc in desired.services.values() {
        let Some(cluster_ip) = svc.cluster_ips.iter().copied().find(of) else {
            continue;
        };
        let p = proto(svc.protocol);
        let ip_port = |ip: &IpAddr, port: u16| format!("{ip},{p}:{port}");
        // Hairpin: every local endpoint of the port (any policy).
        let local = svc.cluster_endpoints.iter().chain(&svc.local_endpoints);
        for e in local.filter(|e| e.is_local && of(&e.ip)) {
            s.add(
                "KUBE-LOOP-BACK",
                format!("{},{p}:{},{}", e.ip, e.port, e.ip),
            );
        }
        s.add("KUBE-CLUSTER-IP", ip_port(&cluster_ip, svc.port));
        for ip in svc.external_ips.iter().filter(|a| of(a)) {
            let set = if svc.external_policy_local {
                "KUBE-EXTERNAL-IP-LOCAL"
            } else {
                "KUBE-EXTERNAL-IP"
            };
            s.add(set, ip_port(ip, svc.port));
        }
        for ip in svc.load_balancer_ips.iter().filter(|a| of(a)) {
            s.add("KUBE-LOAD-BALANCER", ip_port(ip, svc.port));
            if svc.external_policy_local {
                s.add("KUBE-LOAD-BALANCER-LOCAL", ip_port(ip, svc.port));
            }
            let ranges: Vec<_> = svc
                .load_balancer_source_ranges
                .iter()
                .filter(|n| of(&n.addr()))
                .collect();
            if !ranges.is_empty() {
                s.add("KUBE-LOAD-BALANCER-FW", ip_port(ip, svc.port));
                for net in &ranges {
                    s.add(
                        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                        format!("{ip},{p}:{},{net}", svc.port),
                    );
                }
                if node_ip.is_some_and(|n| ranges.iter().any(|r| r.contains(&n))) {
                    s.add(
                        "KUBE-LOAD-BALANCER-SOURCE-IP",
                        format!("{ip},{p}:{},{ip}", svc.port),
                    );
                }
            }
        }
        if let Some(np) = svc.node_port.filter(|_| !node_ips.is_empty()) {
            let local = svc.external_policy_local;
            match svc.protocol {
                Protocol::Tcp | Protocol::Udp => {
                    let (all, loc) = if svc.protocol == Protocol::Tcp {
                        ("KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP")
                    } else {
                        ("KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP")
                    };
                    s.add(all, np.to_string());
                    if local {
                        s.add(loc, np.to_string());
                    }
                }
                Protocol::Sctp => {
                    for ip in node_ips {
                        s.add("KUBE-NODE-PORT-SCTP-HASH", ip_port(ip, np));
                        if local {
                            s.add("KUBE-NODE-PORT-LOCAL-SCTP-HASH", ip_port(ip, np));
                        }
                    }
                }
            }
        }
        if let Some(hc) = svc.health_check_node_port {
            s.add("KUBE-HEALTH-CHECK-NODE-PORT", hc.to_string());
        }
    }
    for ip in bound.iter().filter(|a| of(a)) {
        s.add("KUBE-IPVS-IPS", ip.to_string());
    }
    s
}

/// The `ipset restore` input that creates every set (if missing) and
/// brings its entries from `existing` (as `ipset save` gave them, by
/// the family's set name) to `want`.
pub fn restore(want: &Ipsets, existing: &BTreeMap<String, BTreeSet<String>>) -> String {
    let family = want.family.unwrap_or(IpFamily::V4);
    let hash_family = match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    };
    let mut out = String::new();
    for (name, ty, _) in SETS {
        let n = set_name(name, family);
        if ty == "bitmap:port" {
            let _ = writeln!(out, "create {n} {ty} range 0-65535 -exist");
        } else {
            let _ = writeln!(
                out,
                "create {n} {ty} family {hash_family} hashsize 1024 maxelem 65536 -exist"
            );
        }
    }
    let none = BTreeSet::new();
    for (name, ..) in SETS {
        let n = set_name(name, family);
        let have = existing.get(&n).unwrap_or(&none);
        let wanted = want.entries.get(name).unwrap_or(&none);
        for e in have.difference(wanted) {
            let _ = writeln!(out, "del {n} {e}");
        }
        for e in wanted.difference(have) {
            let _ = writeln!(out, "add {n} {e} -exist");
        }
    }
    out
}

/// The entries of each set in an `ipset save` dump.
pub fn parse_save(dump: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in dump.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("add")
            && let (Some(set), Some(entry)) = (words.next(), words.next())
        {
            out.entry(set.to_owned())
                .or_default()
                .insert(entry.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_names_are_upstreams() {
        assert_eq!(
            set_name("KUBE-CLUSTER-IP", IpFamily::V6),
            "KUBE-6-CLUSTER-IP"
        );
        // 32 characters, truncated to ipset's 31.
        assert_eq!(
            set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", IpFamily::V6),
            "KUBE-6-LOAD-BALANCER-SOURCE-CID"
        );
        assert_eq!(
            set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", IpFamily::V4),
            "KUBE-LOAD-BALANCER-SOURCE-CIDR"
        );
    }

    #[test]
    fn restore_brings_existing_entries_to_the_wanted_ones() {
        let mut want = Ipsets {
            family: Some(IpFamily::V4),
            ..Default::default()
        };
        want.add("KUBE-CLUSTER-IP", "198.19.0.10,tcp:80".into());
        want.add("KUBE-NODE-PORT-TCP", "30080".into());
        let existing = parse_save(
            "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
             add KUBE-CLUSTER-IP 198.19.0.10,tcp:80\n\
             add KUBE-CLUSTER-IP 198.19.0.99,udp:53\n",
        );
        let text = restore(&want, &existing);
        assert!(text.starts_with(
            "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist\n"
        ));
        assert!(text.contains("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist\n"));
        assert!(text.contains("del KUBE-CLUSTER-IP 198.19.0.99,udp:53\n"));
        assert!(
            !text.contains("add KUBE-CLUSTER-IP 198.19.0.10,tcp:80"),
            "already there: {text}"
        );
        assert!(text.contains("add KUBE-NODE-PORT-TCP 30080 -exist\n"));
    }
}
