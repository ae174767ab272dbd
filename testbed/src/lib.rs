//! Builds network-namespace topologies for tests, the demo and benchmarks:
//! a node namespace (where the agent runs), pods on veths behind it, and an
//! external client on a separate link ([`Testbed`]); or two nodes and a
//! client on one lan ([`cluster::Cluster`]). Addresses come from 198.18.0.0/15.
//! Everything is removed on drop, on panic, and on Ctrl-C.
//!
//! On veths, native XDP_TX from one end only leaves promptly when the peer
//! end has an XDP program too; the cluster's bridge ports therefore carry a
//! pass-everything program ([`xdp_pass`]).

pub mod cgroup;
pub mod cleanup;
pub mod clients;
pub mod cluster;
pub mod echo;
pub mod ethtool;
pub mod netns;
pub mod sctp;
pub mod servers;
pub mod xdp_pass;

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::Context as _;

/// How pods are wired to their node, as the two common CNI families do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cni {
    /// Each pod has a /32 behind its own veth, routed by the node (Calico, Cilium).
    Routed,
    /// Pods share a /24 on a Linux bridge in the node (bridge plugin, flannel).
    Bridge,
}

/// The pod gateway in routed mode: an address of the node's loopback that pods reach on-link.
pub const ROUTED_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Bridge mode: the bridge's address and the pods' subnet.
pub const BRIDGE_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
pub const BRIDGE_NAME: &str = "cbr0";
/// The node's address on the external link, and the external client's.
pub const NODE_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 1);
pub const EXTERNAL_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 2);
/// The same in a dual-stack testbed, in IPv6.
pub const NODE_EXTERNAL_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 1);
pub const EXTERNAL_CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2);
/// The node's interface towards the external client.
pub const NODE_EXTERNAL_IFACE: &str = "ext0";
/// Host-side pod veths are named with this prefix, as many CNIs do.
pub const POD_VETH_PREFIX: &str = "veth";

#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address in a dual-stack testbed.
    pub ip6: Option<Ipv6Addr>,
    /// The pod's veth end inside the node namespace.
    pub host_veth: String,
}

pub struct Testbed {
    pub id: String,
    pub cni: Cni,
    /// Pods, the node and the external client have IPv6 addresses too.
    pub dual_stack: bool,
    pub node_ns: String,
    pub external_ns: String,
    pub pods: Vec<Pod>,
    pods_created: usize,
    namespaces: Vec<String>,
}

impl Testbed {
    /// A node with `pod_names` pods (in that order, addresses 198.18.1.10, .11, ...)
    /// and an external client.
    pub fn new(cni: Cni, pod_names: &[&str]) -> anyhow::Result<Self> {
        Self::build(cni, pod_names, false)
    }

    /// The same in both families: pods also get 2001:db8:1::10, ::11, ...
    /// (routed, with the node's `fe80::1` on each pod veth as gateway), the
    /// node's external interface [`NODE_EXTERNAL_IP6`] and the external
    /// client [`EXTERNAL_CLIENT_IP6`]. Routed pods only.
    pub fn new_dual_stack(pod_names: &[&str]) -> anyhow::Result<Self> {
        Self::build(Cni::Routed, pod_names, true)
    }

    fn build(cni: Cni, pod_names: &[&str], dual_stack: bool) -> anyhow::Result<Self> {
        cleanup::sweep_stale();
        let id = cleanup::unique_id();
        let mut tb = Testbed {
            node_ns: format!("{id}-node"),
            external_ns: format!("{id}-ext"),
            id,
            cni,
            dual_stack,
            pods: Vec::new(),
            pods_created: 0,
            namespaces: Vec::new(),
        };
        tb.add_ns(&tb.node_ns.clone())?;
        tb.setup_node().context("setting up the node namespace")?;
        tb.setup_external()
            .context("setting up the external client")?;
        if dual_stack {
            tb.setup_ipv6().context("setting up IPv6")?;
        }
        for name in pod_names {
            tb.add_pod(name)?;
        }
        Ok(tb)
    }

    fn add_ns(&mut self, name: &str) -> anyhow::Result<()> {
        cleanup::register(name);
        self.namespaces.push(name.to_owned());
        netns::add(name)
    }

