//! The IPv4 world: the node on 198.18.0.0/24, its pods on 198.18.1.0/24,
//! the peer node's on 198.18.2.0/24, service addresses in 198.19.0.0/24;
//! and how IPv4 frames are built, mutated and read.

use std::net::Ipv4Addr;

use proxy_agent::{
    cli::packet::{self, ETH_HLEN, IPV4_HLEN},
    modes::ebpf::{
        NodeFacts,
        node::{NodeAddresses, SNAT_PORT_MAX, SNAT_PORT_MIN},
    },
};
use proxy_common::{
    DatapathConfig, IfaceInfo,
    config::{flags, iface},
    proto,
};

use super::{
    family::{FRAGMENT_IDS, Fam, FragKey, Topology},
    fixture::HOUR_NS,
    rng::Rng,
    shape::{Parsed, SCTP, Shape, l4_layout},
    world::Tuple,
};

pub enum Ipv4 {}

pub const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
pub const LOCAL_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
pub const REMOTE_A: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 13);
pub const LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 14);
pub const LOCAL_LB_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 22);

/// The datapath's configuration in both worlds: flows never expire during
/// a run (the oracle's model keeps them all), masquerade ports from the
/// agent's range.
pub fn datapath_config(detect_local: u32) -> DatapathConfig {
    DatapathConfig {
        tcp_established_ns: HOUR_NS,
        tcp_closing_ns: HOUR_NS,
        udp_ns: HOUR_NS,
        udp_stream_ns: HOUR_NS,
        tcp_syn_sent_ns: HOUR_NS,
        tcp_time_wait_ns: HOUR_NS,
        tcp_close_ns: HOUR_NS,
        masquerade_addr_be: u32::from(NODE).to_be(),
        flags: detect_local,
        snat_port_min: SNAT_PORT_MIN,
        snat_port_max: SNAT_PORT_MAX,
        snat_port_min2: 0,
        snat_port_max2: 0,
        host_netns_cookie: 0,
    }
}

/// The node's interfaces in both worlds: ext0 external, pod0 to its pods.
pub fn interfaces(ext: u32, pod: u32) -> NodeFacts {
    NodeFacts {
        config: datapath_config(0),
        config6: Default::default(),
        local_pod_cidrs: Default::default(),
        service_cidrs: Default::default(),
        ifaces: [
            (
                ext,
                IfaceInfo {
                    flags: iface::EXTERNAL,
                },
            ),
            (
                pod,
                IfaceInfo {
                    flags: iface::LOCAL_POD,
                },
            ),
        ]
        .into(),
        addresses: NodeAddresses {
            primary: None,
            node_ports: vec![],
            localhost_node_ports: false,
            host: Default::default(),
        },
        addresses6: Default::default(),
        external_interfaces: [("ext0".to_string(), ext)].into(),
    }
}

