//! One family's kube-proxy chains from the model, as upstream's iptables
//! proxier writes them (`pkg/proxy/iptables/proxier.go`): the same chains
//! and names (`KUBE-SERVICES`, `KUBE-SVC-…`, `KUBE-SEP-…`, `KUBE-EXT-…`,
//! `KUBE-FW-…`, `KUBE-NODEPORTS`, `KUBE-POSTROUTING`, `KUBE-MARK-MASQ`,
//! `KUBE-FORWARD`, `KUBE-EXTERNAL-SERVICES`, `KUBE-PROXY-FIREWALL`), the
//! same rules, rendered as one `iptables-restore --noflush` input. Pure.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use ipnet::IpNet;
use sha2::{Digest as _, Sha256};

use crate::model::{
    DesiredService, DesiredState, Endpoint, IpFamily, NodeModel, ServicePortName, SessionAffinity,
};
use crate::modes::nftables::{proxier::NftSettings, ruleset::LocalDetector};

/// What one family's rules depend on besides the services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRules {
    pub family: IpFamily,
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    pub local: LocalDetector,
    /// `None`: NodePorts on every local address; else these.
    pub node_port_ips: Option<Vec<IpAddr>>,
    pub node_ip: Option<IpAddr>,
    /// `iptables.localhostNodePorts`: NodePorts answer on 127.0.0.1 (IPv4
    /// only, with `route_localnet`), guarded by `KUBE-FIREWALL`.
    pub localhost_node_ports: bool,
    /// Drop forwarded packets conntrack finds INVALID: upstream does unless
    /// `nf_conntrack_tcp_be_liberal` is set, which makes them rare and
    /// their drop harmful (kubernetes#74839).
    pub drop_invalid: bool,
    /// The nfacct objects the rules count packets into (upstream's two
    /// metrics read them), those that exist.
    pub counters: NfacctCounters,
}

/// Which of upstream's nfacct objects exist for the rules to count into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfacctCounters {
    /// [`super::nfacct::CT_STATE_INVALID_DROPPED`]
    pub invalid_dropped: bool,
    /// [`super::nfacct::LOCALHOST_NODE_PORTS_ACCEPTED`]
    pub localhost_node_ports_accepted: bool,
}

impl NodeRules {
    /// The same decisions as the nftables mode's (one set of options).
    pub fn new(settings: &NftSettings, family: IpFamily, node: &NodeModel) -> Self {
        let nft_family = match family {
            IpFamily::V4 => crate::modes::nftables::nft::Family::Ip,
            IpFamily::V6 => crate::modes::nftables::nft::Family::Ip6,
        };
        let n = settings.node_rules(nft_family, node);
        NodeRules {
            family,
            masquerade_mark: n.masquerade_mark,
            masquerade_all: n.masquerade_all,
            local: n.local,
            node_port_ips: n.node_port_ips,
            node_ip: n.node_ip,
            localhost_node_ports: settings.localhost_node_ports,
            drop_invalid: true,
            counters: NfacctCounters::default(),
        }
    }

    /// Whether 127.0.0.0/8 reaches NodePorts (never ::1, as upstream).
    fn localhost_reaches_node_ports(&self) -> bool {
        self.family == IpFamily::V4 && self.localhost_node_ports
    }
}

/// The jumps from the built-in chains, ensured outside the restore:
/// (table, chain, rule arguments).
pub fn jumps(node: &NodeRules) -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let mut all = service_jumps();
    if node.localhost_reaches_node_ports() {
        for chain in ["INPUT", "OUTPUT"] {
            all.push(("filter", chain, vec!["-j", KUBE_FIREWALL]));
        }
    }
    all
}

/// Upstream's kubelet chain, which kube-proxy fills when localhost reaches
/// NodePorts (the `route_localnet` hole, kubernetes#90259).
const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

