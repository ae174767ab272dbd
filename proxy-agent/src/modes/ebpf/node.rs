//! The node model as the ebpf mode needs it: what the datapath reads besides
//! the services (`CONFIG`, `LOCAL_POD_CIDRS` and `IFACES`), the addresses
//! NodePorts are served on, and which interfaces the programs attach to.
//!
//! [`node_facts`] is pure (settings and node model in, facts out);
//! [`NodeProgrammer`] writes the facts in an order the datapath can read at
//! any moment.

mod masquerade_ports;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use ipnet::IpNet;
use proxy_common::{
    DatapathConfig, DatapathConfig6, IfaceInfo, V4, V6,
    config::{flags, iface},
    conntrack::{DEFAULT_TCP_CLOSE_NS, DEFAULT_TCP_SYN_SENT_NS, DEFAULT_TCP_TIME_WAIT_NS},
};

pub use masquerade_ports::{LINUX_DEFAULT_EPHEMERAL, masquerade_port_ranges, read_ephemeral_range};

use super::family::AgentFamily;
use super::maps::{MapError, NodeMaps, NodeSnapshot};
use super::programmer::MaglevSettings;
use crate::{
    model::NodeModel,
    options::{
        GoDuration, NodePortAddresses, ProxyOptions,
        ebpf::{BpfConntrackParams, LbAlgorithm, conntrack_params},
    },
    sources::host::{DestinationRouting, HostInterface, HostNetwork},
};

/// The ports above Linux's default ephemeral range (32768-60999): one of the
/// two runs masqueraded flows take with Linux's defaults
/// ([`masquerade_port_ranges`]), and the one datapath tests configure.
pub const SNAT_PORT_MIN: u16 = 61_000;
pub const SNAT_PORT_MAX: u16 = 65_535;

pub use crate::modes::detect_local::DetectLocal;

/// The options that shape the ebpf mode's node facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfNodeSettings {
    pub conntrack: BpfConntrackParams,
    pub masquerade_all: bool,
    pub detect_local: DetectLocal,
    /// `externalInterfaces`; empty means the interfaces holding node addresses.
    pub external_interfaces: Vec<String>,
    pub pod_interface_prefixes: Vec<String>,
    /// NodePorts on 127.0.0.1 for the node's own sockets.
    pub localhost_node_ports: bool,
    pub socket_lb: SocketLbSettings,
    pub maglev: MaglevSettings,
    /// The node's ephemeral port range (`net.ipv4.ip_local_port_range`),
    /// which masqueraded flows stay out of.
    pub ephemeral_ports: (u16, u16),
}

/// Which sockets the socket hooks balance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketLbSettings {
    pub enabled: bool,
    pub host_namespace_only: bool,
    /// The cookie of the agent's own (the node's) network namespace; 0 unknown.
    pub host_netns_cookie: u64,
}

impl SocketLbSettings {
    fn flags(&self) -> u32 {
        match (self.enabled, self.host_namespace_only) {
            (false, _) => 0,
            (true, true) => flags::SOCKET_LB_HOST,
            (true, false) => flags::SOCKET_LB_HOST | flags::SOCKET_LB_PODS,
        }
    }
}

impl EbpfNodeSettings {
    pub fn from_options(opts: &ProxyOptions) -> Self {
        let config = &opts.config;
        let detect_local = DetectLocal::from_options(opts);
        EbpfNodeSettings {
            // The CPU count only sizes the table, which is not used here.
            conntrack: conntrack_params(config, &opts.ebpf, 1),
            masquerade_all: opts.masquerade_all(),
            detect_local,
            external_interfaces: opts.ebpf.external_interfaces.clone(),
            pod_interface_prefixes: opts.ebpf.pod_prefixes().to_vec(),
            localhost_node_ports: localhost_node_ports(opts),
            maglev: MaglevSettings {
                table_size: opts.ebpf.load_balancing.maglev_table_size,
                by_default: opts.ebpf.load_balancing.algorithm == LbAlgorithm::Maglev,
            },
            socket_lb: SocketLbSettings {
                enabled: opts.ebpf.socket_lb_enabled(),
                host_namespace_only: opts.ebpf.socket_lb_host_namespace_only(),
                host_netns_cookie: 0,
            },
            ephemeral_ports: read_ephemeral_range().unwrap_or_else(|e| {
                tracing::warn!(
                    error = %e,
                    assumed = ?LINUX_DEFAULT_EPHEMERAL,
                    "cannot read the node's ephemeral port range; masqueraded flows assume Linux's default"
                );
                LINUX_DEFAULT_EPHEMERAL
            }),
        }
    }