    fn setup_node(&self) -> anyhow::Result<()> {
        let ns = Some(self.node_ns.as_str());
        netns::sysctl(&self.node_ns, "net.ipv4.ip_forward", "1")?;
        netns::sysctl(&self.node_ns, "net.ipv4.conf.all.rp_filter", "0")?;
        netns::sysctl(&self.node_ns, "net.ipv4.conf.default.rp_filter", "0")?;
        match self.cni {
            Cni::Routed => netns::ip(
                ns,
                &["addr", "add", &format!("{ROUTED_GATEWAY}/32"), "dev", "lo"],
            ),
            Cni::Bridge => {
                netns::ip(ns, &["link", "add", BRIDGE_NAME, "type", "bridge"])?;
                netns::ip(
                    ns,
                    &[
                        "addr",
                        "add",
                        &format!("{BRIDGE_GATEWAY}/24"),
                        "dev",
                        BRIDGE_NAME,
                    ],
                )?;
                netns::ip(ns, &["link", "set", BRIDGE_NAME, "up"])
            }
        }
    }

    fn setup_external(&mut self) -> anyhow::Result<()> {
        let ext = self.external_ns.clone();
        self.add_ns(&ext)?;
        let node = Some(self.node_ns.as_str());
        netns::ip(
            node,
            &[
                "link",
                "add",
                NODE_EXTERNAL_IFACE,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &ext,
            ],
        )?;
        netns::ip(
            node,
            &[
                "addr",
                "add",
                &format!("{NODE_EXTERNAL_IP}/24"),
                "dev",
                NODE_EXTERNAL_IFACE,
            ],
        )?;
        netns::ip(node, &["link", "set", NODE_EXTERNAL_IFACE, "up"])?;
        let ext = Some(ext.as_str());
        netns::ip(
            ext,
            &[
                "addr",
                "add",
                &format!("{EXTERNAL_CLIENT_IP}/24"),
                "dev",
                "eth0",
            ],
        )?;
        netns::ip(ext, &["link", "set", "eth0", "up"])?;
        netns::ip(
            ext,
            &[
                "route",
                "add",
                "default",
                "via",
                &NODE_EXTERNAL_IP.to_string(),
            ],
        )
    }

    fn setup_ipv6(&self) -> anyhow::Result<()> {
        netns::sysctl(&self.node_ns, "net.ipv6.conf.all.forwarding", "1")?;
        let (node, ext) = (Some(self.node_ns.as_str()), Some(self.external_ns.as_str()));
        let v6 = |ns, args: &[&str]| {
            let mut all = vec!["-6"];
            all.extend_from_slice(args);
            netns::ip(ns, &all)
        };
        let node_ip = format!("{NODE_EXTERNAL_IP6}/64");
        v6(
            node,
            &["addr", "add", &node_ip, "dev", NODE_EXTERNAL_IFACE, "nodad"],
        )?;
        let client_ip = format!("{EXTERNAL_CLIENT_IP6}/64");
        v6(ext, &["addr", "add", &client_ip, "dev", "eth0", "nodad"])?;
        v6(
            ext,
            &[
                "route",
                "add",
                "default",
                "via",
                &NODE_EXTERNAL_IP6.to_string(),
            ],
        )
    }

    /// Adds a pod (a namespace on a new veth), as a CNI does when a pod starts.
    /// Addresses are 198.18.1.10, .11, ... in order of creation, never reused.
    pub fn add_pod(&mut self, name: &str) -> anyhow::Result<Pod> {
        let n = self.pods_created;
        self.pods_created += 1;
        let host = 10 + u8::try_from(n).context("too many pods")?;
        let ip = Ipv4Addr::new(198, 18, 1, host);
        self.wire_pod(name, ip, &format!("{POD_VETH_PREFIX}{n}"))
            .with_context(|| format!("setting up pod {name}"))?;
        Ok(self.pod(name).clone())
    }

