//! Node-wide settings the agent hands the datapath (`CONFIG`, a one-entry array),
//! the interface table (`IFACES`) and the LPM-trie key data.

use crate::family::{Family, V4, V6};

/// Bits of [`DatapathConfig::flags`].
pub mod flags {
    /// `masqueradeAll`: masquerade all traffic to cluster IPs.
    pub const MASQUERADE_ALL: u32 = 1 << 0;
    /// Local IPv4 pod traffic is recognised by source address
    /// (`LOCAL_POD_CIDRS`): detectLocalMode ClusterCIDR or NodeCIDR.
    pub const DETECT_LOCAL_BY_CIDR: u32 = 1 << 1;
    /// The same for IPv6 (`LOCAL_POD_CIDRS6`). Each family's detector is
    /// its own, as upstream's per-family proxiers have: a dual-stack
    /// cluster may give a CIDR for one family only.
    pub const DETECT_LOCAL_BY_CIDR6: u32 = 1 << 5;
    /// Local pod traffic is recognised by the interface it arrives on
    /// (`IFACES`): detectLocalMode BridgeInterface or InterfaceNamePrefix.
    pub const DETECT_LOCAL_BY_INTERFACE: u32 = 1 << 2;
    /// The socket hooks balance sockets of the host's network namespace
    /// ([`super::DatapathConfig::host_netns_cookie`]).
    pub const SOCKET_LB_HOST: u32 = 1 << 3;
    /// The socket hooks balance sockets of every other namespace (pods) too.
    pub const SOCKET_LB_PODS: u32 = 1 << 4;
    /// `SERVICE_CIDRS*` hold the cluster's service CIDRs: only then do
    /// packets no service claims pay for their lookup.
    pub const SERVICE_CIDRS: u32 = 1 << 6;
    /// The node's IPv4 routing depends on a packet's destination and input
    /// interface alone: new flows may take the next hop cached for their
    /// destination (`HOPS`).
    pub const ROUTES_BY_DESTINATION: u32 = 1 << 7;
    /// The same for IPv6 (`HOPS6`).
    pub const ROUTES_BY_DESTINATION6: u32 = 1 << 8;
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Idle timeouts; 0 means the built-in default of [`crate::conntrack`].
    pub tcp_established_ns: u64,
    /// A FIN seen in one direction (the kernel's CLOSE_WAIT, `tcpCloseWaitTimeout`).
    pub tcp_closing_ns: u64,
    pub udp_ns: u64,
    pub udp_stream_ns: u64,
    /// No reply seen yet (the kernel's SYN_SENT).
    pub tcp_syn_sent_ns: u64,
    /// A FIN seen in both directions (the kernel's TIME_WAIT).
    pub tcp_time_wait_ns: u64,
    /// A RST seen (the kernel's CLOSE).
    pub tcp_close_ns: u64,
    /// The node address masqueraded traffic leaves with; 0 disables masquerading.
    pub masquerade_addr_be: u32,
    pub flags: u32,
    /// Inclusive source-port range for masqueraded flows (host byte order).
    pub snat_port_min: u16,
    pub snat_port_max: u16,
    /// A second such range; 0-0: none. Was padding before (agents that
    /// wrote it zeroed it), so the layout and its size are unchanged.
    pub snat_port_min2: u16,
    pub snat_port_max2: u16,
    /// The network namespace cookie (SO_NETNS_COOKIE) of the node's own
    /// namespace, the one the agent runs in; 0 when unknown.
    pub host_netns_cookie: u64,
}

/// What IPv6 needs beside [`DatapathConfig`] (`CONFIG6`, a one-entry
/// array): that one keeps the family-neutral settings and the IPv4 facts.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig6 {
    /// The node's primary IPv6, which masqueraded IPv6 traffic leaves with;
    /// all zero disables masquerading in IPv6.
    pub masquerade_addr_be: [u32; 4],
}

/// Bits of [`IfaceInfo::flags`].
pub mod iface {
    /// Traffic arriving here comes from this node's pods (interface-based detectLocalMode).
    pub const LOCAL_POD: u32 = 1 << 0;
    /// An external (node) interface.
    pub const EXTERNAL: u32 = 1 << 1;
    /// A veth or netkit device whose peer is in another network namespace:
    /// the TC programs hand a packet routed out of it straight to the
    /// peer's ingress (`bpf_redirect_peer`), skipping the device's transmit
    /// and the backlog queue. Programs that predate the flag ignore it.
    pub const PEER_IN_OTHER_NETNS: u32 = 1 << 2;
}

/// Value of `IFACES`, keyed by ifindex.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct IfaceInfo {
    pub flags: u32,
}

/// LPM-trie data of `LOCAL_POD_CIDRS` (prefix length 0..=32).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixOf<F: Family> {
    pub addr_be: F::Addr,
}

/// An IPv4 prefix's address (`LOCAL_POD_CIDRS`).
pub type Ipv4Prefix = PrefixOf<V4>;
/// An IPv6 one (`LOCAL_POD_CIDRS6`).
pub type Ipv6Prefix = PrefixOf<V6>;

/// LPM-trie data of `SOURCE_RANGES`: the service id (big-endian, so it is
/// matched first and exactly) followed by the allowed source prefix; the
/// trie prefix length is `32 + cidr length`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceRangeOf<F: Family> {
    pub service_be: u32,
    pub addr_be: F::Addr,
}

/// A service's allowed IPv4 source range (`SOURCE_RANGES`).
pub type SourceRange = SourceRangeOf<V4>;
/// An IPv6 one (`SOURCE_RANGES6`).
pub type SourceRange6 = SourceRangeOf<V6>;
