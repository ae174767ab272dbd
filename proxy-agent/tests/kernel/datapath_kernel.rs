//! The real eBPF object in the real kernel: packets crafted here go through
//! `tc_from_pod` with BPF_PROG_TEST_RUN, and the verdict and every output
//! byte are checked. Maps are provisioned through the agent's own programmer.
//! Needs root (CAP_BPF); these tests fail rather than skip without it.
//!
//! Single packets are tables of rows played by [`Datapath::play`]; flows
//! whose backend is only known once balanced are loops.

use std::net::{IpAddr, Ipv4Addr};

use proxy_agent::{
    cli::packet::{self, Frame, tcp_flags},
    model::{DesiredService, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{self, test_run::Hook::FromPod},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
};

use crate::tester::{Datapath, In, Out::*, Step, counters, pkt, send};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 11);
const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 2, 2),
    Ipv4Addr::new(198, 18, 2, 3),
    Ipv4Addr::new(198, 18, 2, 4),
];
const TARGET_PORT: u16 = 8080;

/// web: VIP:80/TCP and VIP:53/UDP -> `backends`:8080; empty: EMPTY_VIP:80 with none.
fn services(backends: &[Ipv4Addr]) -> Vec<DesiredService> {
    let eps: Vec<Endpoint> = backends
        .iter()
        .map(|ip| Endpoint::new(IpAddr::V4(*ip), TARGET_PORT))
        .collect();
    let svc = |name: &str, vip: Ipv4Addr, port: u16, protocol: Protocol, eps: Vec<Endpoint>| {
        let name = ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port_name: protocol.to_string(),
            protocol,
        };
        DesiredService::cluster_ip(name, vec![IpAddr::V4(vip)], port, eps)
    };
    vec![
        svc("web", VIP, 80, Protocol::Tcp, eps.clone()),
        svc("web", VIP, 53, Protocol::Udp, eps),
        svc("empty", EMPTY_VIP, 80, Protocol::Tcp, vec![]),
    ]
}

/// The object with default map sizes and the services programmed; pod runs
/// name no interface.
fn fixture() -> Datapath {
    let ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
    let mut dp = Datapath::new(ebpf, 0, 0);
    dp.program(services(&BACKENDS));
    dp
}

/// Plays `steps` on a fresh fixture.
fn play(steps: Vec<Step>) {
    fixture().play(steps);
}

fn backend_of(pkt: &[u8]) -> Ipv4Addr {
    Frame::parse(pkt).unwrap().dst
}

#[test]
fn new_tcp_flow_is_dnatted_to_a_backend_with_valid_checksums() {
    play(vec![
        send(
            FromPod,
            pkt(
                Frame::tcp(CLIENT, 40000, VIP, 80),
                b"GET / HTTP/1.0\r\n\r\n",
            ),
            TC_ACT_OK,
            [DnatToOneOf(&BACKENDS, TARGET_PORT)],
        ),
        counters([(Counter::NewFlow, 1)]),
    ]);
}

#[test]
fn every_packet_of_a_flow_goes_to_the_same_backend() {
    let f = fixture();
    let input = Frame::tcp(CLIENT, 40001, VIP, 80).build(b"x");
    let first = backend_of(&f.run(FromPod, &input).packet);
    for _ in 0..50 {
        assert_eq!(backend_of(&f.run(FromPod, &input).packet), first);
    }
    assert_eq!(f.counter(Counter::NewFlow), 1);
    assert_eq!(f.counter(Counter::Established), 50);
}

#[test]
fn reply_from_the_backend_is_reverse_translated_to_the_vip() {
    play(vec![
        send(
            FromPod,
            pkt(Frame::tcp(CLIENT, 40002, VIP, 80), b"ping"),
            TC_ACT_OK,
            [],
        ),
        // The backend answers; the reply comes from the VIP.
        send(
            FromPod,
            In::Reply(b"pong"),
            TC_ACT_OK,
            [Rewritten(Frame::tcp(VIP, 80, CLIENT, 40002))],
        ),
        send(
            FromPod,
            pkt(Frame::udp(CLIENT, 40002, VIP, 53), b"ping"),
            TC_ACT_OK,
            [],
        ),
        send(
            FromPod,
            In::Reply(b"pong"),
            TC_ACT_OK,
            [Rewritten(Frame::udp(VIP, 53, CLIENT, 40002))],
        ),
        counters([(Counter::ReplyNat, 2)]),
    ]);
}

#[test]
fn tc_from_host_translates_replies_of_live_flows_and_nothing_else() {
    // BPF_PROG_TEST_RUN gives its skb a socket, as the node's own sockets'
    // packets have: the reply of a live flow (a hostNetwork endpoint's)
    // gets the frontend back as its source; a packet of no flow passes.
    play(vec![
        send(
            FromPod,
            pkt(Frame::tcp(CLIENT, 40003, VIP, 80), b"ping"),
            TC_ACT_OK,
            [],
        ),
        send(
            ebpf::test_run::Hook::FromHost,
            In::Reply(b"pong"),
            TC_ACT_OK,
            [Rewritten(Frame::tcp(VIP, 80, CLIENT, 40003))],
        ),
        send(
            ebpf::test_run::Hook::FromHost,
            pkt(Frame::tcp(BACKENDS[0], 8080, CLIENT, 40999), b"pong"),
            TC_ACT_OK,
            [Unchanged],
        ),
        counters([(Counter::HostReply, 1), (Counter::ReplyNat, 0)]),
    ]);
}

/// `frame` with `payload` and a UDP checksum of 0 (none).
fn without_udp_checksum(frame: Frame, payload: &[u8]) -> In {
    let mut p = frame.build(payload);
    let off = packet::l4_checksum_offset(&p);
    p[off..off + 2].fill(0);
    In::Bytes(p)
}