    fn wire_pod(&mut self, name: &str, ip: Ipv4Addr, host_veth: &str) -> anyhow::Result<()> {
        let host_veth = host_veth.to_owned();
        let pod_ns = format!("{}-{name}", self.id);
        self.add_ns(&pod_ns)?;
        let node = Some(self.node_ns.as_str());
        let pod = Some(pod_ns.as_str());
        match self.cni {
            Cni::Routed => {
                wire_routed_pod(&self.node_ns, &pod_ns, &host_veth, ip, ROUTED_GATEWAY)?;
            }
            Cni::Bridge => {
                add_pod_veth(&self.node_ns, &host_veth, &pod_ns)?;
                netns::ip(
                    node,
                    &["link", "set", &host_veth, "master", BRIDGE_NAME, "up"],
                )?;
                netns::ip(pod, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
                netns::ip(pod, &["link", "set", "eth0", "up"])?;
                netns::ip(
                    pod,
                    &[
                        "route",
                        "add",
                        "default",
                        "via",
                        &BRIDGE_GATEWAY.to_string(),
                    ],
                )?;
            }
        }
        let ip6 = if self.dual_stack {
            let ip6 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, u16::from(ip.octets()[3]));
            wire_routed_pod6(&self.node_ns, &pod_ns, &host_veth, ip6)?;
            Some(ip6)
        } else {
            None
        };
        self.pods.push(Pod {
            name: name.to_owned(),
            ns: pod_ns,
            ip,
            ip6,
            host_veth,
        });
        Ok(())
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name} in the testbed"))
    }

    /// Removes a pod and its veth, as a CNI does when a pod is deleted.
    pub fn remove_pod(&mut self, name: &str) {
        if let Some(i) = self.pods.iter().position(|p| p.name == name) {
            let pod = self.pods.remove(i);
            cleanup::release(&pod.ns);
            self.namespaces.retain(|n| n != &pod.ns);
        }
    }
}

/// A veth named `host_veth` in `node_ns` whose peer is `eth0` in `pod_ns`.
fn add_pod_veth(node_ns: &str, host_veth: &str, pod_ns: &str) -> anyhow::Result<()> {
    netns::ip(
        Some(node_ns),
        &[
            "link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", pod_ns,
        ],
    )
}

/// Wires a pod as routed CNIs do: the pod's /32 is routed to its veth in the
/// node, and the pod's default route goes via `gateway`, an address of the
/// node that the pod reaches on-link (the node answers ARP for it).
pub(crate) fn wire_routed_pod(
    node_ns: &str,
    pod_ns: &str,
    host_veth: &str,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
) -> anyhow::Result<()> {
    add_pod_veth(node_ns, host_veth, pod_ns)?;
    let (node, pod) = (Some(node_ns), Some(pod_ns));
    let gateway = gateway.to_string();
    netns::ip(node, &["link", "set", host_veth, "up"])?;
    netns::ip(
        node,
        &["route", "add", &format!("{ip}/32"), "dev", host_veth],
    )?;
    netns::ip(pod, &["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
    netns::ip(pod, &["link", "set", "eth0", "up"])?;
    netns::ip(
        pod,
        &["route", "add", &gateway, "dev", "eth0", "scope", "link"],
    )?;
    netns::ip(
        pod,
        &["route", "add", "default", "via", &gateway, "dev", "eth0"],
    )
}

/// The IPv6 half of a routed pod: its /128 routed to its veth, and a
/// default route via the node's link-local `fe80::1` on that veth (as
/// Calico does: no address of the node needs to be reachable on-link).
pub(crate) fn wire_routed_pod6(
    node_ns: &str,
    pod_ns: &str,
    host_veth: &str,
    ip: Ipv6Addr,
) -> anyhow::Result<()> {
    let (node, pod) = (Some(node_ns), Some(pod_ns));
    netns::ip(
        node,
        &["-6", "addr", "add", "fe80::1/64", "dev", host_veth, "nodad"],
    )?;
    netns::ip(
        node,
        &["-6", "route", "add", &format!("{ip}/128"), "dev", host_veth],
    )?;
    netns::ip(
        pod,
        &[
            "-6",
            "addr",
            "add",
            &format!("{ip}/128"),
            "dev",
            "eth0",
            "nodad",
        ],
    )?;
    netns::ip(
        pod,
        &[
            "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ],
    )
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            cleanup::release(&ns);
        }
    }
}
