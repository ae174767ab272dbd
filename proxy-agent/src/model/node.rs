//! This node as every mode sees it: its name and labels, its addresses per
//! family, the primary IP of each family, where NodePorts are served and its
//! pod CIDRs. Built from the options, this node's Node object and the host
//! source's interfaces; each mode derives its own settings from it.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::NodeTopology;
use crate::{
    options::{NodePortAddresses, ProxyOptions},
    sources::host::{HostInterface, HostNetwork},
};

/// The options that shape the node model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    pub node_port_addresses: NodePortAddresses,
    /// `bindAddress` when it names one routable address.
    pub bind_address: Option<IpAddr>,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            node_port_addresses: NodePortAddresses::All,
            bind_address: None,
        }
    }
}

impl NodeSettings {
    pub fn from_options(opts: &ProxyOptions) -> Self {
        NodeSettings {
            node_port_addresses: opts.node_port_addresses(),
            bind_address: opts
                .config
                .bind_address
                .trim()
                .parse::<IpAddr>()
                .ok()
                .filter(|a| !a.is_unspecified() && !a.is_loopback()),
        }
    }
}

/// Everything a mode needs to know about this node besides the services.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeModel {
    pub topology: NodeTopology,
    /// The primary IPv4: masquerade source, and the address upstream checks
    /// loadBalancerSourceRanges against to allow LB IPs as sources.
    pub primary_ipv4: Option<Ipv4Addr>,
    pub primary_ipv6: Option<Ipv6Addr>,
    /// Where NodePorts are served (nodePortAddresses applied), sorted.
    pub node_port_addresses: Vec<IpAddr>,
    /// The Node's podCIDRs (`spec.podCIDRs`, else `spec.podCIDR`), both families.
    pub pod_cidrs: Vec<IpNet>,
    /// The host's interfaces, from the host source.
    pub host: Arc<HostNetwork>,
}

impl NodeModel {
    /// The model from the settings, this node's Node object (once received)
    /// and the host's interfaces.
    pub fn build(
        settings: &NodeSettings,
        topology: NodeTopology,
        node: Option<&Node>,
        host: Arc<HostNetwork>,
    ) -> Self {
        let primary_ipv4 = primary_ip(settings, node, &host, |a| match a {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        });
        let primary_ipv6 = primary_ip(settings, node, &host, |a| match a {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        });
        let node_port_addresses = node_port_addresses(
            &settings.node_port_addresses,
            primary_ipv4,
            primary_ipv6,
            &host,
        );
        NodeModel {
            topology,
            primary_ipv4,
            primary_ipv6,
            node_port_addresses,
            pod_cidrs: node.map(node_pod_cidrs).unwrap_or_default(),
            host,
        }
    }

    /// Whether everything but the labels is the same.
    pub fn same_facts(&self, other: &NodeModel) -> bool {
        self.primary_ipv4 == other.primary_ipv4
            && self.primary_ipv6 == other.primary_ipv6
            && self.node_port_addresses == other.node_port_addresses
            && self.pod_cidrs == other.pod_cidrs
            && self.host == other.host
    }

    /// The IPv4 NodePort addresses.
    pub fn node_port_ipv4(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.node_port_addresses.iter().filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
    }

    pub fn interfaces(&self) -> &[HostInterface] {
        &self.host.interfaces
    }
}

/// `--bind-address` when specific, else the Node's first InternalIP (then
/// ExternalIP) of the family, else the first address of the default route's
/// interface. Upstream falls back to 127.0.0.1, which is useless as a
/// masquerade source.
fn primary_ip<A: Copy>(
    settings: &NodeSettings,
    node: Option<&Node>,
    host: &HostNetwork,
    family: impl Fn(IpAddr) -> Option<A>,
) -> Option<A> {
    settings
        .bind_address
        .and_then(&family)
        .or_else(|| node.and_then(|n| node_address(n, "InternalIP", &family)))
        .or_else(|| node.and_then(|n| node_address(n, "ExternalIP", &family)))
        .or_else(|| {
            let name = host.default_route_interface.as_deref()?;
            let iface = host.interfaces.iter().find(|i| i.name == name)?;
            addresses(iface)
                .filter(|a| !is_link_local(a))
                .find_map(&family)
        })
}

fn node_address<A>(node: &Node, kind: &str, family: impl Fn(IpAddr) -> Option<A>) -> Option<A> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == kind)
        .filter_map(|a| a.address.trim().parse::<IpAddr>().ok())
        .find_map(family)
}

fn addresses(iface: &HostInterface) -> impl Iterator<Item = IpAddr> + '_ {
    let v4 = iface.ipv4.iter().map(|a| IpAddr::V4(*a));
    v4.chain(iface.ipv6.iter().map(|a| IpAddr::V6(*a)))
}

