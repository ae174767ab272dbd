//! A two-node routed cluster on one L2 segment, with an external client:
//!
//! ```text
//!             lan namespace: bridge br0 (no address)
//!        port-a |          port-b |          port-client |
//!   node A eth0 198.18.0.1   node B eth0 198.18.0.2   client eth0 198.18.0.100
//!   pods 198.18.1.0/24       pods 198.18.2.0/24       (no route to pods)
//! ```
//!
//! Each node routes the other's pod CIDR via the other's node IP (no
//! encapsulation). [`Cluster::new_dual_stack`] adds IPv6 to the same
//! layout: nodes 2001:db8::1 and ::2, client 2001:db8::100, pods
//! 2001:db8:1::/64 and 2001:db8:2::/64, routed the same way. Pods are wired as [`crate::Cni::Routed`] pods are, with
//! their node's IP as gateway. Every namespace is removed on drop, on panic
//! and on SIGINT/SIGTERM (see [`crate::cleanup`]).
//!
//! XDP on a node's `eth0`: a veth's native XDP_TX (and XDP_REDIRECT into a
//! veth) depends on the *peer* having an XDP program, since only then does
//! the driver schedule the peer's NAPI to send the frames; otherwise they
//! wait until unrelated traffic arrives. So every bridge port carries a
//! native XDP program that passes everything (see [`crate::xdp_pass`]), and
//! an XDP program on a node's `eth0` can answer with XDP_TX as on a real NIC.

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::OwnedFd,
};

use anyhow::Context as _;

use crate::{
    POD_VETH_PREFIX, Pod, cleanup,
    ethtool::{self, Offload},
    netns, xdp_pass,
};

pub const LAN_BRIDGE: &str = "br0";
/// The lan-facing interface of nodes and of the client.
pub const LAN_IFACE: &str = "eth0";
pub const LAN_PREFIX_LEN: u8 = 24;
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// The client's IPv6 in a dual-stack cluster.
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
pub const LAN_PREFIX_LEN6: u8 = 64;
/// Pod IPs on each node start at this last octet.
pub const FIRST_POD_HOST: u8 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeId {
    A,
    B,
}

impl NodeId {
    pub const ALL: [NodeId; 2] = [NodeId::A, NodeId::B];

    pub fn index(self) -> usize {
        match self {
            NodeId::A => 0,
            NodeId::B => 1,
        }
    }

    /// 1 for A, 2 for B: the last octet of the node IP and the third of its pod CIDR.
    fn number(self) -> u8 {
        self.index() as u8 + 1
    }

    pub fn other(self) -> NodeId {
        match self {
            NodeId::A => NodeId::B,
            NodeId::B => NodeId::A,
        }
    }

    fn name(self) -> &'static str {
        match self {
            NodeId::A => "a",
            NodeId::B => "b",
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Cidr {
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix_len))
            .unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub id: NodeId,
    pub ns: String,
    pub ip: Ipv4Addr,
    /// 2001:db8::1 (A) or ::2 (B) in a dual-stack cluster.
    pub ip6: Option<Ipv6Addr>,
    /// The node's interface on the lan (where an XDP program would attach).
    pub eth0: String,
    pub pod_cidr: Ipv4Cidr,
    /// 2001:db8:1::/64 (A) or 2001:db8:2::/64 (B) in a dual-stack cluster.
    pub pod_cidr6: Option<String>,
    pub pods: Vec<Pod>,
    pods_created: u8,
}

#[derive(Clone, Debug)]
pub struct Client {
    pub ns: String,
    pub ip: Ipv4Addr,
    pub ip6: Option<Ipv6Addr>,
    pub eth0: String,
}

pub struct Cluster {
    pub id: String,
    pub lan_ns: String,
    nodes: [Node; 2],
    client: Client,
    namespaces: Vec<String>,
    /// The bpf links holding [`xdp_pass`] on the bridge ports; closing them
    /// (or deleting the lan namespace) detaches it.
    xdp_links: Vec<OwnedFd>,
}

