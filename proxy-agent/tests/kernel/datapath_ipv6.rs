//! The IPv6 instance of the programs, through BPF_PROG_TEST_RUN, with maps
//! the agent's own programmer fills and every output byte checked against
//! frames built here independently (RFC 8200 headers, RFC 8200 §8.1
//! pseudo-header checksums, RFC 4443 errors).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_agent::{
    model::{DesiredService, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{self, test_run},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_REDIRECT},
    proto,
};

use crate::tester::Datapath;

const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 10);
const EMPTY_VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 11);
const BACKEND: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 2);
const TARGET_PORT: u16 = 8080;
const ETH_HLEN: usize = 14;
const IP6_HLEN: usize = 40;

fn port_name(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "default".into(),
        name: name.into(),
        port_name: protocol.to_string().into(),
        protocol,
    }
}

/// web: VIP:80/TCP and VIP:53/UDP -> BACKEND:8080; empty: EMPTY_VIP:80/TCP
/// and :53/UDP without endpoints (rejected). Programmed as an agent sync.
fn fixture() -> Datapath {
    let ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
    let mut dp = Datapath::new(ebpf, 0, 0);
    let ep = vec![Endpoint::new(IpAddr::V6(BACKEND), TARGET_PORT)];
    let services = [
        ("web", VIP, Protocol::Tcp, 80, ep.clone()),
        ("web", VIP, Protocol::Udp, 53, ep),
        ("empty", EMPTY_VIP, Protocol::Tcp, 80, vec![]),
        ("empty", EMPTY_VIP, Protocol::Udp, 53, vec![]),
    ]
    .map(|(name, vip, protocol, port, eps)| {
        DesiredService::cluster_ip(port_name(name, protocol), vec![IpAddr::V6(vip)], port, eps)
    });
    dp.program(services.into());
    dp
}

/// One's-complement sum of 16-bit big-endian words.
fn sum(mut acc: u32, bytes: &[u8]) -> u32 {
    for pair in bytes.chunks(2) {
        acc += u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]) as u32;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The upper-layer checksum of RFC 8200 §8.1 over `l4` (checksum field zeroed).
fn l4_checksum(src: Ipv6Addr, dst: Ipv6Addr, next: u8, l4: &[u8]) -> u16 {
    let mut acc = sum(0, &src.octets());
    acc = sum(acc, &dst.octets());
    acc = sum(acc, &(l4.len() as u32).to_be_bytes());
    acc += next as u32;
    let c = !fold(sum(acc, l4));
    if next == proto::UDP && c == 0 {
        0xffff
    } else {
        c
    }
}

/// An IPv6 frame: `ext` (extension headers, already chained, the last
/// naming `next`) then an L4 header and payload, checksummed.
pub(crate) struct V6Frame {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    dport: u16,
    next: u8,
    tcp_flags: u8,
    hop_limit: u8,
    /// (first next-header value, bytes) of extension headers before L4.
    ext: Option<(u8, Vec<u8>)>,
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;

impl V6Frame {
    pub(crate) fn tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        V6Frame {
            src,
            dst,
            sport,
            dport,
            next: proto::TCP,
            tcp_flags: SYN,
            hop_limit: 64,
            ext: None,
        }
    }

    fn udp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        V6Frame {
            next: proto::UDP,
            tcp_flags: 0,
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    fn l4(&self, payload: &[u8]) -> Vec<u8> {
        let mut l4 = Vec::new();
        l4.extend(self.sport.to_be_bytes());
        l4.extend(self.dport.to_be_bytes());
        if self.next == proto::TCP {
            l4.extend(1000u32.to_be_bytes()); // seq
            l4.extend(0u32.to_be_bytes()); // ack
            l4.extend([5 << 4, self.tcp_flags]);
            l4.extend(64240u16.to_be_bytes()); // window
            l4.extend([0, 0, 0, 0]); // checksum, urgent
            l4.extend(payload);
            let c = l4_checksum(self.src, self.dst, proto::TCP, &l4);
            l4[16..18].copy_from_slice(&c.to_be_bytes());
        } else {
            l4.extend(((8 + payload.len()) as u16).to_be_bytes());
            l4.extend([0, 0]);
            l4.extend(payload);
            let c = l4_checksum(self.src, self.dst, proto::UDP, &l4);
            l4[6..8].copy_from_slice(&c.to_be_bytes());
        }
        l4
    }

    pub(crate) fn build(&self, payload: &[u8]) -> Vec<u8> {
        let l4 = self.l4(payload);
        let (first, ext) = match &self.ext {
            Some((first, bytes)) => (*first, bytes.clone()),
            None => (self.next, Vec::new()),
        };
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x86, 0xdd];
        f.extend([0x60, 0, 0, 0]);
        f.extend(((ext.len() + l4.len()) as u16).to_be_bytes());
        f.extend([first, self.hop_limit]);
        f.extend(self.src.octets());
        f.extend(self.dst.octets());
        f.extend(ext);
        f.extend(l4);
        f
    }
}

