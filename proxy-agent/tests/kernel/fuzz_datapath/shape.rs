//! What an input frame is, read independently of the datapath.

use proxy_agent::cli::packet::{self, ETH_HLEN};
use proxy_common::proto;

use super::{family::Fam, world::Tuple};

/// SCTP: the datapath parses its common header and first chunk header. No
/// SCTP service exists in these worlds, so an SCTP packet is either passed
/// on untouched or, to a cluster IP (no port of it serves SCTP), rejected.
pub const SCTP: u8 = 132;
pub const SCTP_L4_NEED: usize = 12 + 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape<A> {
    /// Shorter than an Ethernet header: the kernel refuses to run it.
    Short,
    /// Neither IPv4 nor IPv6.
    NotIp,
    /// The other family, which has no service in this world: never
    /// translated.
    OtherFamily,
    /// The other family, malformed: it may be dropped.
    OtherFamilyMalformed,
    /// This family's ethertype, but no room for its header.
    Truncated,
    /// IPv6 whose header is not version 6, or whose extension headers or
    /// first fragment's identification do not fit.
    BadHeader,
    NotTcpUdp,
    /// IPv6 whose headers the datapath does not walk (more than four
    /// extension headers, authentication or encryption, a fragment header
    /// with its reserved byte set, a later fragment cut off before its
    /// identification) or whose L4 header starts too far in to rewrite.
    Unwalked,
    /// A fragment after the first: no ports to look at.
    LaterFragment,
    /// IPv4 whose IHL is below 5.
    BadIhl,
    /// The ports or the L4 checksum field lie beyond the frame.
    L4Truncated,
    Handleable(Parsed<A>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed<A> {
    pub t: Tuple<A>,
    /// The IP header with its options or extension headers.
    pub l3_len: usize,
    pub l4_off: usize,
    pub csum_off: usize,
    /// Frame offset past the L4 bytes the datapath reads (ports, checksum;
    /// SCTP: the first chunk's header).
    pub l4_end: usize,
    pub tcp_flags: u8,
    pub ttl: u8,
    pub tot_len: usize,
    pub version: u8,
}

impl<A> Shape<A> {
    pub fn of<F: Fam<Addr = A>>(pkt: &[u8]) -> Shape<A> {
        if pkt.len() < ETH_HLEN {
            return Shape::Short;
        }
        let ethertype = [pkt[12], pkt[13]];
        if ethertype == F::ETHERTYPE {
            return F::shape(pkt);
        }
        if ethertype == F::Other::ETHERTYPE {
            return match F::Other::shape(pkt) {
                Shape::Handleable(p) if p.header_unfit::<F::Other>() => Shape::OtherFamilyMalformed,
                s if s.malformed() => Shape::OtherFamilyMalformed,
                _ => Shape::OtherFamily,
            };
        }
        Shape::NotIp
    }

    /// Frames the datapath may drop as malformed instead of passing them on.
    pub fn malformed(&self) -> bool {
        matches!(
            self,
            Shape::Truncated
                | Shape::BadIhl
                | Shape::BadHeader
                | Shape::L4Truncated
                | Shape::OtherFamilyMalformed
        )
    }
}

/// Where the L4 checksum sits and where the bytes the datapath reads end,
/// for L4 at `l4_off`.
pub fn l4_layout(proto: u8, l4_off: usize) -> (usize, usize) {
    // SCTP's checksum is a CRC the datapath never rewrites (no SCTP service
    // exists in these worlds); what it needs is the common header and the
    // first chunk's header.
    match proto {
        proto::TCP => (l4_off + 16, l4_off + 18),
        proto::UDP => (l4_off + 6, l4_off + 8),
        _ => (l4_off + 8, l4_off + SCTP_L4_NEED),
    }
}

impl<A: Copy> Parsed<A> {
    pub fn tuple_at<F: Fam<Addr = A>>(&self, pkt: &[u8]) -> Tuple<A> {
        let ip = &pkt[ETH_HLEN..];
        let l4 = &pkt[self.l4_off..];
        Tuple {
            src: F::addr_at(&ip[F::ADDRS_AT..]),
            dst: F::addr_at(&ip[F::ADDRS_AT + F::ALEN..]),
            sport: u16::from_be_bytes([l4[0], l4[1]]),
            dport: u16::from_be_bytes([l4[2], l4[3]]),
            proto: self.t.proto,
        }
    }

    pub fn ip_valid<F: Fam<Addr = A>>(&self, pkt: &[u8]) -> bool {
        F::header_checksum_ok(pkt).unwrap_or(false)
    }

    /// Whether the L4 checksum covers a well-defined range of the frame.
    pub fn l4_sane(&self, pkt: &[u8]) -> bool {
        self.tot_len >= self.l4_end - ETH_HLEN && ETH_HLEN + self.tot_len <= pkt.len()
    }

    pub fn l4_valid<F: Fam<Addr = A>>(&self, pkt: &[u8]) -> bool {
        let l4 = &pkt[self.l4_off..ETH_HLEN + self.tot_len];
        // IPv4's UDP may go without a checksum; IPv6's must not (RFC 8200 8.1).
        if self.t.proto == proto::UDP && pkt[self.csum_off..self.csum_off + 2] == [0, 0] {
            return F::VERSION == 4;
        }
        let pseudo = F::pseudo_header(&pkt[ETH_HLEN..], self.t.proto, l4.len());
        packet::checksum(&[&pseudo, l4]) == 0
    }

    /// Headers the datapath drops as malformed, as the kernel's input
    /// would: not this family's version, or a total length (0: BIG TCP,
    /// unknown) too short for the IP headers and the L4 ports and checksum.
    pub fn header_unfit<F: Fam<Addr = A>>(&self) -> bool {
        self.version != F::VERSION || (self.tot_len != 0 && self.tot_len < self.l4_end - ETH_HLEN)
    }
}