impl Cluster {
    pub fn new() -> anyhow::Result<Self> {
        Self::build(false)
    }

    /// The same cluster in both families (see the module docs).
    pub fn new_dual_stack() -> anyhow::Result<Self> {
        Self::build(true)
    }

    fn build(dual_stack: bool) -> anyhow::Result<Self> {
        cleanup::sweep_stale();
        let id = cleanup::unique_id();
        let node = |n: NodeId| Node {
            id: n,
            ns: format!("{id}-node-{n}"),
            ip: Ipv4Addr::new(198, 18, 0, n.number()),
            ip6: dual_stack.then(|| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n.number().into())),
            eth0: LAN_IFACE.to_owned(),
            pod_cidr: Ipv4Cidr {
                addr: Ipv4Addr::new(198, 18, n.number(), 0),
                prefix_len: 24,
            },
            pod_cidr6: dual_stack.then(|| format!("2001:db8:{}::/64", n.number())),
            pods: Vec::new(),
            pods_created: 0,
        };
        let mut cluster = Cluster {
            lan_ns: format!("{id}-lan"),
            nodes: [node(NodeId::A), node(NodeId::B)],
            client: Client {
                ns: format!("{id}-client"),
                ip: CLIENT_IP,
                ip6: dual_stack.then_some(CLIENT_IP6),
                eth0: LAN_IFACE.to_owned(),
            },
            id,
            namespaces: Vec::new(),
            xdp_links: Vec::new(),
        };
        cluster.setup_lan().context("setting up the lan")?;
        for n in NodeId::ALL {
            cluster
                .setup_node(n)
                .with_context(|| format!("setting up node {n}"))?;
        }
        cluster
            .setup_client()
            .context("setting up the external client")?;
        Ok(cluster)
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Every namespace of the cluster that exists now.
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces.clone()
    }

    /// Every lan-facing veth end as (namespace, interface): node and client
    /// `eth0`s and the bridge ports.
    pub fn lan_interfaces(&self) -> Vec<(String, String)> {
        let mut ifaces = Vec::new();
        for (ns, port) in self.lan_members() {
            ifaces.push((ns, LAN_IFACE.to_owned()));
            ifaces.push((self.lan_ns.clone(), port));
        }
        ifaces
    }

    /// The namespace of each node and of the client, with its bridge port name.
    fn lan_members(&self) -> Vec<(String, String)> {
        let mut members: Vec<_> = NodeId::ALL
            .iter()
            .map(|&n| (self.node(n).ns.clone(), format!("port-{n}")))
            .collect();
        members.push((self.client.ns.clone(), "port-client".to_owned()));
        members
    }

    fn add_ns(&mut self, name: &str) -> anyhow::Result<()> {
        cleanup::register(name);
        self.namespaces.push(name.to_owned());
        netns::add(name)
    }

    fn setup_lan(&mut self) -> anyhow::Result<()> {
        self.add_ns(&self.lan_ns.clone())?;
        let lan = Some(self.lan_ns.as_str());
        netns::ip(lan, &["link", "add", LAN_BRIDGE, "type", "bridge"])?;
        netns::ip(lan, &["link", "set", LAN_BRIDGE, "up"])
    }

    /// A veth from bridge port `port` to `eth0` of namespace `ns`, both up.
    ///
    /// TX checksum offload is off on both ends so frames on the lan carry
    /// complete checksums as on a wire: a veth otherwise passes on
    /// CHECKSUM_PARTIAL packets whose L4 checksum only covers the pseudo
    /// header, which an XDP program sees and cannot fix. GRO on the port
    /// enables NAPI on it, without which XDP_TX from the peer `eth0` is
    /// dropped; the native [`xdp_pass`] program on the port makes the driver
    /// kick that NAPI after XDP_TX, without which the frames wait for
    /// unrelated traffic (see the module docs).
    fn plug_into_lan(&mut self, ns: &str, port: &str) -> anyhow::Result<()> {
        let lan = Some(self.lan_ns.as_str());
        netns::ip(
            lan,
            &[
                "link", "add", port, "type", "veth", "peer", "name", LAN_IFACE, "netns", ns,
            ],
        )?;
        for (ns, iface) in [(self.lan_ns.as_str(), port), (ns, LAN_IFACE)] {
            for offload in [Offload::TxChecksum, Offload::Tso, Offload::Gso] {
                ethtool::set_offload(ns, iface, offload, false)?;
            }
        }
        ethtool::set_offload(&self.lan_ns, port, Offload::Gro, true)?;
        self.xdp_links.push(xdp_pass::attach(&self.lan_ns, port)?);
        netns::ip(lan, &["link", "set", port, "master", LAN_BRIDGE, "up"])?;
        netns::ip(Some(ns), &["link", "set", LAN_IFACE, "up"])
    }

    fn setup_node(&mut self, id: NodeId) -> anyhow::Result<()> {
        let node = self.node(id).clone();
        self.add_ns(&node.ns)?;
        // Before any interface exists, so that they all inherit the defaults.
        netns::sysctl(&node.ns, "net.ipv4.ip_forward", "1")?;
        if node.ip6.is_some() {
            netns::sysctl(&node.ns, "net.ipv6.conf.all.forwarding", "1")?;
        }
        netns::sysctl(&node.ns, "net.ipv4.conf.all.rp_filter", "0")?;
        netns::sysctl(&node.ns, "net.ipv4.conf.default.rp_filter", "0")?;
        self.plug_into_lan(&node.ns, &format!("port-{id}"))?;
        let ns = Some(node.ns.as_str());
        netns::ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/{LAN_PREFIX_LEN}", node.ip),
                "dev",
                LAN_IFACE,
            ],
        )?;
        let other = self.node(id.other());
        netns::ip(
            ns,
            &[
                "route",
                "add",
                &other.pod_cidr.to_string(),
                "via",
                &other.ip.to_string(),
                "dev",
                LAN_IFACE,
            ],
        )?;
        if let (Some(ip6), Some(other_ip6), Some(other_pods6)) =
            (node.ip6, other.ip6, &other.pod_cidr6)
        {
            netns::ip(
                ns,
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip6}/{LAN_PREFIX_LEN6}"),
                    "dev",
                    LAN_IFACE,
                    "nodad",
                ],
            )?;
            netns::ip(
                ns,
                &[
                    "-6",
                    "route",
                    "add",
                    other_pods6,
                    "via",
                    &other_ip6.to_string(),
                    "dev",
                    LAN_IFACE,
                ],
            )?;
        }
        Ok(())
    }

    /// No default route: the client is outside the cluster and reaches only
    /// the lan (and what [`Cluster::client_add_route`] adds).
    fn setup_client(&mut self) -> anyhow::Result<()> {
        let ns = self.client.ns.clone();
        self.add_ns(&ns)?;
        self.plug_into_lan(&ns, "port-client")?;
        self.client_add_address(&format!("{}/{LAN_PREFIX_LEN}", self.client.ip))?;
        if let Some(ip6) = self.client.ip6 {
            netns::ip(
                Some(&ns),
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip6}/{LAN_PREFIX_LEN6}"),
                    "dev",
                    LAN_IFACE,
                    "nodad",
                ],
            )?;
        }
        Ok(())
    }

    /// Adds an address (`"198.18.0.101/24"`) to the client's `eth0`, so a
    /// test can send from it by binding its socket there. Use lan addresses
    /// (198.18.0.0/24): nodes reach those on-link.
    pub fn client_add_address(&self, cidr: &str) -> anyhow::Result<()> {
        netns::ip(
            Some(&self.client.ns),
            &["addr", "add", cidr, "dev", LAN_IFACE],
        )
    }

    /// Routes `dst` (`"198.18.3.0/24"`, e.g. load-balancer IPs) from the
    /// client via node `via`, as an upstream router would.
    pub fn client_add_route(&self, dst: &str, via: NodeId) -> anyhow::Result<()> {
        netns::ip(
            Some(&self.client.ns),
            &[
                "route",
                "add",
                dst,
                "via",
                &self.node(via).ip.to_string(),
                "dev",
                LAN_IFACE,
            ],
        )
    }

    /// Adds a pod behind `node`, as a routed CNI does when a pod starts. Pod
    /// IPs are .10, .11, ... of the node's pod CIDR in order of creation,
    /// never reused (in a dual-stack cluster also 2001:db8:N::10, ::11, ...,
    /// with the node's `fe80::1` as gateway); the node-side veths are
    /// `veth0`, `veth1`, ...
    /// Pod names are unique across the cluster.
    pub fn add_pod(&mut self, node: NodeId, name: &str) -> anyhow::Result<Pod> {
        anyhow::ensure!(self.find_pod(name).is_none(), "pod {name} exists");
        let pod_ns = format!("{}-{name}", self.id);
        let n = &mut self.nodes[node.index()];
        let index = n.pods_created;
        n.pods_created = index.saturating_add(1);
        let host = FIRST_POD_HOST
            .checked_add(index)
            .filter(|&h| h < 255)
            .with_context(|| format!("too many pods on node {node}"))?;
        let ip = Ipv4Addr::new(198, 18, node.number(), host);
        let ip6 = n
            .ip6
            .map(|_| Ipv6Addr::new(0x2001, 0xdb8, node.number().into(), 0, 0, 0, 0, host.into()));
        let pod = Pod {
            name: name.to_owned(),
            ns: pod_ns,
            ip,
            ip6,
            host_veth: format!("{POD_VETH_PREFIX}{index}"),
        };
        let (node_ns, gateway) = (n.ns.clone(), n.ip);
        self.add_ns(&pod.ns)?;
        crate::wire_routed_pod(&node_ns, &pod.ns, &pod.host_veth, ip, gateway)
            .with_context(|| format!("setting up pod {name} on node {node}"))?;
        if let Some(ip6) = ip6 {
            crate::wire_routed_pod6(&node_ns, &pod.ns, &pod.host_veth, ip6)
                .with_context(|| format!("setting up pod {name}'s IPv6 on node {node}"))?;
        }
        self.nodes[node.index()].pods.push(pod.clone());
        Ok(pod)
    }

    /// The pod named `name` on any node; panics if there is none.
    pub fn pod(&self, name: &str) -> &Pod {
        self.find_pod(name)
            .map(|(_, pod)| pod)
            .unwrap_or_else(|| panic!("no pod {name} in the cluster"))
    }

    /// The node `name` runs on; panics if there is no such pod.
    pub fn node_of(&self, name: &str) -> NodeId {
        self.find_pod(name)
            .map(|(node, _)| node)
            .unwrap_or_else(|| panic!("no pod {name} in the cluster"))
    }

    fn find_pod(&self, name: &str) -> Option<(NodeId, &Pod)> {
        NodeId::ALL.into_iter().find_map(|n| {
            self.node(n)
                .pods
                .iter()
                .find(|p| p.name == name)
                .map(|p| (n, p))
        })
    }

    /// Removes a pod, its veth and its route, as a CNI does when a pod is deleted.
    pub fn remove_pod(&mut self, name: &str) {
        for node in &mut self.nodes {
            if let Some(i) = node.pods.iter().position(|p| p.name == name) {
                let pod = node.pods.remove(i);
                cleanup::release(&pod.ns);
                self.namespaces.retain(|n| n != &pod.ns);
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.xdp_links.clear();
        for ns in self.namespaces.drain(..).rev() {
            cleanup::release(&ns);
        }
    }
}