/// `n` chained 8-byte destination-options headers (Pad6 inside), the last
/// naming `next`.
fn dest_opts(n: usize, next: u8) -> (u8, Vec<u8>) {
    let mut bytes = Vec::new();
    for i in 0..n {
        let this_next = if i + 1 == n { next } else { 60 };
        bytes.extend([this_next, 0, 1, 4, 0, 0, 0, 0]);
    }
    (60, bytes)
}

#[test]
fn ipv6_tcp_to_a_cluster_ip_is_dnatted_with_a_valid_checksum_and_the_reply_restored() {
    let dp = fixture();
    let request = V6Frame::tcp(CLIENT, 40000, VIP, 80);
    let input = request.build(b"GET /");
    let out = test_run::from_pod(&dp.ebpf, &input).unwrap();
    // No route in the test run's namespace: translated, then left to the stack.
    assert_eq!(out.verdict, TC_ACT_OK);
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..request
    }
    .build(b"GET /");
    assert_eq!(out.packet, expected, "the request, DNATted");

    let reply = V6Frame {
        tcp_flags: SYN | ACK,
        ..V6Frame::tcp(BACKEND, TARGET_PORT, CLIENT, 40000)
    };
    let out = test_run::from_pod(&dp.ebpf, &reply.build(b"")).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    let restored = V6Frame {
        src: VIP,
        sport: 80,
        ..reply
    };
    assert_eq!(out.packet, restored.build(b""), "the reply, from the VIP");
    assert_eq!(dp.counter(Counter::NewFlow), 1);
    assert_eq!(dp.counter(Counter::ReplyNat), 1);

    // The next packet of the flow finds its conntrack entry.
    let again = V6Frame {
        tcp_flags: ACK,
        ..V6Frame::tcp(CLIENT, 40000, VIP, 80)
    };
    let out = test_run::from_pod(&dp.ebpf, &again.build(b"x")).unwrap();
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..again
    };
    assert_eq!(out.packet, expected.build(b"x"));
    assert_eq!(dp.counter(Counter::Established), 1);
}

#[test]
fn ipv6_udp_is_dnatted_and_a_zero_checksum_stays_zero() {
    let dp = fixture();
    let request = V6Frame::udp(CLIENT, 5353, VIP, 53);
    let out = test_run::from_pod(&dp.ebpf, &request.build(b"query")).unwrap();
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..request
    };
    assert_eq!(out.packet, expected.build(b"query"));

    // A zero UDP checksum is forbidden in IPv6 (RFC 8200 §8.1) but must
    // never be turned into a wrong non-zero one.
    let mut zero = V6Frame::udp(CLIENT, 5354, VIP, 53).build(b"q");
    let csum = ETH_HLEN + IP6_HLEN + 6;
    zero[csum..csum + 2].copy_from_slice(&[0, 0]);
    let out = test_run::from_pod(&dp.ebpf, &zero).unwrap();
    assert_eq!(&out.packet[csum..csum + 2], &[0, 0]);
    assert_eq!(&out.packet[ETH_HLEN + 24..ETH_HLEN + 40], &BACKEND.octets());
}