    /// The pod-facing interfaces present on the host, name -> ifindex:
    /// where `tc_from_pod` attaches.
    pub fn pod_interfaces(&self, host: &HostNetwork) -> BTreeMap<String, u32> {
        host.interfaces
            .iter()
            .filter(|i| self.is_pod_facing(i))
            .map(|i| (i.name.clone(), i.index))
            .collect()
    }

    fn is_pod_facing(&self, i: &HostInterface) -> bool {
        self.pod_interface_prefixes
            .iter()
            .any(|p| i.name.starts_with(p.as_str()))
    }

    fn is_external_interface(&self, i: &HostInterface) -> bool {
        if !self.external_interfaces.is_empty() {
            return self.external_interfaces.contains(&i.name);
        }
        // Service addresses are often put on `lo`; TC and XDP there would only
        // see the node talking to itself.
        !self.is_pod_facing(i) && i.name != "lo" && i.ipv4.iter().any(|a| !a.is_loopback())
    }

    /// The flags of every interface that has one (by ifindex), and the
    /// external ones by name: where the NodePort / LB / external-IP programs
    /// (XDP, `tc_from_netdev`) attach.
    pub fn interface_roles(&self, host: &HostNetwork) -> InterfaceRoles {
        // A bridge whose ports are pod interfaces faces pods, whatever it is called.
        let pod_bridges: BTreeSet<&str> = host
            .interfaces
            .iter()
            .filter(|i| self.is_pod_facing(i))
            .filter_map(|i| i.master.as_deref())
            .collect();
        let mut roles = InterfaceRoles::default();
        for i in &host.interfaces {
            let mut info = IfaceInfo::default();
            if is_local_pod_interface(&self.detect_local, i) {
                info.flags |= iface::LOCAL_POD;
            } else if !pod_bridges.contains(i.name.as_str()) && self.is_external_interface(i) {
                info.flags |= iface::EXTERNAL;
                roles.external.insert(i.name.clone(), i.index);
            }
            if i.peer_in_other_netns {
                info.flags |= iface::PEER_IN_OTHER_NETNS;
            }
            if info.flags != 0 {
                roles.flags.insert(i.index, info);
            }
        }
        roles
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceRoles {
    pub flags: BTreeMap<u32, IfaceInfo>,
    pub external: BTreeMap<String, u32>,
}

/// The node addresses the service programmer needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddressesOf<F: AgentFamily> {
    /// The node's primary address of the family: masquerade source, and the
    /// address upstream checks loadBalancerSourceRanges against to allow LB
    /// IPs as sources.
    pub primary: Option<F::Ip>,
    /// Where NodePorts are served (nodePortAddresses applied), sorted.
    pub node_ports: Vec<F::Ip>,
    /// NodePorts are served on 127.0.0.1 to the node's own sockets too
    /// (`iptables.localhostNodePorts`, where nodePortAddresses allows
    /// loopback). IPv4 only, as upstream's.
    pub localhost_node_ports: bool,
    /// Every address of the family on the node's interfaces: endpoints
    /// there are the node itself (hostNetwork pods).
    pub host: BTreeSet<F::Ip>,
}

impl<F: AgentFamily> Default for NodeAddressesOf<F> {
    fn default() -> Self {
        NodeAddressesOf {
            primary: None,
            node_ports: Vec::new(),
            localhost_node_ports: false,
            host: BTreeSet::new(),
        }
    }
}

/// The node's IPv4 addresses.
pub type NodeAddresses = NodeAddressesOf<V4>;

/// Everything the datapath needs to know about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub config: DatapathConfig,
    pub config6: DatapathConfig6,
    /// Both families' local pod CIDRs.
    pub local_pod_cidrs: BTreeSet<IpNet>,
    /// The cluster's service CIDRs (both families): an address inside one
    /// that no service holds is dropped. From the desired state
    /// ([`NodeFacts::with_service_cidrs`]), not the node.
    pub service_cidrs: BTreeSet<IpNet>,
    /// Interfaces with at least one flag, by ifindex.
    pub ifaces: BTreeMap<u32, IfaceInfo>,
    pub addresses: NodeAddresses,
    pub addresses6: NodeAddressesOf<V6>,
    /// The interfaces flagged external, name -> ifindex.
    pub external_interfaces: BTreeMap<String, u32>,
}

