//! The post-validation checks upstream runs in `newProxyServer` (config_rules.md §3.3):
//! `platformCheckSupported` (is the primary IP family supported), `checkBadConfig` (warnings
//! about `nodePortAddresses`) and `checkBadIPConfig` (settings of the wrong IP family; fatal in
//! two cases). Pure functions over the configuration and what is known about the node, with
//! upstream's exact texts, so they can run at start-up and again once the Node is known.

use std::fmt;
use std::net::IpAddr;

use super::ProxyMode;
use super::types::KubeProxyConfiguration;
use super::validate::{is_ipv4_like, parse_cidr, parse_ip, split_host_port};

/// An IP family, printed as Kubernetes' `v1.IPFamily` (`IPv4`, `IPv6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    IPv4,
    IPv6,
}

impl IpFamily {
    pub fn of(ip: IpAddr) -> Self {
        if is_ipv4_like(ip) {
            IpFamily::IPv4
        } else {
            IpFamily::IPv6
        }
    }
    pub fn other(self) -> Self {
        match self {
            IpFamily::IPv4 => IpFamily::IPv6,
            IpFamily::IPv6 => IpFamily::IPv4,
        }
    }
    /// The number alone, as in upstream's "IPv%s" texts.
    fn digit(self) -> &'static str {
        match self {
            IpFamily::IPv4 => "4",
            IpFamily::IPv6 => "6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        })
    }
}

/// What is known about the node when the checks run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// The Node's IPs as upstream's `GetNodeIPs` returns them (primary first, at most one per
    /// family): `None` while the Node has not been seen (at start-up), which skips every check
    /// that needs the primary family unless `bindAddress` names it; `Some(empty)` when the Node
    /// has no usable address (upstream then assumes loopback).
    pub node_ips: Option<Vec<IpAddr>>,
    /// Whether the active mode can serve each family on this host ([`family_support`]).
    pub ipv4_supported: bool,
    pub ipv6_supported: bool,
    /// The Node's `spec.podCIDRs` (empty when unknown).
    pub pod_cidrs: Vec<String>,
}

impl NodeFacts {
    /// Facts before the Node is known, for `mode`.
    pub fn at_startup(mode: ProxyMode) -> Self {
        let (ipv4_supported, ipv6_supported) = family_support(mode);
        NodeFacts {
            node_ips: None,
            ipv4_supported,
            ipv6_supported,
            pod_cidrs: Vec::new(),
        }
    }
    pub fn dual_stack_supported(&self) -> bool {
        self.ipv4_supported && self.ipv6_supported
    }
}

/// The node IPs upstream's `detectNodeIPs` settles on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeIps {
    pub primary_family: IpFamily,
    pub ipv4: IpAddr,
    pub ipv6: IpAddr,
}

impl NodeIps {
    pub fn get(&self, family: IpFamily) -> IpAddr {
        match family {
            IpFamily::IPv4 => self.ipv4,
            IpFamily::IPv6 => self.ipv6,
        }
    }
}

/// `detectNodeIPs`: loopback for both families, overridden by the node IPs, and the primary
/// one by a specific (not unspecified) `bindAddress` (its first entry when it is a pair).
pub fn detect_node_ips(node_ips: &[IpAddr], bind_address: &str) -> NodeIps {
    let mut out = NodeIps {
        primary_family: IpFamily::IPv4,
        ipv4: IpAddr::from([127, 0, 0, 1]),
        ipv6: IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    };
    let set = |ip: IpAddr, out: &mut NodeIps| match IpFamily::of(ip) {
        IpFamily::IPv4 => out.ipv4 = ip,
        IpFamily::IPv6 => out.ipv6 = ip,
    };
    if let Some(first) = node_ips.first() {
        out.primary_family = IpFamily::of(*first);
        set(*first, &mut out);
        if let Some(second) = node_ips.get(1) {
            set(*second, &mut out);
        }
    }
    let first = bind_address.split(',').next().unwrap_or("").trim();
    if let Some(ip) = parse_ip(first).filter(|ip| !ip.is_unspecified()) {
        out.primary_family = IpFamily::of(ip);
        set(ip, &mut out);
    }
    out
}

/// `nodePortAddresses: [primary]` as upstream expands it once the node IPs are known: the
/// non-loopback node IPs as /32 and /128. Any other list is returned as is.
pub fn resolve_node_port_addresses(list: &[String], ips: &NodeIps) -> Vec<String> {
    if !matches!(list, [p] if p == "primary") {
        return list.to_vec();
    }
    let mut out = Vec::new();
    if !ips.ipv4.is_loopback() {
        out.push(format!("{}/32", ips.ipv4));
    }
    if !ips.ipv6.is_loopback() {
        out.push(format!("{}/128", ips.ipv6));
    }
    out
}