#[test]
fn ipv6_extension_headers_are_walked_and_what_cannot_be_parsed_passes_untouched() {
    let dp = fixture();
    // Two destination-options headers before TCP: walked, translated.
    let walked = V6Frame {
        ext: Some(dest_opts(2, proto::TCP)),
        ..V6Frame::tcp(CLIENT, 40001, VIP, 80)
    };
    let out = test_run::from_pod(&dp.ebpf, &walked.build(b"")).unwrap();
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..walked
    };
    assert_eq!(out.packet, expected.build(b""));

    // Five: more than the programs walk. Passed untouched, and counted.
    let deep = V6Frame {
        ext: Some(dest_opts(5, proto::TCP)),
        ..V6Frame::tcp(CLIENT, 40002, VIP, 80)
    }
    .build(b"");
    let before = dp.counter(Counter::PassUnparsed);
    let out = test_run::from_pod(&dp.ebpf, &deep).unwrap();
    assert_eq!((out.verdict, &out.packet), (TC_ACT_OK, &deep));
    assert_eq!(dp.counter(Counter::PassUnparsed), before + 1);

    // A later fragment carries no ports: left to the kernel.
    let fragment = (44, vec![proto::TCP, 0, 0x05, 0x01, 0, 0, 0, 7]);
    let later = V6Frame {
        ext: Some(fragment),
        ..V6Frame::tcp(CLIENT, 40003, VIP, 80)
    }
    .build(b"");
    let out = test_run::from_pod(&dp.ebpf, &later).unwrap();
    assert_eq!((out.verdict, &out.packet), (TC_ACT_OK, &later));
    assert_eq!(dp.counter(Counter::NewFlow), 1);
}

#[test]
fn ipv6_without_endpoints_is_answered_with_a_reset_or_icmpv6_port_unreachable() {
    let dp = fixture();
    let syn = V6Frame::tcp(CLIENT, 40000, EMPTY_VIP, 80);
    let out = test_run::from_pod(&dp.ebpf, &syn.build(b"")).unwrap();
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    // RFC 793: a SYN without ACK is answered RST|ACK, ack = seq + 1, from the
    // address it was sent to; MACs swapped; hop limit 64.
    let mut rst = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
    rst.extend([0x60, 0, 0, 0, 0, 20, proto::TCP, 64]);
    rst.extend(EMPTY_VIP.octets());
    rst.extend(CLIENT.octets());
    let mut tcp = Vec::new();
    tcp.extend(80u16.to_be_bytes());
    tcp.extend(40000u16.to_be_bytes());
    tcp.extend(0u32.to_be_bytes());
    tcp.extend(1001u32.to_be_bytes());
    tcp.extend([5 << 4, RST | ACK, 0, 0, 0, 0, 0, 0]);
    let c = l4_checksum(EMPTY_VIP, CLIENT, proto::TCP, &tcp);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    rst.extend(tcp);
    assert_eq!(out.packet, rst);

    let query = V6Frame::udp(CLIENT, 5353, EMPTY_VIP, 53).build(b"query");
    let out = test_run::from_pod(&dp.ebpf, &query).unwrap();
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    // RFC 4443: type 1 code 4, quoting the invoking header and 8 bytes of UDP.
    let quoted = &query[ETH_HLEN..ETH_HLEN + IP6_HLEN + 8];
    let mut icmp = vec![1, 4, 0, 0, 0, 0, 0, 0];
    icmp.extend(quoted);
    let c = l4_checksum(EMPTY_VIP, CLIENT, proto::ICMPV6, &icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut unreachable = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
    unreachable.extend([0x60, 0, 0, 0]);
    unreachable.extend((icmp.len() as u16).to_be_bytes());
    unreachable.extend([proto::ICMPV6, 64]);
    unreachable.extend(EMPTY_VIP.octets());
    unreachable.extend(CLIENT.octets());
    unreachable.extend(icmp);
    assert_eq!(out.packet, unreachable);
    assert_eq!(dp.counter(Counter::RejectNoEndpoints), 2);
}

#[test]
fn ipv6_with_another_version_or_a_truncated_l4_header_is_dropped() {
    let dp = fixture();
    let mut bad_version = V6Frame::tcp(CLIENT, 40000, VIP, 80).build(b"");
    bad_version[ETH_HLEN] = 0x40;
    let truncated =
        V6Frame::tcp(CLIENT, 40000, VIP, 80).build(b"")[..ETH_HLEN + IP6_HLEN + 10].to_vec();
    for (what, frame) in [
        ("version 4 in an IPv6 frame", bad_version),
        ("TCP cut short", truncated),
    ] {
        let out = test_run::from_pod(&dp.ebpf, &frame).unwrap();
        assert_eq!(out.verdict, proxy_common::action::TC_ACT_SHOT, "{what}");
    }
    assert_eq!(dp.counter(Counter::DropMalformed), 2);
}

#[test]
fn a_dual_stack_service_serves_each_family_from_its_own_endpoints() {
    use proxy_agent::cli::packet::Frame;
    let dp = {
        let ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
        let mut dp = Datapath::new(ebpf, 0, 0);
        let vip4 = Ipv4Addr::new(198, 19, 0, 20);
        let only4 = Ipv4Addr::new(198, 19, 0, 21);
        let backend4 = Ipv4Addr::new(198, 18, 2, 2);
        let dual = DesiredService::cluster_ip(
            port_name("dual", Protocol::Tcp),
            vec![IpAddr::V4(vip4), IpAddr::V6(VIP)],
            80,
            vec![
                Endpoint::new(IpAddr::V4(backend4), TARGET_PORT),
                Endpoint::new(IpAddr::V6(BACKEND), TARGET_PORT),
            ],
        );
        // Dual-stack, but its slices hold IPv4 endpoints only.
        let v4_endpoints = DesiredService::cluster_ip(
            port_name("only4", Protocol::Tcp),
            vec![IpAddr::V4(only4), IpAddr::V6(EMPTY_VIP)],
            80,
            vec![Endpoint::new(IpAddr::V4(backend4), TARGET_PORT)],
        );
        dp.program(vec![dual, v4_endpoints]);
        dp
    };
    let client4 = Ipv4Addr::new(198, 18, 1, 2);
    let out = test_run::from_pod(
        &dp.ebpf,
        &Frame::tcp(client4, 40000, Ipv4Addr::new(198, 19, 0, 20), 80).build(b""),
    )
    .unwrap();
    let left = Frame::parse(&out.packet).unwrap();
    assert_eq!(
        (left.dst, left.dport),
        (IpAddr::V4(Ipv4Addr::new(198, 18, 2, 2)), TARGET_PORT)
    );

    let request = V6Frame::tcp(CLIENT, 40000, VIP, 80);
    let out = test_run::from_pod(&dp.ebpf, &request.build(b"")).unwrap();
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..request
    };
    assert_eq!(
        out.packet,
        expected.build(b""),
        "IPv6 goes to the IPv6 endpoint"
    );

    // The IPv4 endpoint is never used for IPv6: the IPv6 frontend has none
    // and answers with a reset, as upstream's IPv6 proxier rejects it.
    let syn = V6Frame::tcp(CLIENT, 40001, EMPTY_VIP, 80);
    let out = test_run::from_pod(&dp.ebpf, &syn.build(b"")).unwrap();
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    assert_eq!(out.packet[ETH_HLEN + IP6_HLEN + 13], RST | ACK);
    assert_eq!(dp.counter(Counter::NewFlow), 2);
    assert_eq!(dp.counter(Counter::RejectNoEndpoints), 1);
}

