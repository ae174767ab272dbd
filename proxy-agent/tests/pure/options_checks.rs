//! The post-validation checks of config_rules.md §3.3 (upstream's `checkBadConfig`,
//! `checkBadIPConfig` and the primary-family support check), with upstream's texts.

use crate::options_common::*;

use std::net::IpAddr;

use proxy_agent::options::ProxyMode;
use proxy_agent::options::checks::{self, CheckError, IpFamily, NodeFacts};

const UNSET: &str = "nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`";

fn ips(list: &[&str]) -> Option<Vec<IpAddr>> {
    Some(list.iter().map(|s| s.parse().unwrap()).collect())
}

/// Facts once the Node is known; `dual` says whether the mode serves both families.
fn node(node_ips: &[&str], dual: bool, pod_cidrs: &[&str]) -> NodeFacts {
    NodeFacts {
        node_ips: ips(node_ips),
        ipv4_supported: true,
        ipv6_supported: dual,
        pod_cidrs: pod_cidrs.iter().map(|s| s.to_string()).collect(),
    }
}

fn config(args: &[&str]) -> proxy_agent::options::KubeProxyConfiguration {
    opts_with(args, &[ProxyMode::Iptables]).config
}

#[test]
fn unset_node_port_addresses_is_warned_about_even_before_the_node_is_known() {
    let c = config(&[]);
    let f = checks::run(&c, &NodeFacts::at_startup(ProxyMode::Iptables));
    assert_eq!(f.bad_config.as_deref(), Some(UNSET));
    assert_eq!(f.node_ips, None, "0.0.0.0 says nothing about the family");
    assert_eq!(f.fatal, None);
    assert_eq!(
        checks::MAY_BE_INCORRECT,
        "Kube-proxy configuration may be incomplete or incorrect"
    );
    // set: no warning
    let c = config(&["--nodeport-addresses=10.0.0.0/8"]);
    let f = checks::run(&c, &node(&["10.1.2.3"], false, &[]));
    assert_eq!(f.bad_config, None);
}

#[test]
fn primary_is_expanded_to_the_node_ips_first() {
    let c = config(&["--proxy-mode=nftables"]);
    assert_eq!(c.node_port_addresses, ["primary"]);
    // at start-up with 0.0.0.0 the node IPs are unknown: nothing to say yet
    let f = checks::run(&c, &NodeFacts::at_startup(ProxyMode::Nftables));
    assert_eq!((f.bad_config, f.node_port_addresses), (None, None));
    // known node IPs: /32 and /128, and no warning
    let f = checks::run(&c, &node(&["10.1.2.3", "fd00::3"], true, &[]));
    assert_eq!(
        f.node_port_addresses.as_deref(),
        Some(&["10.1.2.3/32".to_string(), "fd00::3/128".to_string()][..])
    );
    assert_eq!(f.bad_config, None);
    // a Node without addresses: loopback assumed, primary expands to nothing -> "unset"
    let f = checks::run(&c, &node(&[], false, &[]));
    assert!(
        f.loopback_assumed
            .unwrap()
            .starts_with("Can't determine this node's IP, assuming loopback")
    );
    assert_eq!(f.node_port_addresses.as_deref(), Some(&[][..]));
    assert_eq!(f.bad_config.as_deref(), Some(UNSET));
}

#[test]
fn node_port_addresses_of_the_wrong_family() {
    let c = config(&["--nodeport-addresses=fd00::/64"]);
    let f = checks::run(&c, &node(&["10.1.2.3"], true, &[]));
    assert_eq!(
        f.bad_config.as_deref(),
        Some(
            "cluster appears to be IPv4-primary but nodePortAddresses contains only IPv6 addresses; NodePort connections will be accepted on all local IPv4 IPs"
        )
    );
    // dual-stack looking cluster (clusterCIDR pair), nodePortAddresses only of the primary family
    let c = config(&[
        "--nodeport-addresses=10.0.0.0/8",
        "--cluster-cidr=10.244.0.0/16,fd00:244::/56",
    ]);
    let f = checks::run(&c, &node(&["10.1.2.3"], true, &[]));
    assert_eq!(
        f.bad_config.as_deref(),
        Some(
            "cluster appears to be dual-stack but nodePortAddresses contains only IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"
        )
    );
    // podCIDRs count as dual-stack configuration too
    let c = config(&["--nodeport-addresses=10.0.0.0/8"]);
    let f = checks::run(
        &c,
        &node(&["10.1.2.3"], true, &["10.244.1.0/24", "fd00:244:1::/64"]),
    );
    assert!(
        f.bad_config
            .unwrap()
            .starts_with("cluster appears to be dual-stack")
    );
}