/// The outcome of the checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// The node IPs when they could be determined (always once the Node is known).
    pub node_ips: Option<NodeIps>,
    /// "Can't determine this node's IP, assuming loopback; ..." (info), when that happened.
    pub loopback_assumed: Option<String>,
    /// `nodePortAddresses` with `primary` expanded, when it could be.
    pub node_port_addresses: Option<Vec<String>>,
    /// "kube-proxy running in dual-stack mode ..." / "... single-stack mode ..." (info).
    pub stack: Option<String>,
    /// `checkBadConfig`'s aggregate; upstream logs it as an error with [`MAY_BE_INCORRECT`].
    pub bad_config: Option<String>,
    /// `checkBadIPConfig`'s aggregate when not fatal; logged the same way.
    pub bad_ip_config: Option<String>,
    /// What stops start-up, if anything.
    pub fatal: Option<CheckError>,
}

/// The message upstream logs the non-fatal findings with.
pub const MAY_BE_INCORRECT: &str = "Kube-proxy configuration may be incomplete or incorrect";

/// A check that stops start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("no support for primary IP family \"{0}\"")]
    UnsupportedFamily(IpFamily),
    #[error("kube-proxy configuration is incorrect: {0}")]
    Incorrect(String),
}

/// Which families the mode can serve here: every mode serves both (the ebpf datapath too,
/// docs/dual-stack.md), IPv6 when the kernel has it (`/proc/net/if_inet6`), as upstream
/// credits its modes before probing their tools.
pub fn family_support(_mode: ProxyMode) -> (bool, bool) {
    (true, std::path::Path::new("/proc/net/if_inet6").exists())
}

/// `utilerrors.NewAggregate(..).Error()`: one message alone, several as `[a, b]`.
fn aggregate(errs: &[String]) -> Option<String> {
    match errs {
        [] => None,
        [one] => Some(one.clone()),
        many => Some(format!("[{}]", many.join(", "))),
    }
}

fn family_of_cidr(s: &str) -> Option<IpFamily> {
    parse_cidr(s).map(|n| IpFamily::of(n.addr()))
}

/// `netutils.IsDualStackCIDRStrings`: every entry parses and both families are present.
fn is_dual_stack(cidrs: &[String]) -> bool {
    let fams: Option<Vec<IpFamily>> = cidrs.iter().map(|c| family_of_cidr(c)).collect();
    fams.is_some_and(|f| f.contains(&IpFamily::IPv4) && f.contains(&IpFamily::IPv6))
}

/// `badCIDRs`: a non-empty list whose entries are all of `wrong`.
fn bad_cidrs(cidrs: &[String], wrong: IpFamily) -> bool {
    !cidrs.is_empty() && cidrs.iter().all(|c| family_of_cidr(c) == Some(wrong))
}

/// `badBindAddress`: an `IP:port` whose IP is a specific address of `wrong`.
fn bad_bind_address(addr: &str, wrong: IpFamily) -> bool {
    split_host_port(addr)
        .and_then(|(host, _)| parse_ip(host))
        .is_some_and(|ip| IpFamily::of(ip) == wrong && !ip.is_unspecified())
}

fn cluster_cidrs(c: &KubeProxyConfiguration) -> Vec<String> {
    if c.cluster_cidr.is_empty() {
        Vec::new()
    } else {
        c.cluster_cidr.split(',').map(str::to_string).collect()
    }
}

/// `checkBadConfig` over `npa` (`nodePortAddresses` with `primary` already expanded): unset,
/// or covering only one family of a cluster that looks dual-stack, or only the other family.
/// Without a primary family only the first warning can be decided.
pub fn check_bad_config(
    c: &KubeProxyConfiguration,
    npa: &[String],
    primary: Option<IpFamily>,
    pod_cidrs: &[String],
) -> Option<String> {
    let mut errs = Vec::new();
    if npa.is_empty() {
        errs.push("nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`".to_string());
    } else if let Some(primary) = primary {
        let any_dual = [
            cluster_cidrs(c),
            npa.to_vec(),
            c.ipvs.exclude_cidrs.clone(),
            pod_cidrs.to_vec(),
        ]
        .iter()
        .any(|l| is_dual_stack(l));
        // `MapCIDRsByIPFamily`: entries that are not CIDRs count for no family.
        let of_primary = npa
            .iter()
            .filter(|a| family_of_cidr(a.trim()) == Some(primary))
            .count();
        if any_dual && of_primary == npa.len() {
            errs.push(format!(
                "cluster appears to be dual-stack but nodePortAddresses contains only {primary} addresses; NodePort connections will be accepted on all local {} IPs",
                primary.other()
            ));
        } else if of_primary == 0 {
            errs.push(format!(
                "cluster appears to be {primary}-primary but nodePortAddresses contains only {} addresses; NodePort connections will be accepted on all local {primary} IPs",
                primary.other()
            ));
        }
    }
    aggregate(&errs)
}

