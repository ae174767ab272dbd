//! The IPv6 world: the IPv4 world's node in 2001:db8::/32 (the
//! node on 2001:db8::/64, its pods on 2001:db8:1::/64, the peer node's on
//! 2001:db8:2::/64, service addresses in 2001:db8:19::/64); and how IPv6
//! frames are built, mutated and read (RFC 8200).

use std::net::Ipv6Addr;

use proxy_agent::{
    cli::packet::{self, ETH_HLEN, IPV6_HLEN, Layout},
    modes::ebpf::{NodeFacts, family::AgentFamily},
};
use proxy_common::{DatapathConfig6, V6, config::flags, proto};

use super::{
    family::{FRAGMENT_IDS, Fam, FragKey, Topology},
    rng::Rng,
    shape::{Parsed, SCTP, Shape, l4_layout},
    v4,
    world::Tuple,
};

pub enum Ipv6 {}

const fn at(net: u16, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, net, 0, 0, 0, 0, host)
}

const NODE: Ipv6Addr = at(0, 1);

pub(super) mod ext {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AUTH: u8 = 51;
    pub const DEST_OPTS: u8 = 60;
}
/// Extension headers the datapath walks before giving up (passing the packet).
const MAX_EXT_HEADERS: usize = 4;
/// The furthest L4 may start (a frame offset) for the datapath to translate
/// the packet; past it the packet is passed on untouched.
const MAX_L4_OFF: usize = 1024;

fn payload_len(pkt: &[u8]) -> usize {
    u16::from_be_bytes([pkt[ETH_HLEN + 4], pkt[ETH_HLEN + 5]]) as usize
}

fn set_payload_len(pkt: &mut [u8], len: usize) {
    pkt[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&(len as u16).to_be_bytes());
}

/// Inserts `header` (its first byte to be the next header) in front of
/// what follows the fixed header, and names it there.
pub(super) fn push_header(pkt: &mut Vec<u8>, kind: u8, mut header: Vec<u8>) {
    let at = ETH_HLEN + IPV6_HLEN;
    header[0] = pkt[ETH_HLEN + 6];
    pkt[ETH_HLEN + 6] = kind;
    let len = header.len();
    pkt.splice(at..at, header);
    let payload = payload_len(pkt) + len;
    set_payload_len(pkt, payload);
}

fn fragment_header(rng: &mut Rng, offset_and_more: u16) -> Vec<u8> {
    let mut h = vec![0u8; 8];
    h[2..4].copy_from_slice(&offset_and_more.to_be_bytes());
    h[4..8].copy_from_slice(&(rng.below(FRAGMENT_IDS) as u32).to_be_bytes());
    h
}

/// A hop-by-hop or destination options header of `units` + 1 eight-byte
/// units: PadN options over the whole, or (now and then) garbage.
pub(super) fn options_header(rng: &mut Rng, units: usize) -> Vec<u8> {
    let len = (units + 1) * 8;
    let mut h = if rng.chance(30) {
        rng.bytes(len)
    } else {
        let mut h = vec![0u8; 2];
        while h.len() < len {
            match len - h.len() {
                1 => h.push(0), // Pad1
                left => {
                    let pad = (left - 2).min(255);
                    h.extend([1, pad as u8]);
                    h.extend(std::iter::repeat_n(0, pad));
                }
            }
        }
        h
    };
    h[1] = units as u8;
    h
}

/// Whether `fix_checksums` / `checksums_valid` can read this frame's lengths.
fn lengths_sane(pkt: &[u8]) -> bool {
    if pkt.len() < ETH_HLEN + IPV6_HLEN || pkt[12..14] != [0x86, 0xdd] {
        return false;
    }
    let Some(layout) = Layout::of(pkt) else {
        return false;
    };
    let need = match layout.proto {
        proto::TCP => 18,
        proto::UDP => 8,
        _ => return false,
    };
    let end = ETH_HLEN + IPV6_HLEN + payload_len(pkt);
    layout.l4 + need <= end && end <= pkt.len()
}

