//! The conntrack tables (plain hashes, swept by [`crate::collector`]).
//!
//! A new flow to a service writes two entries: the original direction keyed by
//! the client's tuple towards the frontend (`Forward`, remembers the backend
//! and any source NAT), and the reply direction keyed by the tuple the
//! backend's replies carry (`Reply`, remembers what to restore). As in the
//! kernel's conntrack, both live in one tuple space: a packet's own tuple
//! finds its entry in one lookup whichever way it goes, and the entry says
//! which half it is ([`flags::REPLY`]). The datapath keeps the two tuples of
//! every live flow apart from any other flow's (a reply tuple that clashes
//! gets a source port of its own, as the kernel's NAT picks a unique tuple).

use crate::family::{Family, V4, V6};

#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CtDirection {
    Forward = 0,
    Reply = 1,
}

#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CtKeyOf<F: Family> {
    pub saddr_be: F::Addr,
    pub daddr_be: F::Addr,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    // Two scalars, not `[u8; 3]`: the datapath's key writes stay stores (an
    // array literal becomes a `memset` call, see proxy-ebpf's `mem`).
    pub _pad: u8,
    pub _pad2: u16,
}

/// An IPv4 flow half (`CONNTRACK`).
pub type CtKey = CtKeyOf<V4>;
/// An IPv6 flow half (`CONNTRACK6`).
pub type CtKey6 = CtKeyOf<V6>;

impl<F: Family> CtKeyOf<F> {
    pub const fn new(
        saddr_be: F::Addr,
        daddr_be: F::Addr,
        sport_be: u16,
        dport_be: u16,
        proto: u8,
    ) -> Self {
        Self {
            saddr_be,
            daddr_be,
            sport_be,
            dport_be,
            proto,
            _pad: 0,
            _pad2: 0,
        }
    }
}

/// Bits of [`CtValue::flags`].
pub mod flags {
    /// The flow is source-NATed (masqueraded).
    pub const SNAT: u16 = 1 << 0;
    /// A TCP FIN or RST was seen: the closing timeout applies.
    pub const CLOSING: u16 = 1 << 1;
    /// A reply was seen: a UDP flow counts as a stream, a TCP one as established.
    pub const SEEN_REPLY: u16 = 1 << 2;
    /// A TCP FIN was seen from the client (towards the service).
    pub const FIN_FORWARD: u16 = 1 << 3;
    /// A TCP FIN was seen from the backend.
    pub const FIN_REPLY: u16 = 1 << 4;
    /// A TCP RST was seen in either direction.
    pub const RST: u16 = 1 << 5;
    /// The TCP connection is over or closing: a new SYN on its tuple starts a new one.
    pub const FINISHED: u16 = CLOSING | FIN_FORWARD | FIN_REPLY | RST;
    /// The entry is a flow's reply half (keyed by the tuple its replies carry).
    pub const REPLY: u16 = 1 << 6;
}

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CtValueOf<F: Family> {
    /// Forward: the translated destination (backend). Reply: the frontend to restore as source.
    pub nat_addr_be: F::Addr,
    pub nat_port_be: u16,
    pub flags: u16,
    pub service_id: u32,
    /// Forward: the chosen backend, re-checked on every packet.
    pub backend_id: u32,
    /// Forward: the masquerade source. Reply: the client to restore as destination.
    /// Both zero without source NAT.
    pub snat_addr_be: F::Addr,
    pub snat_port_be: u16,
    pub _pad: u16,
    /// `bpf_ktime_get_ns()` of the last packet in this direction.
    pub last_seen_ns: u64,
    pub created_ns: u64,
    pub next_hop: NextHop,
}

/// Where the FIB last sent this half's packets (`bpf_fib_lookup`), so that
/// an established packet skips the lookup. The datapath asks the FIB again
/// at most once a second per entry (with the idle timer's refresh), for a
/// packet that arrived elsewhere, and for one longer than any it asked
/// about (the MTU check is the FIB's).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NextHop {
    /// The interface the packets arrived on (the lookup's input).
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    /// The longest packet (IP total length) known to fit; 0: nothing cached.
    pub fits_len: u16,
    /// [`hop_flags`]; 0 in hops cached before they existed (these bytes
    /// were padding), which means a plain redirect.
    pub flags: u16,
}