/// The Node's podCIDRs (`spec.podCIDRs`, else `spec.podCIDR`), truncated.
pub fn node_pod_cidrs(node: &Node) -> Vec<IpNet> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let raw: Vec<&str> = match &spec.pod_cidrs {
        Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
        _ => spec.pod_cidr.as_deref().into_iter().collect(),
    };
    raw.iter()
        .filter_map(|c| c.trim().parse::<IpNet>().ok())
        .map(|c| c.trunc())
        .collect()
}

/// Upstream's semantics, per family: no CIDR of the family means every
/// address of it; `primary` means the primary IP if it is local (every
/// address of the family without a primary). Loopback addresses are never
/// included: the TC and XDP programs do not see traffic to them (upstream
/// iptables serves them through route_localnet).
fn node_port_addresses(
    mode: &NodePortAddresses,
    primary_ipv4: Option<Ipv4Addr>,
    primary_ipv6: Option<Ipv6Addr>,
    host: &HostNetwork,
) -> Vec<IpAddr> {
    let cidrs: Vec<IpNet> = match mode {
        NodePortAddresses::All => Vec::new(),
        NodePortAddresses::Primary => [primary_ipv4.map(IpAddr::V4), primary_ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
            .map(IpNet::from)
            .collect(),
        NodePortAddresses::Cidrs(list) => list.iter().map(IpNet::trunc).collect(),
    };
    let selected = |a: &IpAddr| {
        let mut same_family = cidrs.iter().filter(|c| c.addr().is_ipv4() == a.is_ipv4());
        let mut any = same_family.clone().peekable();
        any.peek().is_none() || same_family.any(|c| c.contains(a))
    };
    let local: BTreeSet<IpAddr> = host
        .interfaces
        .iter()
        .flat_map(addresses)
        .filter(|a| !a.is_loopback() && !is_link_local(a))
        .filter(selected)
        .collect();
    local.into_iter().collect()
}

/// IPv6 link-local addresses need a zone and never serve NodePorts.
fn is_link_local(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    use super::*;

    fn host() -> Arc<HostNetwork> {
        Arc::new(HostNetwork {
            interfaces: vec![
                HostInterface {
                    name: "lo".into(),
                    index: 1,
                    ipv4: vec![Ipv4Addr::LOCALHOST],
                    ipv6: vec![Ipv6Addr::LOCALHOST],
                    ..HostInterface::default()
                },
                HostInterface {
                    name: "eth0".into(),
                    index: 2,
                    ipv4: vec!["198.18.0.1".parse().unwrap()],
                    ipv6: vec!["fe80::1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
                    ..HostInterface::default()
                },
            ],
            default_route_interface: Some("eth0".into()),
            ..HostNetwork::default()
        })
    }

    fn addrs(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn both_families_have_a_primary_and_node_port_addresses() {
        let m = NodeModel::build(
            &NodeSettings::default(),
            NodeTopology::new("n"),
            None,
            host(),
        );
        assert_eq!(m.primary_ipv4, Some("198.18.0.1".parse().unwrap()));
        assert_eq!(m.primary_ipv6, Some("2001:db8::1".parse().unwrap()));
        assert_eq!(
            m.node_port_addresses,
            addrs(&["198.18.0.1", "2001:db8::1"]),
            "neither loopback nor link-local"
        );
        assert_eq!(
            m.node_port_ipv4().collect::<Vec<_>>(),
            ["198.18.0.1".parse::<Ipv4Addr>().unwrap()]
        );
    }

    #[test]
    fn node_port_cidrs_select_per_family() {
        let settings = NodeSettings {
            node_port_addresses: NodePortAddresses::Cidrs(vec!["2001:db8::/64".parse().unwrap()]),
            bind_address: None,
        };
        let m = NodeModel::build(&settings, NodeTopology::new("n"), None, host());
        assert_eq!(
            m.node_port_addresses,
            addrs(&["198.18.0.1", "2001:db8::1"]),
            "no IPv4 CIDR: every IPv4 address"
        );
        let settings = NodeSettings {
            node_port_addresses: NodePortAddresses::Cidrs(vec!["2001:db8:1::/64".parse().unwrap()]),
            bind_address: None,
        };
        let m = NodeModel::build(&settings, NodeTopology::new("n"), None, host());
        assert_eq!(m.node_port_addresses, addrs(&["198.18.0.1"]));
    }

    #[test]
    fn the_node_objects_addresses_win_over_the_default_route_per_family() {
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "2001:db8::9".into(),
                    },
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "198.18.0.9".into(),
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = NodeModel::build(
            &NodeSettings::default(),
            NodeTopology::new("n"),
            Some(&node),
            host(),
        );
        assert_eq!(m.primary_ipv4, Some("198.18.0.9".parse().unwrap()));
        assert_eq!(m.primary_ipv6, Some("2001:db8::9".parse().unwrap()));
    }
}
