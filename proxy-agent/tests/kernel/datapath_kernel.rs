//! The real eBPF object in the real kernel: packets crafted here go through
//! `tc_from_pod` with BPF_PROG_TEST_RUN, and the verdict and every output
//! byte are checked. Maps are provisioned through the agent's own programmer.
//! Needs root (CAP_BPF); these tests fail rather than skip without it.

use std::net::{IpAddr, Ipv4Addr};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use proxy_agent::{
    cli::packet::{self, Frame, checksums_valid},
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{self, KernelMaps, Programmer, test_run},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 11);
const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 2, 2),
    Ipv4Addr::new(198, 18, 2, 3),
    Ipv4Addr::new(198, 18, 2, 4),
];
const TARGET_PORT: u16 = 8080;

struct Fixture {
    ebpf: Ebpf,
    maps: KernelMaps,
    stats: PerCpuArray<MapData, u64>,
    programmer: Programmer,
}

impl Fixture {
    fn new() -> Self {
        let mut ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
        let (maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        let mut f = Self {
            ebpf,
            maps,
            stats,
            programmer: Programmer::new(),
        };
        f.program(&BACKENDS);
        f
    }

    /// web: VIP:80/TCP and VIP:53/UDP -> `backends`:8080; empty: EMPTY_VIP:80 with none.
    fn program(&mut self, backends: &[Ipv4Addr]) {
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
            (
                name.clone(),
                DesiredService::cluster_ip(name, vec![IpAddr::V4(vip)], port, eps),
            )
        };
        let state = DesiredState {
            services: [
                svc("web", VIP, 80, Protocol::Tcp, eps.clone()),
                svc("web", VIP, 53, Protocol::Udp, eps),
                svc("empty", EMPTY_VIP, 80, Protocol::Tcp, vec![]),
            ]
            .into_iter()
            .collect(),
        };
        self.programmer
            .sync(&state, &mut self.maps)
            .expect("programming the maps");
    }

    fn run(&self, pkt: &[u8]) -> test_run::Outcome {
        test_run::from_pod(&self.ebpf, pkt).expect("BPF_PROG_TEST_RUN")
    }

    fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }
}

/// Asserts `out` equals `input` except for the rewritten addresses, ports
/// and checksums, and that the checksums verify.
fn assert_rewritten(input: &[u8], out: &[u8], expect: Frame) {
    assert_eq!(out.len(), input.len());
    assert_eq!(Frame::parse(out), Some(expect));
    assert!(checksums_valid(out), "checksums must verify after rewrite");
    let mut normalized = out.to_vec();
    let mut want = input.to_vec();
    // Blank the fields the datapath may change, then everything else must be equal.
    for buf in [&mut normalized, &mut want] {
        let l4 = packet::ETH_HLEN + packet::IPV4_HLEN;
        let csum = packet::l4_checksum_offset(buf);
        for range in [24..34, l4..l4 + 4, csum..csum + 2] {
            buf[range].fill(0);
        }
    }
    assert_eq!(
        normalized, want,
        "bytes outside addresses, ports and checksums changed"
    );
}

fn backend_of(pkt: &[u8]) -> Ipv4Addr {
    Frame::parse(pkt).unwrap().dst
}

#[test]
fn new_tcp_flow_is_dnatted_to_a_backend_with_valid_checksums() {
    let f = Fixture::new();
    let req = Frame::tcp(CLIENT, 40000, VIP, 80);
    let input = req.build(b"GET / HTTP/1.0\r\n\r\n");
    let out = f.run(&input);
    assert_eq!(out.verdict, TC_ACT_OK);
    let backend = backend_of(&out.packet);
    assert!(BACKENDS.contains(&backend), "{backend} is not a backend");
    assert_rewritten(
        &input,
        &out.packet,
        Frame {
            dst: backend,
            dport: TARGET_PORT,
            ..req
        },
    );
    assert_eq!(f.counter(Counter::NewFlow), 1);
}

#[test]
fn every_packet_of_a_flow_goes_to_the_same_backend() {
    let f = Fixture::new();
    let input = Frame::tcp(CLIENT, 40001, VIP, 80).build(b"x");
    let first = backend_of(&f.run(&input).packet);
    for _ in 0..50 {
        assert_eq!(backend_of(&f.run(&input).packet), first);
    }
    assert_eq!(f.counter(Counter::NewFlow), 1);
    assert_eq!(f.counter(Counter::Established), 50);
}