/// The ebpf mode's view of the node model.
pub fn node_facts(settings: &EbpfNodeSettings, node: &NodeModel) -> NodeFacts {
    let primary = node.primary_ipv4;
    let (detect_flag, local_pod_cidrs) = match &settings.detect_local {
        DetectLocal::ClusterCidr(cidrs) => (by_cidr(cidrs), cidrs.clone()),
        DetectLocal::NodeCidr => (by_cidr(&node.pod_cidrs), node.pod_cidrs.clone()),
        DetectLocal::BridgeInterface(_) | DetectLocal::InterfaceNamePrefix(_) => {
            (flags::DETECT_LOCAL_BY_INTERFACE, Vec::new())
        }
        DetectLocal::None => (0, Vec::new()),
    };
    let masquerade_all = if settings.masquerade_all {
        flags::MASQUERADE_ALL
    } else {
        0
    };
    let ct = &settings.conntrack;
    let snat_ports = masquerade_port_ranges(settings.ephemeral_ports);
    let config = DatapathConfig {
        tcp_established_ns: nanos(ct.tcp_established),
        tcp_closing_ns: nanos(ct.tcp_close_wait),
        udp_ns: nanos(ct.udp),
        udp_stream_ns: nanos(ct.udp_stream),
        // kube-proxy has no settings for these: the kernel's defaults.
        tcp_syn_sent_ns: DEFAULT_TCP_SYN_SENT_NS,
        tcp_time_wait_ns: DEFAULT_TCP_TIME_WAIT_NS,
        tcp_close_ns: DEFAULT_TCP_CLOSE_NS,
        masquerade_addr_be: primary.map_or(0, |a| u32::from(a).to_be()),
        flags: masquerade_all
            | detect_flag
            | settings.socket_lb.flags()
            | routing_flags(node.host.destination_routing),
        snat_port_min: snat_ports[0].0,
        snat_port_max: snat_ports[0].1,
        snat_port_min2: snat_ports[1].0,
        snat_port_max2: snat_ports[1].1,
        host_netns_cookie: settings.socket_lb.host_netns_cookie,
    };
    let roles = settings.interface_roles(&node.host);
    NodeFacts {
        config,
        config6: DatapathConfig6 {
            masquerade_addr_be: node.primary_ipv6.map_or([0; 4], V6::to_be),
        },
        local_pod_cidrs: local_pod_cidrs.into_iter().map(|c| c.trunc()).collect(),
        service_cidrs: BTreeSet::new(),
        ifaces: roles.flags,
        addresses: addresses_of::<V4>(node, primary, settings.localhost_node_ports),
        addresses6: addresses_of::<V6>(node, node.primary_ipv6, false),
        external_interfaces: roles.external,
    }
}

impl NodeFacts {
    /// These facts with the cluster's service CIDRs (and the flag that
    /// turns their lookup on when there are any).
    pub fn with_service_cidrs(mut self, cidrs: &BTreeSet<IpNet>) -> Self {
        self.service_cidrs = cidrs.iter().map(IpNet::trunc).collect();
        if self.service_cidrs.is_empty() {
            self.config.flags &= !flags::SERVICE_CIDRS;
        } else {
            self.config.flags |= flags::SERVICE_CIDRS;
        }
        self
    }
}

/// The `DatapathConfig` flags that let new flows share a destination's
/// cached next hop: one per family whose routing allows it.
fn routing_flags(routing: DestinationRouting) -> u32 {
    (if routing.ipv4 {
        flags::ROUTES_BY_DESTINATION
    } else {
        0
    }) | (if routing.ipv6 {
        flags::ROUTES_BY_DESTINATION6
    } else {
        0
    })
}

/// The `DatapathConfig` flags of CIDR-based detection: one per family that has a CIDR.
fn by_cidr(cidrs: &[IpNet]) -> u32 {
    let v4 = cidrs.iter().any(|c| matches!(c, IpNet::V4(_)));
    let v6 = cidrs.iter().any(|c| matches!(c, IpNet::V6(_)));
    (if v4 { flags::DETECT_LOCAL_BY_CIDR } else { 0 })
        | (if v6 { flags::DETECT_LOCAL_BY_CIDR6 } else { 0 })
}

fn addresses_of<F: AgentFamily>(
    node: &NodeModel,
    primary: Option<F::Ip>,
    localhost_node_ports: bool,
) -> NodeAddressesOf<F> {
    let interfaces = node.interfaces().iter();
    let host = interfaces
        .flat_map(|i| {
            let v4 = i.ipv4.iter().map(|a| IpAddr::V4(*a));
            v4.chain(i.ipv6.iter().map(|a| IpAddr::V6(*a)))
        })
        .filter(|a| !a.is_loopback())
        .filter_map(|a| F::ip(&a))
        .collect();
    NodeAddressesOf {
        primary,
        node_ports: node.node_port_addresses.iter().filter_map(F::ip).collect(),
        localhost_node_ports,
        host,
    }
}