#[test]
fn inspect_reads_both_families_frontends_and_backends() {
    use proxy_agent::cli::inspect::{names::Naming, services};

    let dp = fixture();
    let tables = services::ServiceTables::read(&dp.maps).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let naming = Naming::load(dir.path(), &tables.service_ids(), &tables.backends);
    let report = services::services(&tables, &naming, None);
    let web = report
        .frontends
        .iter()
        .find(|f| f.address == VIP.to_string() && f.port == 80 && f.protocol == "TCP")
        .expect("the IPv6 frontend");
    assert_eq!(web.kind, "ClusterIP");
    assert_eq!(web.backends.len(), 1);
    assert_eq!(web.backends[0].address, BACKEND.to_string());
    assert_eq!(web.backends[0].port, TARGET_PORT);
    assert!(
        report
            .frontends
            .iter()
            .any(|f| f.address == EMPTY_VIP.to_string()
                && f.backends.is_empty()
                && f.reject_when_empty)
    );
    assert_eq!(report.cluster_ip_markers, 2, "one per IPv6 cluster IP");
    let only =
        proxy_agent::cli::inspect::args::endpoint_filter(&format!("[{BACKEND}]:8080")).unwrap();
    let backends = services::backends(&tables, &naming, Some(&only));
    assert_eq!(backends.backends.len(), 2, "the TCP and the UDP backend");
}

