//! The node's network facts, turned into what the datapath reads besides the
//! services: `CONFIG`, `LOCAL_POD_CIDRS` and `IFACES`, and the addresses
//! NodePorts are served on.
//!
//! [`node_facts`] is pure (settings, Node object and host interfaces in,
//! facts out); [`HostNetwork::read`] reads the live system; [`NodeProgrammer`]
//! writes the facts in an order the datapath can read at any moment.

mod host;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnet::{IpNet, Ipv4Net};
use k8s_openapi::api::core::v1::Node;
use proxy_common::{
    DatapathConfig, IfaceInfo,
    config::{flags, iface},
};

pub use host::{HostInterface, HostNetwork, snat_port_overlap, warn_if_snat_ports_overlap};

use super::maps::{MapError, NodeMaps};
use crate::options::{
    GoDuration, NodePortAddresses, ProxyOptions,
    ebpf::{BpfConntrackParams, conntrack_params},
};

/// Source ports of masqueraded flows: above Linux's default ephemeral range
/// (32768-60999), so the node's own connections never pick them.
pub const SNAT_PORT_MIN: u16 = 61_000;
pub const SNAT_PORT_MAX: u16 = 65_535;

/// How local pod traffic is recognised (`detectLocalMode`), IPv4 only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetectLocal {
    /// No detection, like upstream's no-op detector (ClusterCIDR mode without
    /// an IPv4 cluster CIDR, or NodeCIDR before the Node has an IPv4 podCIDR).
    None,
    ClusterCidr(Vec<Ipv4Net>),
    /// The Node's IPv4 podCIDRs.
    NodeCidr,
    BridgeInterface(String),
    InterfaceNamePrefix(String),
}

/// The options that shape the node facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    pub conntrack: BpfConntrackParams,
    pub masquerade_all: bool,
    pub detect_local: DetectLocal,
    pub node_port_addresses: NodePortAddresses,
    /// `bindAddress` when it names one routable IPv4 address.
    pub bind_address: Option<Ipv4Addr>,
    /// `externalInterfaces`; empty means the interfaces holding node addresses.
    pub external_interfaces: Vec<String>,
    pub pod_interface_prefixes: Vec<String>,
}

impl NodeSettings {
    pub fn from_options(opts: &ProxyOptions) -> Self {
        let config = &opts.config;
        let detect_local = match config.detect_local_mode.as_str() {
            "NodeCIDR" => DetectLocal::NodeCidr,
            "BridgeInterface" => {
                DetectLocal::BridgeInterface(config.detect_local.bridge_interface.clone())
            }
            "InterfaceNamePrefix" => {
                DetectLocal::InterfaceNamePrefix(config.detect_local.interface_name_prefix.clone())
            }
            _ => {
                let cidrs = ipv4_nets(&opts.cluster_cidrs());
                if cidrs.is_empty() {
                    DetectLocal::None
                } else {
                    DetectLocal::ClusterCidr(cidrs)
                }
            }
        };
        NodeSettings {
            // The CPU count only sizes the table, which is not used here.
            conntrack: conntrack_params(config, &opts.ebpf, 1),
            masquerade_all: opts.masquerade_all(),
            detect_local,
            node_port_addresses: opts.node_port_addresses(),
            bind_address: config
                .bind_address
                .trim()
                .parse::<Ipv4Addr>()
                .ok()
                .filter(|a| !a.is_unspecified() && !a.is_loopback()),
            external_interfaces: opts.ebpf.external_interfaces.clone(),
            pod_interface_prefixes: opts.ebpf.pod_prefixes().to_vec(),
        }
    }
}

/// The node addresses the service programmer needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddresses {
    /// The node's primary IPv4: masquerade source, and the address upstream
    /// checks loadBalancerSourceRanges against to allow LB IPs as sources.
    pub primary: Option<Ipv4Addr>,
    /// Where NodePorts are served (nodePortAddresses applied), sorted.
    pub node_ports: Vec<Ipv4Addr>,
}

