//! What differs between the fuzzed address families: the node's addresses
//! and services, and how this family's frames are built, mutated and read.
//! Everything else (the services' rules, the flows, the oracle) is written
//! once, over [`Fam`].

use std::{
    fmt::{Debug, Display},
    hash::Hash,
    net::IpAddr,
};

use proxy_agent::modes::ebpf::NodeFacts;

use super::{
    rng::Rng,
    shape::{Parsed, Shape},
};

pub const EXT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x01];
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
const LOCAL_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x0a];
const LOCAL_B_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x0c];
const LOCAL_POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x0b];

/// The node in one family: one-armed on ext0 (the lan, where the peer node
/// routes the remote pods), this node's pods behind pod0.
pub struct Topology<A: 'static> {
    pub node: A,
    pub peer_node: A,
    /// A client on the lan with a neighbour entry, inside the LB source range.
    pub client: A,
    /// A client on the lan without a neighbour entry (FIB: no neighbour).
    pub stranger: A,
    /// A client no route leads to (FIB: unreachable).
    pub far_client: A,
    pub pod_gw: A,
    pub local_pod: A,
    pub local_a: A,
    pub local_b: A,
    pub remote_a: A,
    pub remote_b: A,
    /// The prefix length of the lan and of the pod network.
    pub prefix: u8,
    pub pod_cidr: &'static str,
    pub remote_pods: &'static str,
    /// An external IP, and LB IPs (one of them of an
    /// externalTrafficPolicy Local service): addresses the node answers
    /// for on some ports only.
    pub external_ip: A,
    pub lb_ip: A,
    pub local_lb_ip: A,
    /// The LB IP's source ranges: the client, and this node's pods.
    pub lb_ranges: &'static [&'static str],
    /// Cluster IPs (see `world::services`).
    pub web_vip: A,
    pub ext_vip: A,
    pub lb_vip: A,
    pub empty_vip: A,
    pub local_vip: A,
    pub elsewhere_vip: A,
}

impl<A: Copy> Topology<A> {
    /// Permanent neighbours: (address, MAC, on the pod side).
    pub fn neighbours(&self) -> [(A, [u8; 6], bool); 5] {
        [
            (self.peer_node, PEER_MAC, false),
            (self.client, CLIENT_MAC, false),
            (self.local_a, LOCAL_A_MAC, true),
            (self.local_b, LOCAL_B_MAC, true),
            (self.local_pod, LOCAL_POD_MAC, true),
        ]
    }

    /// The clients new flows come from, most of the time.
    pub fn clients(&self) -> [A; 8] {
        [
            self.client,
            self.stranger,
            self.far_client,
            self.local_pod,
            self.local_a,
            self.remote_a,
            self.node,
            self.peer_node,
        ]
    }
}

/// Identifications of fragmented datagrams: few, so that later fragments
/// meet the first fragments the run sent before them.
pub const FRAGMENT_IDS: u64 = 8;

/// A fragmented datagram as its fragments name it: (source, destination,
/// identification, protocol).
pub type FragKey<A> = (A, A, u32, u8);

pub trait Fam: 'static + Sized {
    type Addr: Copy + Eq + Ord + Hash + Debug + Display + Into<IpAddr> + 'static;
    /// The family whose frames this world passes on untouched.
    type Other: Fam;
    const NAME: &'static str;
    const ETHERTYPE: [u8; 2];
    const VERSION: u8;
    /// The fixed IP header's length.
    const HLEN: usize;
    /// In the IP header: the L4 protocol (IPv6: the first next header),
    /// the TTL / hop limit, the source address (the destination follows).
    const PROTO_AT: usize;
    const TTL_AT: usize;
    const ADDRS_AT: usize;
    const ALEN: usize;
    /// IPv4's header checksum.
    const HDR_CSUM_AT: Option<usize>;
    /// ICMP's protocol number (ICMPv6's in IPv6).
    const ICMP: u8;
    /// ICMP destination / port unreachable (type, code).
    const PORT_UNREACHABLE: [u8; 2];
    const NET: Topology<Self::Addr>;

    fn addr_at(bytes: &[u8]) -> Self::Addr;
    fn octets(a: Self::Addr) -> Vec<u8>;
    fn random_addr(rng: &mut Rng) -> Self::Addr;

    /// The node's configuration with this family's addresses and pods.
    fn facts(ext: u32, pod: u32) -> NodeFacts;

    /// Randomises what a well-formed frame's IP header may carry (TOS,
    /// identification, flow label, TTL): the datapath must keep it.
    fn dress(rng: &mut Rng, pkt: &mut [u8]);
    /// Headers between the fixed header and L4 (IPv4 options, IPv6
    /// extension headers), and fragments.
    fn add_headers(rng: &mut Rng, pkt: Vec<u8>) -> Vec<u8>;
    /// Header fields that lie (lengths, version, protocol).
    fn lie(rng: &mut Rng, pkt: &mut [u8]);
    /// A checksum made wrong, or UDP's left out.
    fn break_checksum(rng: &mut Rng, pkt: &mut [u8]);
    /// Recomputes the checksums where the frame's lengths let them be.
    fn fix_if_sane(pkt: &mut [u8]);
    /// Where L4 starts, as far as the header says.
    fn l4_at(pkt: &[u8]) -> usize;
    /// An ICMP error from `src` to `dst` quoting (the start of) the IP
    /// packet `quoted`.
    fn icmp_error(rng: &mut Rng, src: Self::Addr, dst: Self::Addr, quoted: &[u8]) -> Vec<u8>;
    /// Random bytes made to read as this family's TCP/UDP, at least far
    /// enough to be parsed.
    fn ip_like(rng: &mut Rng, pkt: &mut [u8]);

    /// A frame of this family's ethertype, read as RFC 791 / 8200 lay it out.
    fn shape(pkt: &[u8]) -> Shape<Self::Addr>;
    /// The IP packet's length as its header says (0: unknown, BIG TCP).
    fn tot_len(ip: &[u8]) -> usize;
    /// The L4 checksum's pseudo-header for `l4_len` bytes of `proto`.
    fn pseudo_header(ip: &[u8], proto: u8, l4_len: usize) -> Vec<u8>;
    /// Whether the IP header's own checksum verifies (IPv6 has none);
    /// `None` when the header does not fit the frame.
    fn header_checksum_ok(pkt: &[u8]) -> Option<bool>;
    /// Why the kernel's IP input would drop this packet, if it would.
    fn kernel_drops(pkt: &[u8], p: &Parsed<Self::Addr>) -> Option<&'static str>;
    /// The identification of a first fragment (more to follow) whose later
    /// fragments the datapath may translate as this one's flow.
    fn first_fragment(pkt: &[u8], p: &Parsed<Self::Addr>) -> Option<u32>;
    /// A later fragment's datagram.
    fn later_fragment(pkt: &[u8]) -> Option<FragKey<Self::Addr>>;
    /// A reply's IP header as the datapath builds it: no options or
    /// extension headers, a valid header checksum.
    fn plain_header(ip: &[u8]) -> bool;
    /// The length of the IP header of a frame the datapath built.
    fn header_len(ip: &[u8]) -> usize;
}