fn service_jumps() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let c = |comment: &'static str| vec!["-m", "comment", "--comment", comment];
    let with = |mut a: Vec<&'static str>, b: &[&'static str]| {
        a.extend_from_slice(b);
        a
    };
    let new = ["-m", "conntrack", "--ctstate", "NEW"];
    vec![
        (
            "filter",
            "INPUT",
            with(
                new.to_vec(),
                &with(
                    c("kubernetes load balancer firewall"),
                    &["-j", "KUBE-PROXY-FIREWALL"],
                ),
            ),
        ),
        (
            "filter",
            "INPUT",
            with(
                c("kubernetes health check service ports"),
                &["-j", "KUBE-NODEPORTS"],
            ),
        ),
        (
            "filter",
            "INPUT",
            with(
                new.to_vec(),
                &with(
                    c("kubernetes externally-visible service portals"),
                    &["-j", "KUBE-EXTERNAL-SERVICES"],
                ),
            ),
        ),
        (
            "filter",
            "FORWARD",
            with(
                new.to_vec(),
                &with(
                    c("kubernetes load balancer firewall"),
                    &["-j", "KUBE-PROXY-FIREWALL"],
                ),
            ),
        ),
        (
            "filter",
            "FORWARD",
            with(c("kubernetes forwarding rules"), &["-j", "KUBE-FORWARD"]),
        ),
        (
            "filter",
            "FORWARD",
            with(
                new.to_vec(),
                &with(c("kubernetes service portals"), &["-j", "KUBE-SERVICES"]),
            ),
        ),
        (
            "filter",
            "FORWARD",
            with(
                new.to_vec(),
                &with(
                    c("kubernetes externally-visible service portals"),
                    &["-j", "KUBE-EXTERNAL-SERVICES"],
                ),
            ),
        ),
        (
            "filter",
            "OUTPUT",
            with(
                new.to_vec(),
                &with(
                    c("kubernetes load balancer firewall"),
                    &["-j", "KUBE-PROXY-FIREWALL"],
                ),
            ),
        ),
        (
            "filter",
            "OUTPUT",
            with(
                new.to_vec(),
                &with(c("kubernetes service portals"), &["-j", "KUBE-SERVICES"]),
            ),
        ),
        (
            "nat",
            "OUTPUT",
            with(c("kubernetes service portals"), &["-j", "KUBE-SERVICES"]),
        ),
        (
            "nat",
            "PREROUTING",
            with(c("kubernetes service portals"), &["-j", "KUBE-SERVICES"]),
        ),
        (
            "nat",
            "POSTROUTING",
            with(
                c("kubernetes postrouting rules"),
                &["-j", "KUBE-POSTROUTING"],
            ),
        ),
    ]
}

/// upstream's portProtoHash: 16 characters of base32(SHA-256).
fn hash16(s: &str) -> String {
    data_encoding::BASE32.encode(&Sha256::digest(s.as_bytes()))[..16].to_owned()
}

fn of_family(f: IpFamily, ip: &IpAddr) -> bool {
    IpFamily::of(ip) == f
}

/// One table's chains and rules.
#[derive(Default)]
struct Table {
    chains: BTreeSet<String>,
    /// Chains declared in order of first use (the restore lists them first).
    order: Vec<String>,
    rules: Vec<String>,
    /// Rules of service ports this sync leaves as they are (in the kernel,
    /// not in the restore).
    kept: usize,
}

impl Table {
    fn chain(&mut self, name: &str) {
        if self.chains.insert(name.into()) {
            self.order.push(name.into());
        }
    }

    fn rule(&mut self, line: String) {
        self.rules.push(line);
    }
}

/// What a sync writes: the restore input, the chains it declared per
/// table (the others of ours are stale), and each service port's own
/// chains (written or not).
pub struct Restore {
    pub text: String,
    pub chains: BTreeMap<&'static str, BTreeSet<String>>,
    pub services: BTreeMap<ServicePortName, OwnChains>,
    /// Per table, the rules the restore writes and all of kube-proxy's
    /// rules once it is applied (upstream's `sync_proxy_rules_iptables_last`
    /// and `_total`; upstream also counts the `-X` of each deleted chain).
    pub rule_counts: BTreeMap<&'static str, RuleCounts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleCounts {
    pub written: usize,
    pub total: usize,
}