/// `checkBadIPConfig`: settings of the non-primary family. `Err` when fatal: clusterCIDRs of
/// the wrong family with detectLocalMode ClusterCIDR on a host that is not dual-stack capable,
/// or node podCIDRs of the wrong family with detectLocalMode NodeCIDR.
pub fn check_bad_ip_config(
    c: &KubeProxyConfiguration,
    primary: IpFamily,
    dual: bool,
    pod_cidrs: &[String],
) -> Result<Option<String>, String> {
    let bad = primary.other();
    let cluster_type = if dual {
        format!("{primary}-primary")
    } else {
        format!("{primary}-only")
    };
    let mut errs = Vec::new();
    let mut fatal = false;
    if bad_cidrs(&cluster_cidrs(c), bad) {
        errs.push(format!(
            "cluster is {cluster_type} but clusterCIDRs contains only IPv{} addresses",
            bad.digit()
        ));
        fatal |= c.detect_local_mode == "ClusterCIDR" && !dual;
    }
    if bad_cidrs(pod_cidrs, bad) {
        errs.push(format!(
            "cluster is {cluster_type} but node.spec.podCIDRs contains only IPv{} addresses",
            bad.digit()
        ));
        fatal |= c.detect_local_mode == "NodeCIDR";
    }
    if parse_ip(&c.winkernel.source_vip).map(IpFamily::of) == Some(bad) {
        errs.push(format!(
            "cluster is {cluster_type} but winkernel.sourceVip is IPv{}",
            bad.digit()
        ));
    }
    if !dual {
        if bad_cidrs(&c.ipvs.exclude_cidrs, bad) {
            errs.push(format!(
                "cluster is {cluster_type} but ipvs.excludeCIDRs contains only IPv{} addresses",
                bad.digit()
            ));
        }
        if bad_bind_address(&c.healthz_bind_address, bad) {
            errs.push(format!(
                "cluster is {cluster_type} but healthzBindAddress is IPv{}",
                bad.digit()
            ));
        }
        if bad_bind_address(&c.metrics_bind_address, bad) {
            errs.push(format!(
                "cluster is {cluster_type} but metricsBindAddress is IPv{}",
                bad.digit()
            ));
        }
    }
    match (aggregate(&errs), fatal) {
        (Some(e), true) => Err(e),
        (other, _) => Ok(other),
    }
}

/// All of §3.3 in upstream's order: node IPs (and `primary` expanded), `checkBadConfig`, the
/// primary family's support, `checkBadIPConfig`.
pub fn run(c: &KubeProxyConfiguration, facts: &NodeFacts) -> Findings {
    let mut f = Findings::default();
    let bind_first = c.bind_address.split(',').next().unwrap_or("").trim();
    let bind_specific = parse_ip(bind_first).is_some_and(|ip| !ip.is_unspecified());
    let ips = match &facts.node_ips {
        Some(node_ips) => Some(detect_node_ips(node_ips, &c.bind_address)),
        None if bind_specific => Some(detect_node_ips(&[], &c.bind_address)),
        None => None,
    };
    if let Some(ips) = &ips
        && ips.get(ips.primary_family).is_loopback()
    {
        f.loopback_assumed = Some("Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag".into());
    }
    let primary = ips.map(|i| i.primary_family);
    f.node_ips = ips;
    let npa = match &ips {
        Some(ips) => Some(resolve_node_port_addresses(&c.node_port_addresses, ips)),
        None if matches!(c.node_port_addresses.as_slice(), [p] if p == "primary") => None,
        None => Some(c.node_port_addresses.clone()),
    };
    if let Some(npa) = &npa {
        f.bad_config = check_bad_config(c, npa, primary, &facts.pod_cidrs);
    }
    f.node_port_addresses = npa;
    let Some(primary) = primary else {
        return f;
    };
    let supported = match primary {
        IpFamily::IPv4 => facts.ipv4_supported,
        IpFamily::IPv6 => facts.ipv6_supported,
    };
    if !supported {
        f.fatal = Some(CheckError::UnsupportedFamily(primary));
        return f;
    }
    let dual = facts.dual_stack_supported();
    f.stack = Some(if dual {
        format!("kube-proxy running in dual-stack mode (primary ipFamily {primary})")
    } else {
        format!("kube-proxy running in single-stack mode (ipFamily {primary})")
    });
    match check_bad_ip_config(c, primary, dual, &facts.pod_cidrs) {
        Ok(w) => f.bad_ip_config = w,
        Err(e) => f.fatal = Some(CheckError::Incorrect(e)),
    }
    f
}