#[test]
fn udp_flow_is_dnatted_and_a_zero_checksum_stays_zero() {
    play(vec![
        send(
            FromPod,
            pkt(Frame::udp(CLIENT, 40003, VIP, 53), b"query"),
            TC_ACT_OK,
            [DnatToOneOf(&BACKENDS, TARGET_PORT)],
        ),
        send(
            FromPod,
            without_udp_checksum(Frame::udp(CLIENT, 40004, VIP, 53), b"query"),
            TC_ACT_OK,
            [NoUdpChecksum],
        ),
    ]);
}

#[test]
fn traffic_to_a_non_service_address_is_untouched() {
    play(vec![
        send(
            FromPod,
            pkt(
                Frame::tcp(CLIENT, 40005, Ipv4Addr::new(198, 18, 9, 9), 80),
                b"x",
            ),
            TC_ACT_OK,
            [Unchanged],
        ),
        counters([(Counter::NewFlow, 0)]),
    ]);
}

/// As upstream's nftables mode: a cluster IP's other ports and protocols are rejected.
#[test]
fn traffic_to_an_unknown_port_of_a_vip_is_rejected() {
    play(vec![
        // Sent back, addressed to the client.
        send(
            FromPod,
            pkt(Frame::tcp(CLIENT, 40006, VIP, 81), b"x"),
            TC_ACT_REDIRECT,
            [IpDst(CLIENT)],
        ),
        send(
            FromPod,
            pkt(Frame::udp(CLIENT, 40006, VIP, 80), b"x"),
            TC_ACT_REDIRECT,
            [IpDst(CLIENT)],
        ),
        counters([(Counter::RejectUnknownPort, 2)]),
    ]);
}

#[test]
fn non_ipv4_frames_are_untouched() {
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    play(vec![send(FromPod, In::Bytes(arp), TC_ACT_OK, [Unchanged])]);
}

#[test]
fn service_without_endpoints_rejects_and_counts() {
    play(vec![
        send(
            FromPod,
            pkt(Frame::tcp(CLIENT, 40007, EMPTY_VIP, 80), b"x"),
            TC_ACT_REDIRECT,
            [TcpFlag(tcp_flags::RST)],
        ),
        counters([(Counter::RejectNoEndpoints, 1)]),
    ]);
}

#[test]
fn truncated_l4_header_is_dropped_and_counted() {
    let full = Frame::tcp(CLIENT, 40008, VIP, 80).build(b"");
    let truncated = full[..packet::ETH_HLEN + packet::IPV4_HLEN + 10].to_vec();
    play(vec![
        send(FromPod, In::Bytes(truncated), TC_ACT_SHOT, []),
        counters([(Counter::DropMalformed, 1)]),
    ]);
}

#[test]
fn invalid_ipv4_headers_are_dropped_never_translated() {
    let good = Frame::tcp(CLIENT, 40009, VIP, 80).build(b"payload");
    let ip = packet::ETH_HLEN;
    let mut not_v4 = good.clone();
    not_v4[ip] = 0x65; // version 6 in an IPv4 frame
    let mut short_total = good.clone();
    short_total[ip + 2..ip + 4].copy_from_slice(&30u16.to_be_bytes()); // < 20 + 18
    let mut big_tcp = good.clone();
    big_tcp[ip + 2..ip + 4].copy_from_slice(&0u16.to_be_bytes()); // BIG TCP: length 0
    // Only the field under test is wrong: the header checksums match.
    for pkt in [&mut not_v4, &mut short_total, &mut big_tcp] {
        pkt[ip + 10..ip + 12].fill(0);
        let sum = packet::checksum(&[&pkt[ip..ip + packet::IPV4_HLEN]]);
        pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    }
    play(vec![
        send(FromPod, In::Bytes(not_v4), TC_ACT_SHOT, []),
        send(FromPod, In::Bytes(short_total), TC_ACT_SHOT, []),
        counters([(Counter::DropMalformed, 2), (Counter::NewFlow, 0)]),
        // Translated (its L4 checksum cannot be checked here: the length is the skb's).
        send(FromPod, In::Bytes(big_tcp), TC_ACT_OK, []),
        counters([(Counter::DropMalformed, 2), (Counter::NewFlow, 1)]),
    ]);
}

#[test]
fn new_flows_are_spread_over_all_backends() {
    let f = fixture();
    let mut hits = [0u32; 3];
    for sport in 0..300u16 {
        let out = f.run(
            FromPod,
            &Frame::tcp(CLIENT, 20000 + sport, VIP, 80).build(b""),
        );
        let idx = BACKENDS
            .iter()
            .position(|b| *b == backend_of(&out.packet))
            .expect("a backend");
        hits[idx] += 1;
    }
    assert!(hits.iter().all(|h| *h >= 50), "uneven spread {hits:?}");
}

#[test]
fn removed_backend_gets_no_new_flows_and_its_udp_flows_are_flushed() {
    let mut f = fixture();
    // Find a UDP flow that landed on the backend about to go.
    let gone = BACKENDS[2];
    let flow = (30000..31000u16)
        .map(|sport| Frame::udp(CLIENT, sport, VIP, 53))
        .find(|req| backend_of(&f.run(FromPod, &req.build(b"")).packet) == gone)
        .expect("some flow reaches every backend");
    f.program(services(&BACKENDS[..2]));
    for sport in 0..200u16 {
        let out = f.run(
            FromPod,
            &Frame::tcp(CLIENT, 10000 + sport, VIP, 80).build(b""),
        );
        assert_ne!(backend_of(&out.packet), gone);
    }
    // The established UDP flow to the removed backend was flushed and is balanced again.
    assert_ne!(backend_of(&f.run(FromPod, &flow.build(b"")).packet), gone);
}