/// A service port's own chains (`KUBE-SVC-…`, `KUBE-SEP-…`, …) per table.
pub type OwnChains = BTreeMap<&'static str, BTreeSet<String>>;

/// The chains one service port owns; the others (`KUBE-SERVICES`, …) are
/// shared and rewritten by every sync.
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

impl Table {
    /// Takes one service port's chains and rules: all of them, or (a partial
    /// sync of an unchanged port) only its rules in shared chains, leaving
    /// its own chains as the kernel holds them (upstream's partial sync).
    fn take(&mut self, port: Table, rewrite: bool) -> BTreeSet<String> {
        let own: BTreeSet<String> = port
            .chains
            .iter()
            .filter(|c| is_service_chain(c))
            .cloned()
            .collect();
        for c in &port.order {
            if rewrite || !own.contains(c) {
                self.chain(c);
            }
        }
        for r in port.rules {
            let chain = r
                .strip_prefix("-A ")
                .and_then(|r| r.split(' ').next())
                .unwrap_or_default();
            if rewrite || !own.contains(chain) {
                self.rule(r);
            } else {
                self.kept += 1;
            }
        }
        own
    }
}

const FIXED_FILTER: [&str; 6] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
];
const FIXED_NAT: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-PROXY-CANARY",
];

fn local_match(local: &LocalDetector, negate: bool) -> Option<String> {
    let not = if negate { "! " } else { "" };
    match local {
        LocalDetector::None => None,
        LocalDetector::Cidr(net) => Some(format!("{not}-s {net}")),
        LocalDetector::Bridge(name) => Some(format!("{not}-i {name}")),
        LocalDetector::InterfacePrefix(p) => Some(format!("{not}-i {p}+")),
    }
}

