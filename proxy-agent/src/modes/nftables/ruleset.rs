//! One family's `kube-proxy` table from the model, as upstream's nftables
//! proxier writes it (`pkg/proxy/nftables/proxier.go`): the same table,
//! chains, sets and maps, the same names (so operators' habits and tools
//! carry over), the same rules. Pure: the transaction is built here and run
//! by the proxier.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use ipnet::IpNet;
use sha2::{Digest as _, Sha256};

use super::nft::{BaseChain, Family, Object, Transaction};
use crate::model::{DesiredService, DesiredState, Endpoint, ServicePortName, SessionAffinity};

pub const TABLE: &str = "kube-proxy";

const SERVICES: &str = "services";
const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NODEPORT_IPS: &str = "nodeport-ips";
const CLUSTER_IPS: &str = "cluster-ips";
const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
const REJECT_CHAIN: &str = "reject-chain";
const FIREWALL_IPS: &str = "firewall-ips";
const FIREWALL_CHECK: &str = "firewall-check";
const MARK_MASQ: &str = "mark-for-masquerade";
const MASQUERADING: &str = "masquerading";

/// How this node's pods are told apart (`detectLocalMode`), per family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalDetector {
    None,
    Cidr(IpNet),
    Bridge(String),
    InterfacePrefix(String),
}

impl LocalDetector {
    fn if_local(&self, f: Family) -> Option<String> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidr(net) => Some(format!("{} saddr {net}", f.expr())),
            LocalDetector::Bridge(name) => Some(format!("iifname {name}")),
            LocalDetector::InterfacePrefix(p) => Some(format!("iifname \"{p}*\"")),
        }
    }

    fn if_not_local(&self, f: Family) -> Option<String> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidr(net) => Some(format!("{} saddr != {net}", f.expr())),
            LocalDetector::Bridge(name) => Some(format!("iifname != {name}")),
            LocalDetector::InterfacePrefix(p) => Some(format!("iifname != \"{p}*\"")),
        }
    }
}

/// What one family's ruleset depends on besides the services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRules {
    pub family: Family,
    /// `1 << masqueradeBit`.
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    pub local: LocalDetector,
    /// `None`: NodePorts on every local address (`nodePortAddresses` empty);
    /// else these addresses.
    pub node_port_ips: Option<Vec<IpAddr>>,
    /// The node's address of the family (LB source ranges holding it allow the LB IPs).
    pub node_ip: Option<IpAddr>,
}

/// What a sync leaves for the next: the service chains and affinity sets it wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub chains: BTreeSet<String>,
    pub affinity_sets: BTreeSet<String>,
}

/// upstream's hashAndTruncate: 8 characters of the name's SHA-256 in base32, a
/// dash, the name (truncated to fit nft's 256-byte names).
fn hash_and_truncate(name: &str) -> String {
    let hash = Sha256::digest(name.as_bytes());
    let encoded = data_encoding::BASE32.encode(&hash);
    let mut out = format!("{}-{name}", &encoded[..8]);
    const MAX: usize = 256 - 16;
    if out.len() > MAX {
        out.truncate(MAX - 3);
        out.push_str("...");
    }
    out
}

fn port_base(spn: &ServicePortName) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}",
        spn.namespace,
        spn.name,
        spn.protocol.to_string().to_lowercase(),
        spn.port_name
    ))
}

fn endpoint_base(spn: &ServicePortName, ep: &Endpoint) -> String {
    let ip = ep.ip.to_string().replace(':', ".");
    hash_and_truncate(&format!(
        "{}/{}/{}/{}__{ip}/{}",
        spn.namespace,
        spn.name,
        spn.protocol.to_string().to_lowercase(),
        spn.port_name,
        ep.port
    ))
}

fn chain(name: &str) -> Object {
    Object::Chain {
        name: name.into(),
        base: None,
        comment: None,
    }
}

fn rule(chain: &str, rule: String) -> Object {
    Object::Rule {
        chain: chain.into(),
        rule,
        comment: None,
    }
}

fn rule_c(chain: &str, rule: String, comment: &str) -> Object {
    Object::Rule {
        chain: chain.into(),
        rule,
        comment: Some(comment.into()),
    }
}