impl Fam for Ipv6 {
    type Addr = Ipv6Addr;
    type Other = v4::Ipv4;
    const NAME: &'static str = "IPv6";
    const ETHERTYPE: [u8; 2] = [0x86, 0xdd];
    const VERSION: u8 = 6;
    const HLEN: usize = IPV6_HLEN;
    const PROTO_AT: usize = 6;
    const TTL_AT: usize = 7;
    const ADDRS_AT: usize = 8;
    const ALEN: usize = 16;
    const HDR_CSUM_AT: Option<usize> = None;
    const ICMP: u8 = proto::ICMPV6;
    const PORT_UNREACHABLE: [u8; 2] = [1, 4];
    const NET: Topology<Ipv6Addr> = Topology {
        node: NODE,
        peer_node: at(0, 2),
        client: at(0, 0x64),
        stranger: at(0, 0x65),
        far_client: at(9, 9),
        pod_gw: at(1, 1),
        local_pod: at(1, 0x11),
        local_a: at(1, 0x10),
        local_b: at(1, 0x12),
        remote_a: at(2, 0x10),
        remote_b: at(2, 0x11),
        prefix: 64,
        pod_cidr: "2001:db8:1::/64",
        remote_pods: "2001:db8:2::/64",
        external_ip: at(3, 0x31),
        lb_ip: at(3, 0x21),
        local_lb_ip: at(3, 0x22),
        lb_ranges: &["2001:db8::64/128", "2001:db8:1::/64"],
        web_vip: at(0x19, 0x10),
        ext_vip: at(0x19, 0x11),
        lb_vip: at(0x19, 0x12),
        empty_vip: at(0x19, 0x13),
        local_vip: at(0x19, 0x14),
        elsewhere_vip: at(0x19, 0x15),
    };