/// Both tables for `desired`; `stale` are our chains found in the tables
/// and no longer wanted (deleted by this restore), per table. Only the
/// service ports `rewrite` accepts have their own chains written.
pub fn build(
    node: &NodeRules,
    desired: &DesiredState,
    stale: &BTreeMap<&'static str, BTreeSet<String>>,
    rewrite: &dyn Fn(&ServicePortName) -> bool,
) -> Restore {
    let f = node.family;
    let mut filter = Table::default();
    let mut nat = Table::default();
    for c in FIXED_FILTER {
        filter.chain(c);
    }
    for c in FIXED_NAT {
        nat.chain(c);
    }
    let mark = format!("{:#x}", node.masquerade_mark);
    let reject = match f {
        IpFamily::V4 => "icmp-port-unreachable",
        IpFamily::V6 => "icmp6-port-unreachable",
    };
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    nat.rule(format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
    nat.rule("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into());
    nat.rule(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));
    if node.drop_invalid {
        let count = if node.counters.invalid_dropped {
            format!(
                " -m nfacct --nfacct-name {}",
                super::nfacct::CT_STATE_INVALID_DROPPED
            )
        } else {
            String::new()
        };
        filter.rule(format!("-A KUBE-FORWARD -m conntrack --ctstate INVALID -m comment --comment \"kubernetes forwarding rules\"{count} -j DROP"));
    }
    filter.rule(format!("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"));
    filter.rule("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into());

    if node.localhost_reaches_node_ports() {
        filter.chain(KUBE_FIREWALL);
        filter.rule(format!("-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"));
    }

    let mut nodeport_rules = Vec::new();
    let mut services = BTreeMap::new();
    for svc in desired.services.values() {
        let (mut port_filter, mut port_nat) = (Table::default(), Table::default());
        service(
            &mut port_filter,
            &mut port_nat,
            node,
            svc,
            reject,
            &mut nodeport_rules,
        );
        let rewrite = rewrite(&svc.name);
        let own = BTreeMap::from([
            ("filter", filter.take(port_filter, rewrite)),
            ("nat", nat.take(port_nat, rewrite)),
        ]);
        services.insert(svc.name.clone(), own);
    }
    // The NodePorts, last; loopback only where it can work (upstream's rule).
    let np_dest = match &node.node_port_ips {
        None => match f {
            IpFamily::V6 => vec!["-m addrtype --dst-type LOCAL ! -d ::1/128".to_string()],
            IpFamily::V4 if !node.localhost_node_ports => {
                vec!["-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8".to_string()]
            }
            IpFamily::V4 => vec!["-m addrtype --dst-type LOCAL".to_string()],
        },
        Some(ips) => ips
            .iter()
            .filter(|a| of_family(f, a))
            .filter(|a| !a.is_loopback() || node.localhost_reaches_node_ports())
            .map(|a| format!("-d {a}"))
            .collect(),
    };
    for d in np_dest {
        nat.rule(format!("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" {d} -j KUBE-NODEPORTS"));
    }
    for r in nodeport_rules {
        nat.rule(r);
    }

    let mut text = String::new();
    let mut chains = BTreeMap::new();
    let mut rule_counts = BTreeMap::new();
    for (name, table) in [("filter", &filter), ("nat", &nat)] {
        let _ = writeln!(text, "*{name}");
        for c in &table.order {
            let _ = writeln!(text, ":{c} - [0:0]");
        }
        let gone: Vec<&String> = stale
            .get(name)
            .into_iter()
            .flatten()
            .filter(|c| !table.chains.contains(*c))
            .collect();
        for c in &gone {
            let _ = writeln!(text, ":{c} - [0:0]");
        }
        for r in &table.rules {
            let _ = writeln!(text, "{r}");
        }
        for c in &gone {
            let _ = writeln!(text, "-X {c}");
        }
        let _ = writeln!(text, "COMMIT");
        chains.insert(name, table.chains.clone());
        rule_counts.insert(
            name,
            RuleCounts {
                written: table.rules.len(),
                total: table.rules.len() + table.kept,
            },
        );
    }
    Restore {
        text,
        chains,
        services,
        rule_counts,
    }
}

fn service(
    filter: &mut Table,
    nat: &mut Table,
    node: &NodeRules,
    svc: &DesiredService,
    reject: &str,
    nodeport_rules: &mut Vec<String>,
) {
    let f = node.family;
    let Some(cluster_ip) = svc.cluster_ips.iter().find(|a| of_family(f, a)).copied() else {
        return;
    };
    let spn = &svc.name;
    let name = spn.to_string();
    // upstream hashes "ns/name:port" and the lower-case protocol.
    let name_port = format!("{}/{}:{}", spn.namespace, spn.name, spn.port_name);
    let proto = svc.protocol.to_string().to_lowercase();
    let hash = hash16(&format!("{name_port}{proto}"));
    let svc_chain = format!("KUBE-SVC-{hash}");
    let local_chain = format!("KUBE-SVL-{hash}");
    let ext_chain = format!("KUBE-EXT-{hash}");
    let fw_chain = format!("KUBE-FW-{hash}");
    let sep = |e: &Endpoint| {
        format!(
            "KUBE-SEP-{}",
            hash16(&format!(
                "{name_port}{proto}{}",
                SocketAddr::new(e.ip, e.port)
            ))
        )
    };
    let fam = |eps: &[Endpoint]| -> Vec<Endpoint> {
        eps.iter()
            .filter(|e| of_family(f, &e.ip))
            .cloned()
            .collect()
    };
    let cluster_eps = fam(&svc.cluster_endpoints);
    let local_eps = fam(&svc.local_endpoints);
    let has_endpoints = svc.has_any_endpoints.contains(f);
    let external_ips: Vec<IpAddr> = svc
        .external_ips
        .iter()
        .filter(|a| of_family(f, a))
        .copied()
        .collect();
    let lb_ips: Vec<IpAddr> = svc
        .load_balancer_ips
        .iter()
        .filter(|a| of_family(f, a))
        .copied()
        .collect();
    let externally = svc.node_port.is_some() || !external_ips.is_empty() || !lb_ips.is_empty();
    let uses_cluster = !cluster_eps.is_empty() && (!svc.internal_policy_local || externally);
    let uses_local = !local_eps.is_empty()
        && (svc.internal_policy_local || (svc.external_policy_local && externally));
    let (internal_chain, has_internal) = if svc.internal_policy_local {
        (&local_chain, has_endpoints && !local_eps.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let (external_policy_chain, has_external) = if svc.external_policy_local {
        (&local_chain, has_endpoints && !local_eps.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let uses_external = has_endpoints && externally;
    let dport = format!("-m {proto} -p {proto}");
    let port = svc.port;

    let internal_verdict = if has_endpoints {
        "DROP".to_string()
    } else {
        format!("REJECT --reject-with {reject}")
    };
    let external_verdict = internal_verdict.clone();

    // Cluster IP.
    if has_internal {
        nat.rule(format!("-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" {dport} -d {cluster_ip} --dport {port} -j {internal_chain}"));
    } else {
        let why = if has_endpoints {
            "has no local endpoints"
        } else {
            "has no endpoints"
        };
        filter.rule(format!("-A KUBE-SERVICES -m comment --comment \"{name} {why}\" {dport} -d {cluster_ip} --dport {port} -j {internal_verdict}"));
    }
    for ip in &external_ips {
        if has_endpoints {
            nat.rule(format!("-A KUBE-SERVICES -m comment --comment \"{name} external IP\" {dport} -d {ip} --dport {port} -j {ext_chain}"));
        }
        if !has_external {
            filter.rule(format!("-A KUBE-EXTERNAL-SERVICES -m comment --comment \"{name} has no local endpoints\" {dport} -d {ip} --dport {port} -j {external_verdict}"));
        }
    }
    let ranges: Vec<IpNet> = svc
        .load_balancer_source_ranges
        .iter()
        .filter(|n| of_family(f, &n.addr()))
        .copied()
        .collect();
    let uses_fw = !lb_ips.is_empty() && !ranges.is_empty();
    for ip in &lb_ips {
        if has_endpoints {
            let target = if uses_fw { &fw_chain } else { &ext_chain };
            nat.rule(format!("-A KUBE-SERVICES -m comment --comment \"{name} loadbalancer IP\" {dport} -d {ip} --dport {port} -j {target}"));
        }
        if uses_fw {
            filter.rule(format!("-A KUBE-PROXY-FIREWALL -m comment --comment \"{name} traffic not accepted by {fw_chain}\" {dport} -d {ip} --dport {port} -j DROP"));
        }
        if !has_external {
            filter.rule(format!("-A KUBE-EXTERNAL-SERVICES -m comment --comment \"{name} has no local endpoints\" {dport} -d {ip} --dport {port} -j {external_verdict}"));
        }
    }
    if let Some(np) = svc.node_port {
        if has_endpoints {
            if node.localhost_reaches_node_ports() && node.counters.localhost_node_ports_accepted {
                let counter = super::nfacct::LOCALHOST_NODE_PORTS_ACCEPTED;
                nodeport_rules.push(format!("-A KUBE-NODEPORTS -m comment --comment \"{name}\" {dport} -d 127.0.0.0/8 --dport {np} -m nfacct --nfacct-name {counter} -j {ext_chain}"));
            }
            nodeport_rules.push(format!("-A KUBE-NODEPORTS -m comment --comment \"{name}\" {dport} --dport {np} -j {ext_chain}"));
        }
        if !has_external {
            filter.rule(format!("-A KUBE-EXTERNAL-SERVICES -m comment --comment \"{name} has no local endpoints\" -m addrtype --dst-type LOCAL {dport} --dport {np} -j {external_verdict}"));
        }
    }

    if let Some(hc) = svc.health_check_node_port {
        filter.rule(format!("-A KUBE-NODEPORTS -m comment --comment \"{name} health check node port\" -m tcp -p tcp --dport {hc} -j ACCEPT"));
    }
    if uses_cluster {
        nat.chain(&svc_chain);
    }
    if uses_local {
        nat.chain(&local_chain);
    }
    if has_internal {
        if node.masquerade_all {
            nat.rule(format!("-A {internal_chain} -m comment --comment \"{name} cluster IP\" {dport} -d {cluster_ip} --dport {port} -j KUBE-MARK-MASQ"));
        } else if let Some(not_local) = local_match(&node.local, true) {
            nat.rule(format!("-A {internal_chain} -m comment --comment \"{name} cluster IP\" {dport} -d {cluster_ip} --dport {port} {not_local} -j KUBE-MARK-MASQ"));
        }
    }
    if uses_external {
        nat.chain(&ext_chain);
        if !svc.external_policy_local {
            nat.rule(format!("-A {ext_chain} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"));
        } else {
            if let Some(local) = local_match(&node.local, false) {
                nat.rule(format!("-A {ext_chain} -m comment --comment \"pod traffic for {name} external destinations\" {local} -j {svc_chain}"));
            }
            nat.rule(format!("-A {ext_chain} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"));
            nat.rule(format!("-A {ext_chain} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}"));
        }
        if has_external {
            nat.rule(format!("-A {ext_chain} -j {external_policy_chain}"));
        }
    }
    if uses_fw && has_endpoints {
        nat.chain(&fw_chain);
        let mut sources: Vec<String> = ranges.iter().map(ToString::to_string).collect();
        if node
            .node_ip
            .is_some_and(|n| ranges.iter().any(|r| r.contains(&n)))
        {
            sources.extend(lb_ips.iter().map(ToString::to_string));
        }
        for s in sources {
            nat.rule(format!("-A {fw_chain} -m comment --comment \"{name} loadbalancer IP\" -s {s} -j {ext_chain}"));
        }
    }

    let affinity = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    let mask = match f {
        IpFamily::V4 => "255.255.255.255",
        IpFamily::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    };
    let mut to_endpoints = |chain: &str, eps: &[Endpoint]| {
        if let Some(t) = affinity {
            for e in eps {
                let s = sep(e);
                nat.rule(format!("-A {chain} -m comment --comment \"{name} -> {}\" -m recent --name {s} --mask {mask} --rsource --rcheck --seconds {t} --reap -j {s}", SocketAddr::new(e.ip, e.port)));
            }
        }
        let n = eps.len();
        for (i, e) in eps.iter().enumerate() {
            let s = sep(e);
            let to = SocketAddr::new(e.ip, e.port);
            if i + 1 < n {
                let p = 1.0 / (n - i) as f64;
                nat.rule(format!("-A {chain} -m comment --comment \"{name} -> {to}\" -m statistic --mode random --probability {p:.10} -j {s}"));
            } else {
                nat.rule(format!(
                    "-A {chain} -m comment --comment \"{name} -> {to}\" -j {s}"
                ));
            }
        }
    };
    if uses_cluster {
        to_endpoints(&svc_chain, &cluster_eps);
    }
    if uses_local {
        to_endpoints(&local_chain, &local_eps);
    }
    let mut reachable: BTreeMap<SocketAddr, Endpoint> = BTreeMap::new();
    if uses_cluster {
        reachable.extend(
            cluster_eps
                .iter()
                .map(|e| (SocketAddr::new(e.ip, e.port), e.clone())),
        );
    }
    if uses_local {
        reachable.extend(
            local_eps
                .iter()
                .map(|e| (SocketAddr::new(e.ip, e.port), e.clone())),
        );
    }
    for (to, e) in &reachable {
        let s = sep(e);
        nat.chain(&s);
        nat.rule(format!(
            "-A {s} -m comment --comment \"{name}\" -s {} -j KUBE-MARK-MASQ",
            e.ip
        ));
        let recent = affinity
            .map(|_| format!(" -m recent --name {s} --mask {mask} --rsource --set"))
            .unwrap_or_default();
        nat.rule(format!(
            "-A {s} -m comment --comment \"{name}\"{recent} {dport} -j DNAT --to-destination {to}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::hash16;

    #[test]
    fn chain_hashes_are_upstreams() {
        // upstream's own test fixtures: KUBE-SVC-XPGD46QRK7WJZT7O for
        // ns1/svc1:p80 over TCP, KUBE-SEP-SXIVWICOYRO3J4NJ for its endpoint
        // 10.180.0.1:80.
        assert_eq!(hash16("ns1/svc1:p80tcp"), "XPGD46QRK7WJZT7O");
        assert_eq!(hash16("ns1/svc1:p80tcp10.180.0.1:80"), "SXIVWICOYRO3J4NJ");
    }
}