fn element(set: &str, key: Vec<String>, value: Option<String>, comment: Option<&str>) -> Object {
    Object::Element {
        set: set.into(),
        key,
        value,
        comment: comment.map(Into::into),
    }
}

/// The regular chains a transaction writes: each is added when the table
/// does not hold it yet, else flushed (upstream's `ensureChain`), once per
/// transaction. Flushing a chain added in the same transaction would only
/// lengthen it: at 10,000 services that is 110,000 commands.
pub struct Chains<'a> {
    seen: BTreeSet<String>,
    existing: &'a BTreeSet<String>,
}

impl<'a> Chains<'a> {
    pub fn new(existing: &'a BTreeSet<String>) -> Self {
        Self {
            seen: BTreeSet::new(),
            existing,
        }
    }
}

fn ensure_chain(tx: &mut Transaction, name: &str, chains: &mut Chains<'_>) {
    if chains.seen.insert(name.into()) {
        if chains.existing.contains(name) {
            tx.flush(chain(name));
        } else {
            tx.add(chain(name));
        }
    }
}

/// Numeric priorities: nft 1.0 accepts `dstnat` only in some hooks
/// (dstnat is -100, srcnat 100; filters run 10 before DNAT, and 10 after
/// for the post-DNAT output check), as upstream's.
const BASE_CHAINS: [(&str, &str, &str, &str); 8] = [
    ("filter-prerouting", "filter", "prerouting", "-110"),
    ("filter-input", "filter", "input", "-110"),
    ("filter-forward", "filter", "forward", "-110"),
    ("filter-output", "filter", "output", "-110"),
    ("filter-output-post-dnat", "filter", "output", "-90"),
    ("nat-prerouting", "nat", "prerouting", "-100"),
    ("nat-output", "nat", "output", "-100"),
    ("nat-postrouting", "nat", "postrouting", "100"),
];