#[test]
fn a_primary_family_the_mode_cannot_serve_is_fatal() {
    // A host without IPv6 (`/proc/net/if_inet6` absent).
    let no_ipv6 = NodeFacts {
        ipv6_supported: false,
        ..NodeFacts::at_startup(ProxyMode::Ebpf)
    };
    let c = config(&["--proxy-mode=ebpf", "--bind-address=fd00::1"]);
    let f = checks::run(&c, &no_ipv6);
    assert_eq!(f.fatal, Some(CheckError::UnsupportedFamily(IpFamily::IPv6)));
    assert_eq!(
        f.fatal.unwrap().to_string(),
        "no support for primary IP family \"IPv6\""
    );
    // a specific bindAddress decides the family even before the Node is known
    let c = config(&["--proxy-mode=ebpf", "--bind-address=10.0.0.1"]);
    let f = checks::run(&c, &no_ipv6);
    assert_eq!(f.fatal, None);
    assert_eq!(
        f.stack.as_deref(),
        Some("kube-proxy running in single-stack mode (ipFamily IPv4)")
    );
    // On this host (IPv6 present), the ebpf mode serves an IPv6-primary node, dual-stack.
    let c6 = config(&["--proxy-mode=ebpf", "--bind-address=fd00::1"]);
    let f = checks::run(&c6, &NodeFacts::at_startup(ProxyMode::Ebpf));
    assert_eq!(f.fatal, None);
    assert_eq!(
        f.stack.as_deref(),
        Some("kube-proxy running in dual-stack mode (primary ipFamily IPv6)")
    );
    // bindAddress wins over the node IPs
    let f = checks::run(&c, &node(&["fd00::9"], false, &[]));
    assert_eq!(f.node_ips.unwrap().primary_family, IpFamily::IPv4);
}

#[test]
fn cluster_cidrs_of_the_wrong_family() {
    let c = config(&[
        "--cluster-cidr=fd00:244::/56",
        "--nodeport-addresses=10.0.0.0/8",
    ]);
    // ClusterCIDR mode on a host that is not dual-stack capable: fatal
    let f = checks::run(&c, &node(&["10.1.2.3"], false, &[]));
    assert_eq!(
        f.fatal.unwrap().to_string(),
        "kube-proxy configuration is incorrect: cluster is IPv4-only but clusterCIDRs contains only IPv6 addresses"
    );
    // dual-stack capable: only logged
    let f = checks::run(&c, &node(&["10.1.2.3"], true, &[]));
    assert_eq!(f.fatal, None);
    assert_eq!(
        f.bad_ip_config.as_deref(),
        Some("cluster is IPv4-primary but clusterCIDRs contains only IPv6 addresses")
    );
    // another detect-local mode: only logged
    let c = config(&[
        "--cluster-cidr=fd00:244::/56",
        "--detect-local-mode=NodeCIDR",
        "--nodeport-addresses=10.0.0.0/8",
    ]);
    let f = checks::run(&c, &node(&["10.1.2.3"], false, &[]));
    assert_eq!(f.fatal, None);
    assert!(f.bad_ip_config.is_some());
}

#[test]
fn pod_cidrs_of_the_wrong_family_are_fatal_in_node_cidr_mode() {
    let c = config(&[
        "--detect-local-mode=NodeCIDR",
        "--nodeport-addresses=10.0.0.0/8",
    ]);
    let f = checks::run(&c, &node(&["10.1.2.3"], true, &["fd00:244:1::/64"]));
    assert_eq!(
        f.fatal.unwrap().to_string(),
        "kube-proxy configuration is incorrect: cluster is IPv4-primary but node.spec.podCIDRs contains only IPv6 addresses"
    );
}

#[test]
fn single_stack_host_checks_bind_addresses_and_exclude_cidrs() {
    let c = config(&[
        "--proxy-mode=ipvs",
        "--ipvs-exclude-cidrs=fd00::/64",
        "--healthz-bind-address=[fd00::1]:10256",
        "--metrics-bind-address=[::]:10249",
        "--nodeport-addresses=10.0.0.0/8",
    ]);
    let f = checks::run(&c, &node(&["10.1.2.3"], false, &[]));
    assert_eq!(f.fatal, None);
    assert_eq!(
        f.bad_ip_config.as_deref(),
        Some(
            "[cluster is IPv4-only but ipvs.excludeCIDRs contains only IPv6 addresses, cluster is IPv4-only but healthzBindAddress is IPv6]"
        ),
        "several findings aggregate as [a, b]; the unspecified [::] is fine"
    );
    // on a dual-stack host these are not checked
    let f = checks::run(&c, &node(&["10.1.2.3"], true, &[]));
    assert_eq!(f.bad_ip_config, None);
}

#[test]
fn node_ip_detection_follows_upstream() {
    let d = checks::detect_node_ips(&[], "0.0.0.0");
    assert_eq!(d.primary_family, IpFamily::IPv4);
    assert!(d.ipv4.is_loopback() && d.ipv6.is_loopback());
    let d = checks::detect_node_ips(&ips(&["fd00::1", "10.0.0.1"]).unwrap(), "::");
    assert_eq!(d.primary_family, IpFamily::IPv6);
    assert_eq!(d.ipv4.to_string(), "10.0.0.1");
    let d = checks::detect_node_ips(&ips(&["fd00::1"]).unwrap(), "10.9.9.9,fd00::9");
    assert_eq!(d.primary_family, IpFamily::IPv4, "first entry of a pair");
    assert_eq!(d.ipv4.to_string(), "10.9.9.9");
}
