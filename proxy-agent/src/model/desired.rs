//! One [`DesiredService`] per service port: the service's frontends plus the
//! endpoints this node uses under each traffic policy. Identical for every mode.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnet::IpNet;

use super::{
    Endpoint, IpFamily, NamespacedName, NodeModel, Protocol, ServicePortInfo, ServicePortName,
    SessionAffinity, categorize_endpoints,
    service::Balancing,
    trackers::{EndpointsChangeTracker, ServiceChangeTracker},
};

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// What the model needs to know about this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTopology {
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeTopology {
    pub fn new(node_name: impl Into<String>) -> Self {
        NodeTopology {
            node_name: node_name.into(),
            labels: BTreeMap::new(),
        }
    }

    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    /// Only the zone label feeds categorisation (upstream `NodeTopologyConfig`
    /// filters node events the same way).
    pub fn topology_differs(&self, other: &NodeTopology) -> bool {
        self.zone() != other.zone()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilySet {
    pub v4: bool,
    pub v6: bool,
}

impl FamilySet {
    pub const BOTH: FamilySet = FamilySet { v4: true, v6: true };

    pub fn is_empty(&self) -> bool {
        !self.v4 && !self.v6
    }

    pub fn contains(&self, family: IpFamily) -> bool {
        match family {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    pub fn insert(&mut self, family: IpFamily) {
        match family {
            IpFamily::V4 => self.v4 = true,
            IpFamily::V6 => self.v6 = true,
        }
    }
}

/// Everything a mode needs to program one service port. Address lists mix
/// both families; each endpoint list was categorised per family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredService {
    pub name: ServicePortName,
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
    /// Endpoints for Cluster-policy traffic (ready, topology-filtered, else
    /// serving-terminating). Empty when the port never uses Cluster policy.
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints on this node for Local-policy traffic. Empty when unused.
    pub local_endpoints: Vec<Endpoint>,
    /// UDP ports only: the addresses of serving endpoints in neither list
    /// (terminating ones passed over, other zones' or nodes'). Upstream's
    /// stale-flow cleanup keeps the flows to every serving endpoint, whatever
    /// the policy, topology or termination: so does every mode here.
    pub other_serving_ips: Vec<IpAddr>,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// Per family, no range of that family means no restriction.
    pub load_balancer_source_ranges: Vec<IpNet>,
    pub session_affinity: SessionAffinity,
    pub balancing: Balancing,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// Families in which some usable endpoint exists anywhere in the cluster;
    /// without one, traffic should be rejected rather than dropped.
    pub has_any_endpoints: FamilySet,
}

impl DesiredService {
    /// Endpoints for traffic to a cluster IP (internalTrafficPolicy).
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.internal_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    /// Endpoints for NodePort / external IP / load-balancer traffic (externalTrafficPolicy).
    pub fn external_endpoints(&self) -> &[Endpoint] {
        if self.external_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.load_balancer_ips.is_empty()
            || !self.external_ips.is_empty()
    }
}

/// Builds one service port's desired state from its info and its endpoints.
pub fn desired_service(
    name: &ServicePortName,
    info: &ServicePortInfo,
    endpoints: &[Endpoint],
    node: &NodeTopology,
) -> DesiredService {
    // The EndpointSlice controller already marks these ready; redoing it keeps
    // hand-written slices (manifests source) consistent with the API.
    let endpoints: Cow<'_, [Endpoint]> =
        if info.publish_not_ready_addresses && endpoints.iter().any(|e| !e.ready) {
            Cow::Owned(
                endpoints
                    .iter()
                    .cloned()
                    .map(|e| Endpoint { ready: true, ..e })
                    .collect(),
            )
        } else {
            Cow::Borrowed(endpoints)
        };
    let mut desired = DesiredService {
        name: name.clone(),
        cluster_ips: info.cluster_ips.clone(),
        port: info.port,
        protocol: info.protocol,
        cluster_endpoints: Vec::new(),
        local_endpoints: Vec::new(),
        other_serving_ips: Vec::new(),
        node_port: info.node_port,
        external_ips: info.external_ips.clone(),
        load_balancer_ips: info.load_balancer_ips.clone(),
        load_balancer_source_ranges: info.load_balancer_source_ranges.clone(),
        session_affinity: info.session_affinity,
        balancing: info.balancing,
        external_policy_local: info.external_policy_local,
        internal_policy_local: info.internal_policy_local,
        health_check_node_port: info.health_check_node_port,
        has_any_endpoints: FamilySet::default(),
    };
    let dual = info.families().count() > 1;
    for family in info.families() {
        let of_family: Cow<'_, [Endpoint]> =
            if dual || endpoints.iter().any(|e| e.family() != family) {
                Cow::Owned(
                    endpoints
                        .iter()
                        .filter(|e| e.family() == family)
                        .cloned()
                        .collect(),
                )
            } else {
                Cow::Borrowed(&endpoints)
            };
        let cat = categorize_endpoints(&of_family, info, &node.node_name, node.zone());
        if cat.has_any {
            desired.has_any_endpoints.insert(family);
        }
        desired
            .cluster_endpoints
            .extend(cat.cluster.unwrap_or_default());
        desired
            .local_endpoints
            .extend(cat.local.unwrap_or_default());
    }
    if info.protocol == Protocol::Udp {
        desired.other_serving_ips = other_serving_ips(&endpoints, &desired);
    }
    // Kept for the agent's life: no growth slack (an empty Vec grows to four).
    desired.cluster_endpoints.shrink_to_fit();
    desired.local_endpoints.shrink_to_fit();
    desired
}

/// The addresses of `endpoints` that serve but are in neither of `desired`'s lists.
fn other_serving_ips(endpoints: &[Endpoint], desired: &DesiredService) -> Vec<IpAddr> {
    let listed: BTreeSet<IpAddr> = (desired.cluster_endpoints.iter())
        .chain(&desired.local_endpoints)
        .map(|e| e.ip)
        .collect();
    let others: BTreeSet<IpAddr> = (endpoints.iter())
        .filter(|e| e.serving && !listed.contains(&e.ip))
        .map(|e| e.ip)
        .collect();
    others.into_iter().collect()
}

impl DesiredService {
    /// The endpoint addresses whose UDP flows the stale-flow cleanup keeps:
    /// every serving endpoint's (and any it balances to). Empty: the port
    /// has none, and upstream then cleans none of its flows.
    pub fn udp_flow_keepers(&self) -> BTreeSet<IpAddr> {
        (self.cluster_endpoints.iter())
            .chain(&self.local_endpoints)
            .map(|e| e.ip)
            .chain(self.other_serving_ips.iter().copied())
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<ServicePortName, DesiredService>,
    /// This node, as of the sync.
    pub node: NodeModel,
    /// The cluster's service CIDRs, both families (the ServiceCIDR objects,
    /// else the configuration's): traffic to an address inside one that no
    /// service holds is dropped, as upstream's nftables mode does.
    pub service_cidrs: BTreeSet<IpNet>,
}

impl DesiredState {
    /// Rebuilds everything from the trackers' applied state.
    pub fn rebuild(
        services: &ServiceChangeTracker,
        endpoints: &EndpointsChangeTracker,
        node: &NodeTopology,
    ) -> Self {
        // Collected whole: a map built from every entry at once has full
        // nodes, where inserting one by one in hash order left them a third
        // empty (8 MB at 50,000 services). Built on every core: at 50,000
        // services this is a sixth of a second on one. Built in order (names
        // sorted, each service's ports sorted), so that collecting them into
        // the map sorts nothing: sorting the entries themselves (280 bytes
        // each) copied every one about log2(n) times; references are cheap.
        let mut names: Vec<&NamespacedName> = services.services().map(|(nn, _)| nn).collect();
        names.sort_unstable();
        let build = |part: &[&NamespacedName]| -> Vec<DesiredService> {
            part.iter()
                .flat_map(|nn| {
                    let mut ports = build_service(nn, services, endpoints, node);
                    ports.sort_by(|a, b| a.name.cmp(&b.name));
                    ports
                })
                .collect()
        };
        let threads = match names.len() >= PARALLEL_SERVICES {
            true => std::thread::available_parallelism().map_or(1, |n| n.get()),
            false => 1,
        };
        let built: Vec<Vec<DesiredService>> = if threads <= 1 {
            vec![build(&names)]
        } else {
            std::thread::scope(|scope| {
                let workers: Vec<_> = names
                    .chunks(names.len().div_ceil(threads))
                    .map(|part| scope.spawn(move || build(part)))
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let services = built
            .into_iter()
            .flatten()
            .map(|desired| (desired.name.clone(), desired))
            .collect();
        DesiredState {
            services,
            ..DesiredState::default()
        }
    }

    /// Recomputes the given services; returns the service ports whose desired
    /// state was added, changed or removed.
    pub fn update_services<'a>(
        &mut self,
        changed: impl IntoIterator<Item = &'a NamespacedName>,
        services: &ServiceChangeTracker,
        endpoints: &EndpointsChangeTracker,
        node: &NodeTopology,
    ) -> BTreeSet<ServicePortName> {
        let mut touched = BTreeSet::new();
        for nn in changed {
            let mut old = self.remove_service(nn);
            for desired in build_service(nn, services, endpoints, node) {
                if old.remove(&desired.name).as_ref() != Some(&desired) {
                    touched.insert(desired.name.clone());
                }
                self.services.insert(desired.name.clone(), desired);
            }
            touched.extend(old.into_keys());
        }
        touched
    }

    fn remove_service(&mut self, nn: &NamespacedName) -> BTreeMap<ServicePortName, DesiredService> {
        let keys: Vec<ServicePortName> = self
            .services
            .range(ServicePortName::first_of(nn)..)
            .map(|(k, _)| k)
            .take_while(|k| k.belongs_to(nn))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| self.services.remove_entry(&k))
            .collect()
    }

    /// All ports of one service.
    pub fn service(&self, nn: &NamespacedName) -> impl Iterator<Item = &DesiredService> {
        self.services
            .range(ServicePortName::first_of(nn)..)
            .map(|(_, v)| v)
            .take_while(move |v| v.name.belongs_to(nn))
    }
}

/// From this many services on, a rebuild runs on several threads.
const PARALLEL_SERVICES: usize = 2_048;

fn build_service(
    nn: &NamespacedName,
    services: &ServiceChangeTracker,
    endpoints: &EndpointsChangeTracker,
    node: &NodeTopology,
) -> Vec<DesiredService> {
    let Some(ports) = services.ports(nn) else {
        return Vec::new();
    };
    let eps = endpoints.endpoints(nn);
    ports
        .iter()
        .map(|(spn, info)| {
            let list = eps
                .as_ref()
                .and_then(|e| e.get(&spn.port_name, spn.protocol));
            desired_service(spn, info, list.unwrap_or_default(), node)
        })
        .collect()
}