const JUMPS: [(&str, &str, &str); 11] = [
    (NODEPORT_ENDPOINTS_CHECK, "filter-input", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-input", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-forward", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-output", "ct state new"),
    (FIREWALL_CHECK, "filter-prerouting", "ct state new"),
    (FIREWALL_CHECK, "filter-output", "ct state new"),
    (CLUSTER_IPS_CHECK, "filter-forward", "ct state new"),
    (CLUSTER_IPS_CHECK, "filter-output-post-dnat", "ct state new"),
    (SERVICES, "nat-output", ""),
    (SERVICES, "nat-prerouting", ""),
    (MASQUERADING, "nat-postrouting", ""),
];

/// The table's fixed part: base chains, dispatch chains, sets and maps.
fn setup(
    tx: &mut Transaction,
    node: &NodeRules,
    service_cidrs: &[IpNet],
    created: &mut Chains<'_>,
) {
    let f = node.family;
    let (ip, addr) = (f.expr(), f.addr_type());
    let no_localhost = match f {
        Family::Ip => "ip daddr != 127.0.0.0/8",
        Family::Ip6 => "ip6 daddr != ::1",
    };
    tx.add(Object::Table {
        comment: "rules for kube-proxy".into(),
    });
    for (name, kind, hook, priority) in BASE_CHAINS {
        let c = Object::Chain {
            name: name.into(),
            base: Some(BaseChain {
                kind,
                hook,
                priority,
            }),
            comment: None,
        };
        tx.add(c.clone());
        tx.flush(c);
    }
    for (dst, src, extra) in JUMPS {
        ensure_chain(tx, dst, created);
        let r = if extra.is_empty() {
            format!("jump {dst}")
        } else {
            format!("{extra} jump {dst}")
        };
        tx.add(rule(src, r));
    }
    for c in [SERVICES, MASQUERADING, MARK_MASQ] {
        ensure_chain(tx, c, created);
    }
    let mark = format!("{:#08x}", node.masquerade_mark);
    tx.add(rule(MARK_MASQ, format!("mark set mark or {mark}")));
    tx.add(rule(MASQUERADING, format!("mark and {mark} == 0 return")));
    tx.add(rule(MASQUERADING, format!("mark set mark xor {mark}")));
    tx.add(rule(MASQUERADING, "masquerade fully-random".into()));

    tx.add(Object::Set {
        name: CLUSTER_IPS.into(),
        kind: addr.into(),
        flags: Vec::new(),
        timeout_s: None,
        comment: Some("Active ClusterIPs".into()),
    });
    tx.flush(Object::Set {
        name: CLUSTER_IPS.into(),
        kind: addr.into(),
        flags: Vec::new(),
        timeout_s: None,
        comment: None,
    });
    tx.add(rule_c(
        CLUSTER_IPS_CHECK,
        format!("{ip} daddr @{CLUSTER_IPS} reject"),
        "Reject traffic to invalid ports of ClusterIPs",
    ));
    let cidrs: Vec<String> = service_cidrs
        .iter()
        .filter(|n| {
            matches!(
                (f, n),
                (Family::Ip, IpNet::V4(_)) | (Family::Ip6, IpNet::V6(_))
            )
        })
        .map(ToString::to_string)
        .collect();
    if !cidrs.is_empty() {
        tx.add(rule_c(
            CLUSTER_IPS_CHECK,
            format!("{ip} daddr {{ {} }} drop", cidrs.join(", ")),
            "Drop traffic to unallocated ClusterIPs",
        ));
    }

    let nodeport_set = Object::Set {
        name: NODEPORT_IPS.into(),
        kind: addr.into(),
        flags: Vec::new(),
        timeout_s: None,
        comment: Some("IPs that accept NodePort traffic".into()),
    };
    tx.add(nodeport_set.clone());
    match &node.node_port_ips {
        None => tx.delete(nodeport_set),
        Some(ips) => {
            tx.flush(nodeport_set);
            for a in ips.iter().filter(|a| !a.is_loopback()) {
                tx.add(element(NODEPORT_IPS, vec![a.to_string()], None, None));
            }
        }
    }

    for (name, kind, comment) in [
        (
            NO_ENDPOINT_SERVICES,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service : verdict".into(),
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            FIREWALL_IPS,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            SERVICE_IPS,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            SERVICE_NODEPORTS,
            "inet_proto . inet_service : verdict".into(),
            "NodePort traffic",
        ),
    ] {
        tx.add(Object::Map {
            name: name.into(),
            kind: kind.clone(),
            comment: Some(comment.into()),
        });
        tx.flush(Object::Map {
            name: name.into(),
            kind,
            comment: None,
        });
    }

    tx.add(Object::Chain {
        name: REJECT_CHAIN.into(),
        base: None,
        comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports".into()),
    });
    tx.flush(chain(REJECT_CHAIN));
    tx.add(rule(REJECT_CHAIN, "reject".into()));

    tx.add(rule(
        SERVICE_ENDPOINTS_CHECK,
        format!("{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
    ));
    tx.add(rule(
        FIREWALL_CHECK,
        format!("{ip} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"),
    ));
    tx.add(rule(
        SERVICES,
        format!("{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
    ));
    match node.node_port_ips {
        None => {
            tx.add(rule(NODEPORT_ENDPOINTS_CHECK, format!("fib daddr type local {no_localhost} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}")));
            tx.add(rule(SERVICES, format!("fib daddr type local {no_localhost} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}")));
        }
        Some(_) => {
            tx.add(rule(NODEPORT_ENDPOINTS_CHECK, format!("{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}")));
            tx.add(rule(
                SERVICES,
                format!(
                    "{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
                ),
            ));
        }
    }
}

fn of_family(f: Family, ip: &IpAddr) -> bool {
    matches!(
        (f, ip),
        (Family::Ip, IpAddr::V4(_)) | (Family::Ip6, IpAddr::V6(_))
    )
}

/// What one service port's rules consist of, so a later sync can replace
/// them alone: its map elements, chains and affinity sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceObjects {
    pub elements: Vec<(String, Vec<String>)>,
    pub chains: BTreeSet<String>,
    pub affinity_sets: BTreeSet<String>,
}

/// A service port's rules in a transaction of their own, and what they are.
fn service_objects(
    node: &NodeRules,
    svc: &DesiredService,
    created: &mut Chains<'_>,
) -> (Transaction, ServiceObjects) {
    let mut tx = Transaction::new(node.family, TABLE);
    let mut written = Written::default();
    service(&mut tx, node, svc, created, &mut written);
    let objects = ServiceObjects {
        // The cluster-ips set is shared by a service's ports: rebuilt whole.
        elements: tx
            .added_elements()
            .into_iter()
            .filter(|(set, _)| set != CLUSTER_IPS)
            .collect(),
        chains: written.chains,
        affinity_sets: written.affinity_sets,
    };
    (tx, objects)
}

fn delete_set(name: &str) -> Object {
    Object::Set {
        name: name.into(),
        kind: String::new(),
        flags: Vec::new(),
        timeout_s: None,
        comment: None,
    }
}

/// The whole table for `desired`; `existing` is what the table holds now
/// (stale service chains are flushed, to be deleted by a later sync once
/// no map element names them, as upstream does; stale affinity sets go).
pub fn build(
    node: &NodeRules,
    desired: &DesiredState,
    existing: &super::nft::Listing,
) -> (
    Transaction,
    Written,
    BTreeMap<ServicePortName, ServiceObjects>,
) {
    let f = node.family;
    let mut tx = Transaction::new(f, TABLE);
    let mut created = Chains::new(&existing.chains);
    let cidrs: Vec<IpNet> = desired.service_cidrs.iter().copied().collect();
    setup(&mut tx, node, &cidrs, &mut created);
    let mut written = Written::default();
    let mut objects = BTreeMap::new();
    for (spn, svc) in &desired.services {
        let (part, o) = service_objects(node, svc, &mut created);
        tx.append(part);
        written.chains.extend(o.chains.iter().cloned());
        written
            .affinity_sets
            .extend(o.affinity_sets.iter().cloned());
        objects.insert(spn.clone(), o);
    }
    for name in &existing.chains {
        if name.contains('/') && !written.chains.contains(name) {
            tx.flush(chain(name));
        }
    }
    for name in &existing.sets {
        if name.starts_with("affinity-") && !written.affinity_sets.contains(name) {
            tx.delete(delete_set(name));
        }
    }
    (tx, written, objects)
}

/// What a partial sync changes.
pub struct Partial {
    pub tx: Transaction,
    /// The new objects of the changed ports (`None`: the port went).
    pub updated: BTreeMap<ServicePortName, Option<ServiceObjects>>,
    /// Chains the changed ports no longer use: flushed now, to delete later.
    pub stale_chains: BTreeSet<String>,
}

/// Replaces only the rules of the service ports in `changed` (upstream's
/// partial sync): their old map elements go, their chains are rewritten,
/// the chains and affinity sets they no longer use are flushed or deleted,
/// and the shared `cluster-ips` set is rebuilt.
pub fn build_partial(
    node: &NodeRules,
    desired: &DesiredState,
    changed: &BTreeSet<ServicePortName>,
    previous: &BTreeMap<ServicePortName, ServiceObjects>,
) -> Partial {
    let f = node.family;
    let mut tx = Transaction::new(f, TABLE);
    tx.flush(Object::Set {
        name: CLUSTER_IPS.into(),
        kind: f.addr_type().into(),
        flags: Vec::new(),
        timeout_s: None,
        comment: None,
    });
    let ips: BTreeSet<IpAddr> = desired
        .services
        .values()
        .filter_map(|s| s.cluster_ips.iter().find(|a| of_family(f, a)).copied())
        .collect();
    for ip in ips {
        tx.add(element(CLUSTER_IPS, vec![ip.to_string()], None, None));
    }
    let existing: BTreeSet<String> = changed
        .iter()
        .filter_map(|spn| previous.get(spn))
        .flat_map(|o| o.chains.iter().cloned())
        .collect();
    let mut created = Chains::new(&existing);
    let mut updated = BTreeMap::new();
    let mut stale_chains = BTreeSet::new();
    for spn in changed {
        let old = previous.get(spn).cloned().unwrap_or_default();
        for (set, key) in &old.elements {
            tx.delete(Object::Element {
                set: set.clone(),
                key: key.clone(),
                value: None,
                comment: None,
            });
        }
        let new = desired.services.get(spn).map(|svc| {
            let (part, o) = service_objects(node, svc, &mut created);
            tx.append(part);
            o
        });
        let keep = new.clone().unwrap_or_default();
        for c in old.chains.difference(&keep.chains) {
            tx.flush(chain(c));
            stale_chains.insert(c.clone());
        }
        for s in old.affinity_sets.difference(&keep.affinity_sets) {
            tx.delete(delete_set(s));
        }
        updated.insert(spn.clone(), new);
    }
    Partial {
        tx,
        updated,
        stale_chains,
    }
}

fn service(
    tx: &mut Transaction,
    node: &NodeRules,
    svc: &DesiredService,
    created: &mut Chains<'_>,
    written: &mut Written,
) {
    let f = node.family;
    let ip = f.expr();
    let Some(cluster_ip) = svc.cluster_ips.iter().find(|a| of_family(f, a)).copied() else {
        return;
    };
    let spn = &svc.name;
    let name = spn.to_string();
    let protocol = svc.protocol.to_string().to_lowercase();
    let port = svc.port.to_string();
    let base = port_base(spn);
    let cluster_chain = format!("service-{base}");
    let local_chain = format!("local-{base}");
    let external_chain = format!("external-{base}");
    let firewall_chain = format!("firewall-{base}");

    let fam = |eps: &[Endpoint]| -> Vec<Endpoint> {
        eps.iter()
            .filter(|e| of_family(f, &e.ip))
            .cloned()
            .collect()
    };
    let cluster_eps = fam(&svc.cluster_endpoints);
    let local_eps = fam(&svc.local_endpoints);
    let has_endpoints = svc.has_any_endpoints.contains(f.ip_family());
    let externally = svc.node_port.is_some()
        || svc.external_ips.iter().any(|a| of_family(f, a))
        || svc.load_balancer_ips.iter().any(|a| of_family(f, a));
    let uses_cluster = !cluster_eps.is_empty() && (!svc.internal_policy_local || externally);
    let uses_local = !local_eps.is_empty()
        && (svc.internal_policy_local || (svc.external_policy_local && externally));

    let mut all_reachable: BTreeMap<(IpAddr, u16), Endpoint> = BTreeMap::new();
    if uses_cluster {
        all_reachable.extend(cluster_eps.iter().map(|e| ((e.ip, e.port), e.clone())));
    }
    if uses_local {
        all_reachable.extend(local_eps.iter().map(|e| ((e.ip, e.port), e.clone())));
    }
    let ep_chain = |e: &Endpoint| format!("endpoint-{}", endpoint_base(spn, e));
    let affinity_set = |e: &Endpoint| format!("affinity-{}", endpoint_base(spn, e));
    for e in all_reachable.values() {
        let c = ep_chain(e);
        ensure_chain(tx, &c, created);
        written.chains.insert(c);
    }
    if uses_cluster {
        ensure_chain(tx, &cluster_chain, created);
        written.chains.insert(cluster_chain.clone());
    }
    if uses_local {
        ensure_chain(tx, &local_chain, created);
        written.chains.insert(local_chain.clone());
    }

    let (internal_chain, has_internal) = if svc.internal_policy_local {
        (&local_chain, has_endpoints && !local_eps.is_empty())
    } else {
        (&cluster_chain, has_endpoints)
    };
    let (external_policy_chain, has_external) = if svc.external_policy_local {
        (&local_chain, has_endpoints && !local_eps.is_empty())
    } else {
        (&cluster_chain, has_endpoints)
    };
    let uses_external = has_endpoints && externally;
    if uses_external {
        ensure_chain(tx, &external_chain, created);
        written.chains.insert(external_chain.clone());
    }
    let (internal_verdict, external_verdict) = if !has_endpoints {
        (
            format!("goto {REJECT_CHAIN}"),
            format!("goto {REJECT_CHAIN}"),
        )
    } else {
        ("drop".to_string(), "drop".to_string())
    };

    // The cluster IP.
    tx.add(element(
        CLUSTER_IPS,
        vec![cluster_ip.to_string()],
        None,
        None,
    ));
    let key = |a: &IpAddr| vec![a.to_string(), protocol.clone(), port.clone()];
    if has_internal {
        tx.add(element(
            SERVICE_IPS,
            key(&cluster_ip),
            Some(format!("goto {internal_chain}")),
            None,
        ));
    } else {
        tx.add(element(
            NO_ENDPOINT_SERVICES,
            key(&cluster_ip),
            Some(internal_verdict),
            Some(&name),
        ));
    }

    for a in svc.external_ips.iter().filter(|a| of_family(f, a)) {
        if has_endpoints {
            tx.add(element(
                SERVICE_IPS,
                key(a),
                Some(format!("goto {external_chain}")),
                None,
            ));
        }
        if !has_external {
            tx.add(element(
                NO_ENDPOINT_SERVICES,
                key(a),
                Some(external_verdict.clone()),
                Some(&name),
            ));
        }
    }

    let lb_ips: Vec<IpAddr> = svc
        .load_balancer_ips
        .iter()
        .filter(|a| of_family(f, a))
        .copied()
        .collect();
    let ranges: Vec<IpNet> = svc
        .load_balancer_source_ranges
        .iter()
        .filter(|n| of_family(f, &n.addr()))
        .copied()
        .collect();
    let uses_firewall = !lb_ips.is_empty() && !ranges.is_empty();
    if uses_firewall {
        ensure_chain(tx, &firewall_chain, created);
        written.chains.insert(firewall_chain.clone());
        let mut sources: Vec<String> = ranges.iter().map(ToString::to_string).collect();
        if node
            .node_ip
            .is_some_and(|n| ranges.iter().any(|r| r.contains(&n)))
        {
            sources.extend(lb_ips.iter().map(ToString::to_string));
        }
        tx.add(rule(
            &firewall_chain,
            format!("{ip} saddr != {{ {} }} drop", sources.join(", ")),
        ));
    }
    for a in &lb_ips {
        if has_endpoints {
            tx.add(element(
                SERVICE_IPS,
                key(a),
                Some(format!("goto {external_chain}")),
                None,
            ));
        }
        if uses_firewall {
            tx.add(element(
                FIREWALL_IPS,
                key(a),
                Some(format!("goto {firewall_chain}")),
                Some(&name),
            ));
        }
    }
    if !has_external {
        for a in &lb_ips {
            tx.add(element(
                NO_ENDPOINT_SERVICES,
                key(a),
                Some(external_verdict.clone()),
                Some(&name),
            ));
        }
    }

    if let Some(np) = svc.node_port {
        let np_key = vec![protocol.clone(), np.to_string()];
        if has_endpoints {
            tx.add(element(
                SERVICE_NODEPORTS,
                np_key.clone(),
                Some(format!("goto {external_chain}")),
                None,
            ));
        }
        if !has_external {
            tx.add(element(
                NO_ENDPOINT_NODEPORTS,
                np_key,
                Some(external_verdict.clone()),
                Some(&name),
            ));
        }
    }

    if has_internal {
        let matcher = format!("{ip} daddr {cluster_ip} {protocol} dport {}", svc.port);
        if node.masquerade_all {
            tx.add(rule(internal_chain, format!("{matcher} jump {MARK_MASQ}")));
        } else if let Some(not_local) = node.local.if_not_local(f) {
            tx.add(rule(
                internal_chain,
                format!("{matcher} {not_local} jump {MARK_MASQ}"),
            ));
        }
    }

    if uses_external {
        if !svc.external_policy_local {
            tx.add(rule(&external_chain, format!("jump {MARK_MASQ}")));
        } else {
            if let Some(local) = node.local.if_local(f) {
                tx.add(rule_c(
                    &external_chain,
                    format!("{local} goto {cluster_chain}"),
                    "short-circuit pod traffic",
                ));
            }
            tx.add(rule_c(
                &external_chain,
                format!("fib saddr type local jump {MARK_MASQ}"),
                "masquerade local traffic",
            ));
            tx.add(rule_c(
                &external_chain,
                format!("fib saddr type local goto {cluster_chain}"),
                "short-circuit local traffic",
            ));
        }
        if has_external {
            tx.add(rule(
                &external_chain,
                format!("goto {external_policy_chain}"),
            ));
        }
    }

    let affinity = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    if let Some(timeout) = affinity {
        for e in all_reachable.values() {
            let s = affinity_set(e);
            tx.add(Object::Set {
                name: s.clone(),
                kind: f.addr_type().into(),
                flags: vec!["dynamic", "timeout"],
                timeout_s: Some(timeout),
                comment: None,
            });
            written.affinity_sets.insert(s);
        }
    }

    let to_endpoints = |tx: &mut Transaction, chain_name: &str, eps: &[Endpoint]| {
        if affinity.is_some() {
            for e in eps {
                tx.add(rule(
                    chain_name,
                    format!("{ip} saddr @{} goto {}", affinity_set(e), ep_chain(e)),
                ));
            }
        }
        for choice in endpoint_choice(eps.iter().map(ep_chain)) {
            tx.add(rule(chain_name, choice));
        }
    };
    if uses_cluster {
        to_endpoints(tx, &cluster_chain, &cluster_eps);
    }
    if uses_local {
        to_endpoints(tx, &local_chain, &local_eps);
    }

    for e in all_reachable.values() {
        let c = ep_chain(e);
        tx.add(rule(&c, format!("{ip} saddr {} jump {MARK_MASQ}", e.ip)));
        if affinity.is_some() {
            tx.add(rule(
                &c,
                format!("update @{} {{ {ip} saddr }}", affinity_set(e)),
            ));
        }
        tx.add(rule(
            &c,
            format!(
                "meta l4proto {protocol} dnat to {}",
                SocketAddr::new(e.ip, e.port)
            ),
        ));
    }
}

/// The rules that pick one of `targets` uniformly: rule `i` of `n` jumps with probability `1/(n-i)`, so every endpoint gets
/// `1/n` (the cascade of upstream's iptables mode, in nft's `numgen`).
///
/// Upstream's nftables mode writes one `numgen random mod N vmap { ... }`
/// instead, but each such anonymous map costs the kernel a walk of the whole
/// transaction when it is bound (`__nft_set_trans_bind`): measured on this
/// kernel, a full sync of 10,000 services of 10 endpoints took 160 s that
/// way and 7 s this way. A new connection pays up to N rule evaluations,
/// as in iptables mode.
fn endpoint_choice(targets: impl ExactSizeIterator<Item = String>) -> Vec<String> {
    let n = targets.len();
    targets
        .enumerate()
        .map(|(i, target)| match n - i {
            1 => format!("goto {target}"),
            left => format!("numgen random mod {left} 0 goto {target}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn endpoint_choice_is_uniform() {
        let n = 7u64;
        let rules = endpoint_choice((0..n as usize).map(|i| format!("e{i}")));
        // P(rule i jumps) = P(reached) * 1/mod, as a fraction num/den.
        let (mut reach_num, mut reach_den) = (1u64, 1u64);
        for (i, r) in rules.iter().enumerate() {
            assert!(r.ends_with(&format!("goto e{i}")), "{r}");
            let modulus: u64 = r
                .strip_prefix("numgen random mod ")
                .map_or(1, |rest| rest.split(' ').next().unwrap().parse().unwrap());
            assert_eq!(reach_num * n, reach_den * modulus, "rule {i}: {r}");
            reach_num *= modulus - 1;
            reach_den *= modulus;
        }
        assert_eq!(reach_num, 0, "the last rule always jumps");
    }

    #[test]
    fn chain_names_are_upstreams() {
        // The examples of upstream's servicePortChainNameBase and
        // servicePortEndpointChainNameBase.
        let spn = ServicePortName {
            namespace: "ns1".into(),
            name: "svc1".into(),
            port_name: "p80".into(),
            protocol: Protocol::Tcp,
        };
        assert_eq!(port_base(&spn), "ULMVA6XW-ns1/svc1/tcp/p80");
        let ep = Endpoint::new("10.180.0.1".parse().unwrap(), 80);
        assert_eq!(
            endpoint_base(&spn, &ep),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
    }
}