/// Everything the datapath needs to know about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub config: DatapathConfig,
    pub local_pod_cidrs: BTreeSet<Ipv4Net>,
    /// Interfaces with at least one flag, by ifindex.
    pub ifaces: BTreeMap<u32, IfaceInfo>,
    pub addresses: NodeAddresses,
    /// The interfaces flagged external, name -> ifindex: where the
    /// NodePort / LB / external-IP programs (XDP, `tc_from_netdev`) attach.
    pub external_interfaces: BTreeMap<String, u32>,
}

/// Computes the node facts from the settings, this node's Node object (if
/// already received) and the host's interfaces.
pub fn node_facts(settings: &NodeSettings, node: Option<&Node>, host: &HostNetwork) -> NodeFacts {
    let primary = primary_ipv4(settings, node, host);
    let (detect_flag, local_pod_cidrs) = match &settings.detect_local {
        DetectLocal::ClusterCidr(cidrs) => (flags::DETECT_LOCAL_BY_CIDR, cidrs.clone()),
        DetectLocal::NodeCidr => {
            let cidrs = node.map(node_pod_cidrs).unwrap_or_default();
            let flag = if cidrs.is_empty() {
                0
            } else {
                flags::DETECT_LOCAL_BY_CIDR
            };
            (flag, cidrs)
        }
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
    let config = DatapathConfig {
        tcp_established_ns: nanos(ct.tcp_established),
        tcp_closing_ns: nanos(ct.tcp_close_wait),
        udp_ns: nanos(ct.udp),
        udp_stream_ns: nanos(ct.udp_stream),
        masquerade_addr_be: primary.map_or(0, |a| u32::from(a).to_be()),
        flags: masquerade_all | detect_flag,
        snat_port_min: SNAT_PORT_MIN,
        snat_port_max: SNAT_PORT_MAX,
        _pad: 0,
    };

    // A bridge whose ports are pod interfaces faces pods, whatever it is called.
    let pod_bridges: BTreeSet<&str> = host
        .interfaces
        .iter()
        .filter(|i| is_pod_facing(settings, i))
        .filter_map(|i| i.master.as_deref())
        .collect();
    let mut ifaces = BTreeMap::new();
    let mut external_interfaces = BTreeMap::new();
    for i in &host.interfaces {
        let mut info = IfaceInfo::default();
        if is_local_pod_interface(&settings.detect_local, i) {
            info.flags |= iface::LOCAL_POD;
        } else if !pod_bridges.contains(i.name.as_str()) && is_external_interface(settings, i) {
            info.flags |= iface::EXTERNAL;
            external_interfaces.insert(i.name.clone(), i.index);
        }
        if info.flags != 0 {
            ifaces.insert(i.index, info);
        }
    }

    NodeFacts {
        config,
        local_pod_cidrs: local_pod_cidrs.into_iter().map(|c| c.trunc()).collect(),
        ifaces,
        addresses: NodeAddresses {
            primary,
            node_ports: node_port_addresses(&settings.node_port_addresses, primary, host),
        },
        external_interfaces,
    }
}

fn nanos(d: GoDuration) -> u64 {
    u64::try_from(d.nanos()).unwrap_or(0)
}

fn ipv4_nets(nets: &[IpNet]) -> Vec<Ipv4Net> {
    nets.iter()
        .filter_map(|n| match n {
            IpNet::V4(n) => Some(n.trunc()),
            IpNet::V6(_) => None,
        })
        .collect()
}

/// `--bind-address` when specific, else the Node's first IPv4 InternalIP
/// (then ExternalIP), else the address of the default route's interface.
/// Upstream falls back to 127.0.0.1, which is useless as a masquerade source.
fn primary_ipv4(
    settings: &NodeSettings,
    node: Option<&Node>,
    host: &HostNetwork,
) -> Option<Ipv4Addr> {
    settings
        .bind_address
        .or_else(|| node.and_then(|n| node_address(n, "InternalIP")))
        .or_else(|| node.and_then(|n| node_address(n, "ExternalIP")))
        .or_else(|| {
            let name = host.default_route_interface.as_deref()?;
            let iface = host.interfaces.iter().find(|i| i.name == name)?;
            iface.ipv4.first().copied()
        })
}

fn node_address(node: &Node, kind: &str) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == kind)
        .find_map(|a| a.address.trim().parse().ok())
}