/// Whether `fix_checksums` / `checksums_valid` can read this frame's lengths.
fn lengths_sane(pkt: &[u8]) -> bool {
    if pkt.len() < ETH_HLEN + IPV4_HLEN || pkt[12..14] != [0x08, 0x00] {
        return false;
    }
    let ip = &pkt[ETH_HLEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let csum_end = ihl + if ip[9] == proto::TCP { 18 } else { 8 };
    (ip[9] == proto::TCP || ip[9] == proto::UDP)
        && ihl >= IPV4_HLEN
        && tot >= csum_end
        && ETH_HLEN + tot <= pkt.len()
}

impl Fam for Ipv4 {
    type Addr = Ipv4Addr;
    type Other = super::v6::Ipv6;
    const NAME: &'static str = "IPv4";
    const ETHERTYPE: [u8; 2] = [0x08, 0x00];
    const VERSION: u8 = 4;
    const HLEN: usize = IPV4_HLEN;
    const PROTO_AT: usize = 9;
    const TTL_AT: usize = 8;
    const ADDRS_AT: usize = 12;
    const ALEN: usize = 4;
    const HDR_CSUM_AT: Option<usize> = Some(10);
    const ICMP: u8 = proto::ICMP;
    const PORT_UNREACHABLE: [u8; 2] = [3, 3];
    const NET: Topology<Ipv4Addr> = Topology {
        node: NODE,
        peer_node: Ipv4Addr::new(198, 18, 0, 2),
        client: Ipv4Addr::new(198, 18, 0, 100),
        stranger: Ipv4Addr::new(198, 18, 0, 101),
        far_client: Ipv4Addr::new(198, 18, 9, 9),
        pod_gw: Ipv4Addr::new(198, 18, 1, 1),
        local_pod: LOCAL_POD,
        local_a: LOCAL_A,
        local_b: Ipv4Addr::new(198, 18, 1, 12),
        remote_a: REMOTE_A,
        remote_b: Ipv4Addr::new(198, 18, 2, 11),
        prefix: 24,
        pod_cidr: "198.18.1.0/24",
        remote_pods: "198.18.2.0/24",
        external_ip: Ipv4Addr::new(198, 18, 3, 31),
        lb_ip: Ipv4Addr::new(198, 18, 3, 21),
        local_lb_ip: LOCAL_LB_IP,
        lb_ranges: &["198.18.0.100/32", "198.18.1.0/24"],
        web_vip: Ipv4Addr::new(198, 19, 0, 10),
        ext_vip: Ipv4Addr::new(198, 19, 0, 11),
        lb_vip: Ipv4Addr::new(198, 19, 0, 12),
        empty_vip: EMPTY_VIP,
        local_vip: LOCAL_VIP,
        elsewhere_vip: Ipv4Addr::new(198, 19, 0, 15),
    };

    fn addr_at(b: &[u8]) -> Ipv4Addr {
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    fn octets(a: Ipv4Addr) -> Vec<u8> {
        a.octets().to_vec()
    }

    fn random_addr(rng: &mut Rng) -> Ipv4Addr {
        if rng.chance(70) {
            Ipv4Addr::from(0xc612_0000 | (rng.below(0x2_0000) as u32))
        } else {
            Ipv4Addr::from(rng.next() as u32)
        }
    }

    fn facts(ext: u32, pod: u32) -> NodeFacts {
        let mut facts = interfaces(ext, pod);
        facts.config = datapath_config(flags::DETECT_LOCAL_BY_CIDR);
        facts.local_pod_cidrs = [Self::NET.pod_cidr.parse().unwrap()].into();
        facts.addresses.primary = Some(NODE);
        facts.addresses.node_ports = vec![NODE];
        facts
    }

    fn dress(rng: &mut Rng, pkt: &mut [u8]) {
        let ip = ETH_HLEN;
        pkt[ip + 1] = if rng.chance(10) { rng.next() as u8 } else { 0 };
        rng.fill(&mut pkt[ip + 4..ip + 6]);
        if rng.chance(30) {
            pkt[ip + 6] = 0; // DF off
        }
        pkt[ip + 8] = if rng.chance(90) { 64 } else { rng.next() as u8 };
    }

    fn add_headers(rng: &mut Rng, mut pkt: Vec<u8>) -> Vec<u8> {
        let ip = ETH_HLEN;
        // IP options: IHL > 5, the L4 header moved along.
        if rng.chance(20) {
            let words = rng.range(1, 10) as usize;
            let mut options = vec![1u8; words * 4]; // NOPs
            if rng.chance(50) {
                rng.fill(&mut options);
            }
            let at = ip + IPV4_HLEN;
            pkt.splice(at..at, options);
            pkt[ip] = (pkt[ip] & 0xf0) | (5 + words) as u8;
            let tot = u16::from_be_bytes([pkt[ip + 2], pkt[ip + 3]]) + (words * 4) as u16;
            pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
        }
        // Fragments: more fragments, a non-zero offset, or both.
        if rng.chance(12) {
            let off: u16 = match rng.below(3) {
                0 => 0x2000,
                1 => rng.range(1, 0x1fff) as u16,
                _ => 0x2000 | rng.range(1, 0x1fff) as u16,
            };
            pkt[ip + 6..ip + 8].copy_from_slice(&off.to_be_bytes());
            let id = rng.below(FRAGMENT_IDS) as u16;
            pkt[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
        }
        pkt
    }

    fn lie(rng: &mut Rng, pkt: &mut [u8]) {
        let ip = ETH_HLEN;
        match rng.below(5) {
            0 => {
                let tot = rng.next() as u16;
                pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
            }
            1 => {
                let real = (pkt.len() - ETH_HLEN) as i64;
                let tot = (real + rng.range(0, 80) as i64 - 40).clamp(0, 0xffff) as u16;
                pkt[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
            }
            2 => pkt[ip] = (pkt[ip] & 0xf0) | rng.below(16) as u8,
            3 => pkt[ip] = (rng.below(16) as u8) << 4 | (pkt[ip] & 0x0f),
            _ => pkt[ip + 9] = rng.next() as u8,
        }
        if rng.chance(50) {
            // Consistent checksums over the lie, where they can be computed.
            Self::fix_if_sane(pkt);
            let ihl = (pkt[ip] & 0x0f) as usize * 4;
            if ihl >= IPV4_HLEN && ip + ihl <= pkt.len() {
                pkt[ip + 10..ip + 12].fill(0);
                let sum = packet::checksum(&[&pkt[ip..ip + ihl]]);
                pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
            }
        }
    }

    fn break_checksum(rng: &mut Rng, pkt: &mut [u8]) {
        let ip = ETH_HLEN;
        match rng.below(3) {
            0 => pkt[ip + 10] ^= 1 << rng.below(8),
            1 if lengths_sane(pkt) => {
                let off = packet::l4_checksum_offset(pkt);
                pkt[off + rng.below(2) as usize] ^= 1 << rng.below(8);
            }
            _ if lengths_sane(pkt) && pkt[ip + 9] == proto::UDP => {
                let off = packet::l4_checksum_offset(pkt);
                pkt[off..off + 2].fill(0);
            }
            _ => {}
        }
    }

    fn fix_if_sane(pkt: &mut [u8]) {
        if lengths_sane(pkt) {
            packet::fix_checksums(pkt);
        }
    }

    fn l4_at(pkt: &[u8]) -> usize {
        ETH_HLEN + ((pkt[ETH_HLEN] & 0x0f) as usize * 4).max(IPV4_HLEN)
    }

    fn icmp_error(rng: &mut Rng, src: Ipv4Addr, dst: Ipv4Addr, quoted: &[u8]) -> Vec<u8> {
        let quote_len = (IPV4_HLEN + 8 + rng.below(3) as usize * 20).min(quoted.len());
        let (icmp_type, code) = match rng.below(10) {
            0..6 => (3, rng.below(16) as u8),
            6..9 => (11, rng.below(2) as u8),
            _ => (rng.next() as u8, rng.next() as u8),
        };
        let icmp_len = 8 + quote_len;
        let mut pkt = vec![0u8; ETH_HLEN + IPV4_HLEN + icmp_len];
        pkt[12..14].copy_from_slice(&Self::ETHERTYPE);
        let ip = ETH_HLEN;
        pkt[ip] = 0x45;
        pkt[ip + 1] = 0xc0;
        pkt[ip + 2..ip + 4].copy_from_slice(&((IPV4_HLEN + icmp_len) as u16).to_be_bytes());
        pkt[ip + 8] = 64;
        pkt[ip + 9] = proto::ICMP;
        pkt[ip + 12..ip + 16].copy_from_slice(&src.octets());
        pkt[ip + 16..ip + 20].copy_from_slice(&dst.octets());
        let sum = packet::checksum(&[&pkt[ip..ip + IPV4_HLEN]]);
        pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        let icmp = ip + IPV4_HLEN;
        pkt[icmp] = icmp_type;
        pkt[icmp + 1] = code;
        if icmp_type == 3 && code == 4 {
            pkt[icmp + 6..icmp + 8].copy_from_slice(&1400u16.to_be_bytes()); // next-hop MTU
        }
        pkt[icmp + 8..].copy_from_slice(&quoted[..quote_len]);
        let sum = packet::checksum(&[&pkt[icmp..]]);
        pkt[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
        pkt
    }

    fn ip_like(rng: &mut Rng, pkt: &mut [u8]) {
        let len = pkt.len();
        pkt[12..14].copy_from_slice(&Self::ETHERTYPE);
        if len > ETH_HLEN {
            pkt[ETH_HLEN] = 0x40 | (pkt[ETH_HLEN] & 0x0f);
        }
        if len > ETH_HLEN + 9 {
            pkt[ETH_HLEN + 9] = *rng.pick(&[proto::TCP, proto::UDP]);
        }
        if len > ETH_HLEN + 7 && rng.chance(70) {
            pkt[ETH_HLEN + 6] &= 0xe0; // first fragment
            pkt[ETH_HLEN + 7] = 0;
        }
    }

    fn shape(pkt: &[u8]) -> Shape<Ipv4Addr> {
        if pkt.len() < ETH_HLEN + IPV4_HLEN {
            return Shape::Truncated;
        }
        let ip = &pkt[ETH_HLEN..];
        let proto = ip[9];
        if proto != proto::TCP && proto != proto::UDP && proto != SCTP {
            return Shape::NotTcpUdp;
        }
        if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
            return Shape::LaterFragment;
        }
        let ihl = (ip[0] & 0x0f) as usize * 4;
        if ihl < IPV4_HLEN {
            return Shape::BadIhl;
        }
        let l4_off = ETH_HLEN + ihl;
        let (csum_off, l4_end) = l4_layout(proto, l4_off);
        if pkt.len() < l4_end {
            return Shape::L4Truncated;
        }
        let l4 = &pkt[l4_off..];
        Shape::Handleable(Parsed {
            t: Tuple {
                src: Self::addr_at(&ip[12..]),
                dst: Self::addr_at(&ip[16..]),
                sport: u16::from_be_bytes([l4[0], l4[1]]),
                dport: u16::from_be_bytes([l4[2], l4[3]]),
                proto,
            },
            l3_len: ihl,
            l4_off,
            csum_off,
            l4_end,
            tcp_flags: if proto == proto::TCP { l4[13] } else { 0 },
            ttl: ip[8],
            tot_len: Self::tot_len(ip),
            version: ip[0] >> 4,
        })
    }

    fn tot_len(ip: &[u8]) -> usize {
        u16::from_be_bytes([ip[2], ip[3]]) as usize
    }

    fn pseudo_header(ip: &[u8], proto: u8, l4_len: usize) -> Vec<u8> {
        let mut pseudo = vec![0u8; 12];
        pseudo[0..8].copy_from_slice(&ip[12..20]);
        pseudo[9] = proto;
        pseudo[10..12].copy_from_slice(&(l4_len as u16).to_be_bytes());
        pseudo
    }

    fn header_checksum_ok(pkt: &[u8]) -> Option<bool> {
        let ihl = (*pkt.get(ETH_HLEN)? & 0x0f) as usize * 4;
        if ihl < IPV4_HLEN || ETH_HLEN + ihl > pkt.len() {
            return None;
        }
        Some(packet::checksum(&[&pkt[ETH_HLEN..ETH_HLEN + ihl]]) == 0)
    }

    fn kernel_drops(pkt: &[u8], p: &Parsed<Ipv4Addr>) -> Option<&'static str> {
        if p.version != 4 {
            Some("version")
        } else if !p.ip_valid::<Self>(pkt) {
            Some("header checksum")
        } else if p.tot_len < p.l3_len || ETH_HLEN + p.tot_len > pkt.len() {
            Some("total length")
        } else {
            None
        }
    }

    fn first_fragment(pkt: &[u8], _: &Parsed<Ipv4Addr>) -> Option<u32> {
        let ip = &pkt[ETH_HLEN..];
        (ip[6] & 0x20 != 0).then(|| u16::from_be_bytes([ip[4], ip[5]]).into())
    }

    fn later_fragment(pkt: &[u8]) -> Option<FragKey<Ipv4Addr>> {
        let ip = pkt.get(ETH_HLEN..ETH_HLEN + IPV4_HLEN)?;
        let id = u16::from_be_bytes([ip[4], ip[5]]);
        Some((
            Self::addr_at(&ip[12..]),
            Self::addr_at(&ip[16..]),
            id.into(),
            ip[9],
        ))
    }

    fn plain_header(ip: &[u8]) -> bool {
        ip[0] == 0x45 && packet::checksum(&[&ip[..IPV4_HLEN]]) == 0
    }

    fn header_len(ip: &[u8]) -> usize {
        (ip[0] & 0x0f) as usize * 4
    }
}