/// The frames the family-generic scenarios (`datapath_kernel`,
/// `datapath_frontends`, `datapath_conntrack`) build come from
/// `cli::packet`; this file's builder is written apart from it, from RFC
/// 8200. Each one's checksums verify by the other's rules.
#[test]
fn the_shared_frame_builder_agrees_with_this_files_rfc_8200_builder() {
    use proxy_agent::cli::packet::{Frame, checksums_valid};
    for next in [proto::TCP, proto::UDP] {
        let ours = V6Frame {
            next,
            ..V6Frame::tcp(CLIENT, 40000, VIP, 80)
        }
        .build(b"payload");
        assert!(checksums_valid(&ours), "next header {next}");
        let frame = Frame {
            proto: next,
            ..Frame::tcp(CLIENT, 40000, VIP, 80)
        };
        assert_eq!(Frame::parse(&ours), Some(frame));
        let shared = frame.build(b"payload");
        // The MACs differ; the ethertype and the IPv6 header may not.
        assert_eq!(
            &shared[12..ETH_HLEN + IP6_HLEN],
            &ours[12..ETH_HLEN + IP6_HLEN]
        );
        let l4 = &shared[ETH_HLEN + IP6_HLEN..];
        let field = if next == proto::TCP { 16 } else { 6 };
        let mut zeroed = l4.to_vec();
        zeroed[field..field + 2].fill(0);
        assert_eq!(
            l4_checksum(CLIENT, VIP, next, &zeroed).to_be_bytes(),
            [l4[field], l4[field + 1]],
            "next header {next}"
        );
    }
}

/// `frame`'s UDP datagram (40 bytes of payload) in two IPv6 fragments of
/// identification `id`: the first with the UDP header and 16 bytes (more to
/// follow), the later one with the other 24 at offset 24.
fn ipv6_fragments(frame: V6Frame, id: u32) -> (Vec<u8>, Vec<u8>) {
    const FRAG: usize = ETH_HLEN + IP6_HLEN;
    let header = |offset_flags: u16| {
        let mut h = vec![proto::UDP, 0];
        h.extend(offset_flags.to_be_bytes());
        h.extend(id.to_be_bytes());
        h
    };
    let whole = V6Frame {
        ext: Some((44, header(1))),
        ..frame
    }
    .build(&[0x5a; 40]);
    let mut first = whole[..FRAG + 8 + 8 + 16].to_vec();
    let mut later = whole[..FRAG].to_vec();
    later.extend(header(24));
    later.extend_from_slice(&whole[FRAG + 8 + 8 + 16..]);
    for pkt in [&mut first, &mut later] {
        let payload = (pkt.len() - FRAG) as u16;
        pkt[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&payload.to_be_bytes());
    }
    (first, later)
}

fn ipv6_addresses(pkt: &[u8]) -> (Ipv6Addr, Ipv6Addr) {
    let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&pkt[at..at + 16]).unwrap());
    (addr(ETH_HLEN + 8), addr(ETH_HLEN + 24))
}

/// As in IPv4: the first fragment of a UDP datagram is translated and
/// leaves its ports in `FRAGMENTS6`; the later one follows it to the same
/// backend with its addresses alone rewritten (bytes past the IPv6 header
/// untouched); the reply's fragments come back from the service.
#[test]
fn ipv6_fragments_of_a_udp_datagram_follow_their_first() {
    let dp = fixture();
    let (first, later) = ipv6_fragments(V6Frame::udp(CLIENT, 40100, VIP, 53), 0x4242_0001);
    let out = test_run::from_pod(&dp.ebpf, &first).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(ipv6_addresses(&out.packet), (CLIENT, BACKEND));
    let l4 = ETH_HLEN + IP6_HLEN + 8;
    assert_eq!(out.packet[l4 + 2..l4 + 4], TARGET_PORT.to_be_bytes());

    let out = test_run::from_pod(&dp.ebpf, &later).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(
        ipv6_addresses(&out.packet),
        (CLIENT, BACKEND),
        "the later fragment follows"
    );
    assert_eq!(
        out.packet[ETH_HLEN + IP6_HLEN..],
        later[ETH_HLEN + IP6_HLEN..]
    );

    let (first, later) = ipv6_fragments(
        V6Frame::udp(BACKEND, TARGET_PORT, CLIENT, 40100),
        0x5151_0002,
    );
    let out = test_run::from_pod(&dp.ebpf, &first).unwrap();
    assert_eq!(ipv6_addresses(&out.packet), (VIP, CLIENT));
    let out = test_run::from_pod(&dp.ebpf, &later).unwrap();
    assert_eq!(
        ipv6_addresses(&out.packet),
        (VIP, CLIENT),
        "the reply's later fragment"
    );
    assert_eq!(
        out.packet[ETH_HLEN + IP6_HLEN..],
        later[ETH_HLEN + IP6_HLEN..]
    );
}