/// The Node's IPv4 podCIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
pub fn node_pod_cidrs(node: &Node) -> Vec<Ipv4Net> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let raw: Vec<&str> = match &spec.pod_cidrs {
        Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
        _ => spec.pod_cidr.as_deref().into_iter().collect(),
    };
    raw.iter()
        .filter_map(|c| c.trim().parse::<Ipv4Net>().ok())
        .map(|c| c.trunc())
        .collect()
}

/// Upstream's semantics: no IPv4 CIDR means every address; `primary` means
/// the primary IP if it is local (every address without a primary IPv4).
/// Loopback addresses are never included: the TC and XDP programs do not see
/// traffic to them (upstream iptables serves them through route_localnet).
fn node_port_addresses(
    mode: &NodePortAddresses,
    primary: Option<Ipv4Addr>,
    host: &HostNetwork,
) -> Vec<Ipv4Addr> {
    let cidrs: Vec<Ipv4Net> = match mode {
        NodePortAddresses::All => Vec::new(),
        NodePortAddresses::Primary => primary.map(Ipv4Net::from).into_iter().collect(),
        NodePortAddresses::Cidrs(list) => ipv4_nets(list),
    };
    let local: BTreeSet<Ipv4Addr> = host
        .interfaces
        .iter()
        .flat_map(|i| i.ipv4.iter().copied())
        .filter(|a| !a.is_loopback())
        .filter(|a| cidrs.is_empty() || cidrs.iter().any(|c| c.contains(a)))
        .collect();
    local.into_iter().collect()
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

fn is_pod_facing(settings: &NodeSettings, i: &HostInterface) -> bool {
    settings
        .pod_interface_prefixes
        .iter()
        .any(|p| i.name.starts_with(p.as_str()))
}

fn is_external_interface(settings: &NodeSettings, i: &HostInterface) -> bool {
    if !settings.external_interfaces.is_empty() {
        return settings.external_interfaces.contains(&i.name);
    }
    let pod_facing = is_pod_facing(settings, i);
    // Service addresses are often put on `lo`; TC and XDP there would only
    // see the node talking to itself.
    !pod_facing && i.name != "lo" && i.ipv4.iter().any(|a| !a.is_loopback())
}

/// Writes [`NodeFacts`] to the maps, changes only.
///
/// Order: new CIDRs and interface flags before the `CONFIG` that turns their
/// detection on, stale ones after it.
#[derive(Debug, Default)]
pub struct NodeProgrammer {
    config: Option<DatapathConfig>,
    local_pod_cidrs: BTreeSet<Ipv4Net>,
    ifaces: BTreeMap<u32, IfaceInfo>,
}

impl NodeProgrammer {
    pub fn new() -> Self {
        Self::default()
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
        for (index, info) in &facts.ifaces {
            if self.ifaces.get(index) != Some(info) {
                maps.put_iface(*index, info)?;
                self.ifaces.insert(*index, *info);
                ops += 1;
            }
        }
        if self.config != Some(facts.config) {
            maps.put_config(&facts.config)?;
            self.config = Some(facts.config);
            ops += 1;
        }
        let stale: Vec<Ipv4Net> = self
            .local_pod_cidrs
            .difference(&facts.local_pod_cidrs)
            .copied()
            .collect();
        for cidr in stale {
            maps.delete_local_pod_cidr(cidr)?;
            self.local_pod_cidrs.remove(&cidr);
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