/// As upstream's iptables mode: `iptables.localhostNodePorts` where
/// nodePortAddresses allows 127.0.0.1 (all addresses, or a CIDR holding it).
/// Only the socket hooks can serve them; without those the agent says so.
fn localhost_node_ports(opts: &ProxyOptions) -> bool {
    let allowed = match opts.node_port_addresses() {
        NodePortAddresses::All => true,
        NodePortAddresses::Primary => false,
        NodePortAddresses::Cidrs(cidrs) => cidrs
            .iter()
            .any(|c| c.contains(&std::net::IpAddr::V4(Ipv4Addr::LOCALHOST))),
    };
    allowed && opts.config.iptables.localhost_node_ports.unwrap_or(true)
}

fn nanos(d: GoDuration) -> u64 {
    u64::try_from(d.nanos()).unwrap_or(0)
}

/// The programs run on the bridge's ports, so those count as the bridge.
fn is_local_pod_interface(detect: &DetectLocal, i: &HostInterface) -> bool {
    match detect {
        DetectLocal::BridgeInterface(bridge) => {
            i.name == *bridge || i.master.as_deref() == Some(bridge.as_str())
        }
        DetectLocal::InterfaceNamePrefix(prefix) => i.name.starts_with(prefix.as_str()),
        _ => false,
    }
}

/// Writes [`NodeFacts`] to the maps, changes only.
///
/// Order: new CIDRs and interface flags before the `CONFIG` that turns their
/// detection on, stale ones after it.
#[derive(Debug, Default)]
pub struct NodeProgrammer {
    config: Option<DatapathConfig>,
    config6: Option<DatapathConfig6>,
    local_pod_cidrs: BTreeSet<IpNet>,
    service_cidrs: BTreeSet<IpNet>,
    ifaces: BTreeMap<u32, IfaceInfo>,
}

impl NodeProgrammer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes over what adopted (pinned) maps hold, so the next
    /// [`NodeProgrammer::apply`] writes only what differs and removes the rest.
    pub fn adopt(snapshot: &NodeSnapshot) -> Self {
        NodeProgrammer {
            config: Some(snapshot.config),
            config6: Some(snapshot.config6),
            local_pod_cidrs: snapshot.local_pod_cidrs.iter().copied().collect(),
            service_cidrs: snapshot.service_cidrs.iter().copied().collect(),
            ifaces: snapshot.ifaces.iter().copied().collect(),
        }
    }

    /// Returns the number of map writes and deletes made.
    pub fn apply(
        &mut self,
        facts: &NodeFacts,
        maps: &mut impl NodeMaps,
    ) -> Result<usize, MapError> {
        let mut ops = 0;
        for cidr in &facts.local_pod_cidrs {
            if !self.local_pod_cidrs.contains(cidr) {
                maps.put_local_pod_cidr(*cidr)?;
                self.local_pod_cidrs.insert(*cidr);
                ops += 1;
            }
        }
        // New service CIDRs first, stale ones last: an address of a CIDR
        // that stays is never left unguarded between two writes.
        for cidr in &facts.service_cidrs {
            if !self.service_cidrs.contains(cidr) {
                maps.put_service_cidr(*cidr)?;
                self.service_cidrs.insert(*cidr);
                ops += 1;
            }
        }
        for (index, info) in &facts.ifaces {
            if self.ifaces.get(index) != Some(info) {
                maps.put_iface(*index, info)?;
                self.ifaces.insert(*index, *info);
                ops += 1;
            }
        }
        // The IPv6 settings before the flags that may turn IPv6 detection on.
        if self.config6 != Some(facts.config6) {
            maps.put_config6(&facts.config6)?;
            self.config6 = Some(facts.config6);
            ops += 1;
        }
        if self.config != Some(facts.config) {
            maps.put_config(&facts.config)?;
            self.config = Some(facts.config);
            ops += 1;
        }
        let stale: Vec<IpNet> = self
            .local_pod_cidrs
            .difference(&facts.local_pod_cidrs)
            .copied()
            .collect();
        for cidr in stale {
            maps.delete_local_pod_cidr(cidr)?;
            self.local_pod_cidrs.remove(&cidr);
            ops += 1;
        }
        let stale: Vec<IpNet> = self
            .service_cidrs
            .difference(&facts.service_cidrs)
            .copied()
            .collect();
        for cidr in stale {
            maps.delete_service_cidr(cidr)?;
            self.service_cidrs.remove(&cidr);
            ops += 1;
        }
        let stale: Vec<u32> = self
            .ifaces
            .keys()
            .filter(|i| !facts.ifaces.contains_key(i))
            .copied()
            .collect();
        for index in stale {
            maps.delete_iface(index)?;
            self.ifaces.remove(&index);
            ops += 1;
        }
        Ok(ops)
    }
}

#[cfg(test)]
mod tests;