/// [`NextHop::flags`].
pub mod hop_flags {
    /// The out interface is a veth whose peer is in another namespace
    /// (`config::iface::PEER_IN_OTHER_NETNS` when the FIB was asked): the
    /// TC programs deliver to the peer's ingress.
    pub const PEER: u16 = 1 << 0;
}

const _: () = assert!(core::mem::size_of::<NextHop>() == 24);

impl<F: Family> CtValueOf<F> {
    /// Which half of its flow the entry is.
    pub const fn direction(&self) -> CtDirection {
        if self.flags & flags::REPLY != 0 {
            CtDirection::Reply
        } else {
            CtDirection::Forward
        }
    }
}

pub type CtValue = CtValueOf<V4>;
pub type CtValue6 = CtValueOf<V6>;

/// Idle lifetimes used while the agent has not written [`crate::DatapathConfig`].
/// They follow the kernel's and kube-proxy's defaults.
pub const DEFAULT_TCP_ESTABLISHED_NS: u64 = 24 * 3600 * 1_000_000_000;
pub const DEFAULT_TCP_CLOSING_NS: u64 = 3600 * 1_000_000_000;
pub const DEFAULT_UDP_NS: u64 = 30 * 1_000_000_000;
pub const DEFAULT_UDP_STREAM_NS: u64 = 120 * 1_000_000_000;
/// The kernel's nf_conntrack_tcp_timeout_syn_sent, _time_wait and _close.
pub const DEFAULT_TCP_SYN_SENT_NS: u64 = 120 * 1_000_000_000;
pub const DEFAULT_TCP_TIME_WAIT_NS: u64 = 120 * 1_000_000_000;
pub const DEFAULT_TCP_CLOSE_NS: u64 = 10 * 1_000_000_000;
/// `last_seen_ns` is refreshed at most this often, to keep writes off the hot path.
pub const REFRESH_INTERVAL_NS: u64 = 1_000_000_000;

#[inline(always)]
fn or_default(value: u64, default: u64) -> u64 {
    if value == 0 { default } else { value }
}

/// How long an entry with `entry_flags` may stay idle, from the conntrack
/// settings: the datapath's lookups and both collectors (the agent's, the
/// timer's) decide with it.
#[inline(always)]
pub fn idle_timeout(config: &crate::DatapathConfig, proto: u8, entry_flags: u16) -> u64 {
    use crate::proto;
    // An SCTP association lives as a TCP connection does (its chunks are
    // given to conntrack as TCP flags, see `sctp::conntrack_flags`).
    if proto == proto::TCP || proto == proto::SCTP {
        // The kernel's conntrack states, as far as flags can tell them.
        if entry_flags & flags::RST != 0 {
            or_default(config.tcp_close_ns, DEFAULT_TCP_CLOSE_NS)
        } else if entry_flags & (flags::FIN_FORWARD | flags::FIN_REPLY)
            == flags::FIN_FORWARD | flags::FIN_REPLY
        {
            or_default(config.tcp_time_wait_ns, DEFAULT_TCP_TIME_WAIT_NS)
        } else if entry_flags & flags::CLOSING != 0 {
            or_default(config.tcp_closing_ns, DEFAULT_TCP_CLOSING_NS)
        } else if entry_flags & flags::SEEN_REPLY == 0 {
            or_default(config.tcp_syn_sent_ns, DEFAULT_TCP_SYN_SENT_NS)
        } else {
            or_default(config.tcp_established_ns, DEFAULT_TCP_ESTABLISHED_NS)
        }
    } else if entry_flags & flags::SEEN_REPLY != 0 {
        or_default(config.udp_stream_ns, DEFAULT_UDP_STREAM_NS)
    } else {
        or_default(config.udp_ns, DEFAULT_UDP_NS)
    }
}