    fn addr_at(b: &[u8]) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap())
    }

    fn octets(a: Ipv6Addr) -> Vec<u8> {
        a.octets().to_vec()
    }

    fn random_addr(rng: &mut Rng) -> Ipv6Addr {
        if rng.chance(70) {
            let net = *rng.pick(&[0, 1, 2, 3, 9, 0x19]);
            at(net, rng.below(0x100) as u16)
        } else {
            Ipv6Addr::from(u128::from(rng.next()) << 64 | u128::from(rng.next()))
        }
    }

    fn facts(ext: u32, pod: u32) -> NodeFacts {
        let mut facts = v4::interfaces(ext, pod);
        facts.config = v4::datapath_config(flags::DETECT_LOCAL_BY_CIDR6);
        facts.config6 = DatapathConfig6 {
            masquerade_addr_be: V6::to_be(NODE),
        };
        facts.local_pod_cidrs = [Self::NET.pod_cidr.parse().unwrap()].into();
        facts.addresses6.primary = Some(NODE);
        facts.addresses6.node_ports = vec![NODE];
        facts
    }

    fn dress(rng: &mut Rng, pkt: &mut [u8]) {
        let ip = ETH_HLEN;
        if rng.chance(10) {
            let class = rng.next() as u8;
            pkt[ip] = 0x60 | class >> 4;
            pkt[ip + 1] = class << 4;
        }
        let flow = rng.next() as u32 & 0xf_ffff;
        pkt[ip + 1] = (pkt[ip + 1] & 0xf0) | (flow >> 16) as u8;
        pkt[ip + 2..ip + 4].copy_from_slice(&(flow as u16).to_be_bytes());
        pkt[ip + 7] = if rng.chance(90) { 64 } else { rng.next() as u8 };
    }

    fn add_headers(rng: &mut Rng, mut pkt: Vec<u8>) -> Vec<u8> {
        // A fragment header: a first fragment, a later one, or an atomic
        // one (offset 0, no more); right before L4, or before destination
        // options in the fragmentable part.
        if rng.chance(12) {
            if rng.chance(15) {
                push_header(&mut pkt, ext::DEST_OPTS, options_header(rng, 0));
            }
            let offset = (rng.range(1, 0x1fff) as u16) << 3;
            let offset_and_more = match rng.below(4) {
                0 => 1,
                1 => offset,
                2 => offset | 1,
                _ => 0,
            };
            let header = fragment_header(rng, offset_and_more);
            push_header(&mut pkt, ext::FRAGMENT, header);
        }
        // Extension headers in front: padding options (or garbage), a
        // routing header, an atomic fragment, sometimes more than the
        // datapath walks, or an authentication header it must not walk.
        if rng.chance(20) {
            let count = match rng.below(10) {
                0..7 => 1,
                7..9 => rng.range(2, 4),
                _ => rng.range(5, 6),
            };
            for _ in 0..count {
                let kind = *rng.pick(&[
                    ext::HOP_BY_HOP,
                    ext::DEST_OPTS,
                    ext::DEST_OPTS,
                    ext::ROUTING,
                    ext::FRAGMENT,
                    ext::AUTH,
                ]);
                let header = match kind {
                    ext::FRAGMENT => fragment_header(rng, 0),
                    ext::AUTH => {
                        // Payload length in 4-octet units, minus 2: 16 bytes.
                        let mut h = rng.bytes(16);
                        h[1] = 2;
                        h
                    }
                    ext::ROUTING => {
                        // Type 0, no segments left: skipped by a receiver.
                        let mut h = vec![0u8; 8];
                        if rng.chance(30) {
                            rng.fill(&mut h[2..]);
                        }
                        h
                    }
                    _ => {
                        // Now and then past what the datapath rewrites
                        // behind (1 KiB of headers).
                        let units = if rng.chance(3) {
                            rng.range(100, 140)
                        } else {
                            rng.below(3)
                        };
                        options_header(rng, units as usize)
                    }
                };
                push_header(&mut pkt, kind, header);
            }
        }
        pkt
    }

    fn lie(rng: &mut Rng, pkt: &mut [u8]) {
        let ip = ETH_HLEN;
        match rng.below(5) {
            0 => {
                let len = rng.next() as usize & 0xffff;
                set_payload_len(pkt, len);
            }
            1 => {
                let real = (pkt.len() - ETH_HLEN - IPV6_HLEN) as i64;
                let len = (real + rng.range(0, 80) as i64 - 40).clamp(0, 0xffff);
                set_payload_len(pkt, len as usize);
            }
            2 => pkt[ip] = (rng.below(16) as u8) << 4 | (pkt[ip] & 0x0f),
            3 => pkt[ip + 6] = rng.next() as u8,
            _ => {
                // The first extension header's length, if there is one.
                let walked = [ext::HOP_BY_HOP, ext::ROUTING, ext::FRAGMENT, ext::DEST_OPTS];
                if walked.contains(&pkt[ip + 6]) && pkt.len() > ip + IPV6_HLEN + 1 {
                    pkt[ip + IPV6_HLEN + 1] = rng.next() as u8;
                } else {
                    set_payload_len(pkt, rng.next() as usize & 0xffff);
                }
            }
        }
        if rng.chance(50) {
            Self::fix_if_sane(pkt);
        }
    }

    fn break_checksum(rng: &mut Rng, pkt: &mut [u8]) {
        if !lengths_sane(pkt) {
            return;
        }
        let off = packet::l4_checksum_offset(pkt);
        let udp = Layout::of(pkt).is_some_and(|l| l.proto == proto::UDP);
        if udp && rng.chance(30) {
            pkt[off..off + 2].fill(0);
        } else {
            pkt[off + rng.below(2) as usize] ^= 1 << rng.below(8);
        }
    }

    fn fix_if_sane(pkt: &mut [u8]) {
        if lengths_sane(pkt) {
            packet::fix_checksums(pkt);
        }
    }

    fn l4_at(pkt: &[u8]) -> usize {
        Layout::of(pkt).map_or(ETH_HLEN + IPV6_HLEN, |l| l.l4)
    }

    fn icmp_error(rng: &mut Rng, src: Ipv6Addr, dst: Ipv6Addr, quoted: &[u8]) -> Vec<u8> {
        let quote_len = (IPV6_HLEN + 8 + rng.below(3) as usize * 20).min(quoted.len());
        let (icmp_type, code) = match rng.below(10) {
            0..5 => (1, rng.below(8) as u8),
            5..7 => (3, rng.below(2) as u8),
            7 => (2, 0),
            8 => (4, rng.below(3) as u8),
            _ => (rng.next() as u8, rng.next() as u8),
        };
        let icmp_len = 8 + quote_len;
        let mut pkt = vec![0u8; ETH_HLEN + IPV6_HLEN + icmp_len];
        pkt[12..14].copy_from_slice(&Self::ETHERTYPE);
        let ip = ETH_HLEN;
        pkt[ip] = 0x60;
        set_payload_len(&mut pkt, icmp_len);
        pkt[ip + 6] = proto::ICMPV6;
        pkt[ip + 7] = 64;
        pkt[ip + 8..ip + 24].copy_from_slice(&src.octets());
        pkt[ip + 24..ip + 40].copy_from_slice(&dst.octets());
        let icmp = ip + IPV6_HLEN;
        pkt[icmp] = icmp_type;
        pkt[icmp + 1] = code;
        if icmp_type == 2 {
            pkt[icmp + 4..icmp + 8].copy_from_slice(&1280u32.to_be_bytes()); // MTU
        }
        pkt[icmp + 8..].copy_from_slice(&quoted[..quote_len]);
        packet::fix_checksums(&mut pkt);
        pkt
    }

    fn ip_like(rng: &mut Rng, pkt: &mut [u8]) {
        let len = pkt.len();
        pkt[12..14].copy_from_slice(&Self::ETHERTYPE);
        if len > ETH_HLEN {
            pkt[ETH_HLEN] = 0x60 | (pkt[ETH_HLEN] & 0x0f);
        }
        if len > ETH_HLEN + 6 {
            pkt[ETH_HLEN + 6] = *rng.pick(&[proto::TCP, proto::UDP]);
        }
        if len >= ETH_HLEN + IPV6_HLEN && rng.chance(70) {
            set_payload_len(pkt, len - ETH_HLEN - IPV6_HLEN);
        }
    }

    fn shape(pkt: &[u8]) -> Shape<Ipv6Addr> {
        if pkt.len() < ETH_HLEN + IPV6_HLEN {
            return Shape::Truncated;
        }
        let ip = &pkt[ETH_HLEN..];
        if ip[0] >> 4 != 6 {
            return Shape::BadHeader;
        }
        let mut next = ip[6];
        let mut off = ETH_HLEN + IPV6_HLEN;
        let mut walked = 0;
        while next != proto::TCP && next != proto::UDP && next != SCTP {
            match next {
                ext::HOP_BY_HOP | ext::ROUTING | ext::FRAGMENT | ext::DEST_OPTS => {}
                ext::AUTH | 50 => return Shape::Unwalked,
                _ => return Shape::NotTcpUdp,
            }
            if walked == MAX_EXT_HEADERS {
                return Shape::Unwalked;
            }
            let Some(hdr) = pkt.get(off..off + 4) else {
                return Shape::BadHeader;
            };
            if next == ext::FRAGMENT {
                let later = u16::from_be_bytes([hdr[2], hdr[3]]) & 0xfff8 != 0;
                let more = hdr[3] & 1 != 0;
                if (later || more) && off + 8 > pkt.len() {
                    return if later {
                        Shape::Unwalked
                    } else {
                        Shape::BadHeader
                    };
                }
                if later {
                    return Shape::LaterFragment;
                }
                if hdr[1] != 0 {
                    return Shape::Unwalked;
                }
            }
            next = hdr[0];
            off += (hdr[1] as usize + 1) * 8;
            walked += 1;
        }
        if off > MAX_L4_OFF {
            return Shape::Unwalked;
        }
        let (csum_off, l4_end) = l4_layout(next, off);
        if pkt.len() < l4_end {
            return Shape::L4Truncated;
        }
        let l4 = &pkt[off..];
        Shape::Handleable(Parsed {
            t: Tuple {
                src: Self::addr_at(&ip[8..]),
                dst: Self::addr_at(&ip[24..]),
                sport: u16::from_be_bytes([l4[0], l4[1]]),
                dport: u16::from_be_bytes([l4[2], l4[3]]),
                proto: next,
            },
            l3_len: off - ETH_HLEN,
            l4_off: off,
            csum_off,
            l4_end,
            tcp_flags: if next == proto::TCP { l4[13] } else { 0 },
            ttl: ip[7],
            tot_len: Self::tot_len(ip),
            version: 6,
        })
    }

    fn tot_len(ip: &[u8]) -> usize {
        match u16::from_be_bytes([ip[4], ip[5]]) as usize {
            0 => 0,
            payload => payload + IPV6_HLEN,
        }
    }

    fn pseudo_header(ip: &[u8], proto: u8, l4_len: usize) -> Vec<u8> {
        let mut pseudo = vec![0u8; 40];
        pseudo[0..32].copy_from_slice(&ip[8..40]);
        pseudo[32..36].copy_from_slice(&(l4_len as u32).to_be_bytes());
        pseudo[39] = proto;
        pseudo
    }

    fn header_checksum_ok(pkt: &[u8]) -> Option<bool> {
        (pkt.len() >= ETH_HLEN + IPV6_HLEN).then_some(true)
    }

    fn kernel_drops(pkt: &[u8], p: &Parsed<Ipv6Addr>) -> Option<&'static str> {
        (ETH_HLEN + p.tot_len > pkt.len()).then_some("payload length")
    }

    fn first_fragment(pkt: &[u8], p: &Parsed<Ipv6Addr>) -> Option<u32> {
        // The header right before L4, when it is a fragment header.
        let mut next = pkt[ETH_HLEN + 6];
        let mut off = ETH_HLEN + IPV6_HLEN;
        let mut last = None;
        while off < p.l4_off {
            last = (next == ext::FRAGMENT).then_some(off);
            next = pkt[off];
            off += (pkt[off + 1] as usize + 1) * 8;
        }
        let at = last?;
        let h = &pkt[at..at + 8];
        (h[3] & 1 != 0).then(|| u32::from_be_bytes([h[4], h[5], h[6], h[7]]))
    }

    fn later_fragment(pkt: &[u8]) -> Option<FragKey<Ipv6Addr>> {
        let ip = pkt.get(ETH_HLEN..ETH_HLEN + IPV6_HLEN)?;
        let mut next = ip[6];
        let mut off = ETH_HLEN + IPV6_HLEN;
        for _ in 0..MAX_EXT_HEADERS {
            let h = pkt.get(off..off + 8)?;
            // The first fragment header with an offset; the datapath walks
            // past atomic ones.
            if next == ext::FRAGMENT && u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0 {
                let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                return Some((Self::addr_at(&ip[8..]), Self::addr_at(&ip[24..]), id, h[0]));
            }
            next = h[0];
            off += (h[1] as usize + 1) * 8;
        }
        None
    }

    fn plain_header(ip: &[u8]) -> bool {
        ip[0] >> 4 == 6
    }

    fn header_len(_: &[u8]) -> usize {
        IPV6_HLEN
    }
}