#[test]
fn reply_from_the_backend_is_reverse_translated_to_the_vip() {
    let f = Fixture::new();
    for req in [
        Frame::tcp(CLIENT, 40002, VIP, 80),
        Frame::udp(CLIENT, 40002, VIP, 53),
    ] {
        let forwarded = f.run(&req.build(b"ping")).packet;
        let backend = Frame::parse(&forwarded).unwrap();
        let reply_in = backend.reply().build(b"pong");
        let out = f.run(&reply_in);
        assert_eq!(out.verdict, TC_ACT_OK);
        assert_rewritten(&reply_in, &out.packet, req.reply());
    }
    assert_eq!(f.counter(Counter::ReplyNat), 2);
}

#[test]
fn udp_flow_is_dnatted_and_a_zero_checksum_stays_zero() {
    let f = Fixture::new();
    let req = Frame::udp(CLIENT, 40003, VIP, 53);
    let input = req.build(b"query");
    let out = f.run(&input);
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_rewritten(
        &input,
        &out.packet,
        Frame {
            dst: backend_of(&out.packet),
            dport: TARGET_PORT,
            ..req
        },
    );

    let mut no_csum = Frame::udp(CLIENT, 40004, VIP, 53).build(b"query");
    let off = packet::l4_checksum_offset(&no_csum);
    no_csum[off..off + 2].fill(0);
    let out = f.run(&no_csum);
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(
        out.packet[off..off + 2],
        [0, 0],
        "UDP checksum 0 means none and must stay 0"
    );
    assert!(checksums_valid(&out.packet));
}

#[test]
fn traffic_to_a_non_service_address_is_untouched() {
    let f = Fixture::new();
    let input = Frame::tcp(CLIENT, 40005, Ipv4Addr::new(198, 18, 9, 9), 80).build(b"x");
    let out = f.run(&input);
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(out.packet, input);
    assert_eq!(f.counter(Counter::NewFlow), 0);
}

/// As upstream's nftables mode: a cluster IP's other ports and protocols are rejected.
#[test]
fn traffic_to_an_unknown_port_of_a_vip_is_rejected() {
    let f = Fixture::new();
    for input in [
        Frame::tcp(CLIENT, 40006, VIP, 81).build(b"x"),
        Frame::udp(CLIENT, 40006, VIP, 80).build(b"x"),
    ] {
        let out = f.run(&input);
        assert_eq!(out.verdict, TC_ACT_REDIRECT, "sent back to the client");
        assert_eq!(Frame::parse(&input).map(|i| i.src), Some(CLIENT));
        assert_eq!(
            &out.packet[30..34],
            &CLIENT.octets(),
            "addressed to the client"
        );
    }
    assert_eq!(f.counter(Counter::RejectUnknownPort), 2);
}

#[test]
fn non_ipv4_frames_are_untouched() {
    let f = Fixture::new();
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    let out = f.run(&arp);
    assert_eq!((out.verdict, out.packet), (TC_ACT_OK, arp));
}

#[test]
fn service_without_endpoints_rejects_and_counts() {
    let f = Fixture::new();
    let out = f.run(&Frame::tcp(CLIENT, 40007, EMPTY_VIP, 80).build(b"x"));
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    assert_eq!(
        out.packet[14 + 20 + 13] & packet::tcp_flags::RST,
        packet::tcp_flags::RST
    );
    assert_eq!(f.counter(Counter::RejectNoEndpoints), 1);
}

#[test]
fn truncated_l4_header_is_dropped_and_counted() {
    let f = Fixture::new();
    let full = Frame::tcp(CLIENT, 40008, VIP, 80).build(b"");
    let truncated = &full[..packet::ETH_HLEN + packet::IPV4_HLEN + 10];
    let out = f.run(truncated);
    assert_eq!(out.verdict, TC_ACT_SHOT);
    assert_eq!(f.counter(Counter::DropMalformed), 1);
}

#[test]
fn new_flows_are_spread_over_all_backends() {
    let f = Fixture::new();
    let mut hits = [0u32; 3];
    for sport in 0..300u16 {
        let out = f.run(&Frame::tcp(CLIENT, 20000 + sport, VIP, 80).build(b""));
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
    let mut f = Fixture::new();
    // Find a UDP flow that landed on the backend about to go.
    let gone = BACKENDS[2];
    let flow = (30000..31000u16)
        .map(|sport| Frame::udp(CLIENT, sport, VIP, 53))
        .find(|req| backend_of(&f.run(&req.build(b"")).packet) == gone)
        .expect("some flow reaches every backend");
    f.program(&BACKENDS[..2]);
    for sport in 0..200u16 {
        let out = f.run(&Frame::tcp(CLIENT, 10000 + sport, VIP, 80).build(b""));
        assert_ne!(backend_of(&out.packet), gone);
    }
    // The established UDP flow to the removed backend was flushed and is balanced again.
    assert_ne!(backend_of(&f.run(&flow.build(b"")).packet), gone);
}
