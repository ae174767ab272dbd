//! The IPv6 instance of the programs, through BPF_PROG_TEST_RUN, with every
//! output byte checked against frames built here independently (RFC 8200
//! headers, RFC 2460 §8.1 pseudo-header checksums).
//!
//! The agent's programmer does not write the IPv6 maps yet (issue 11's
//! next step), so these tests write `SERVICES6` / `BACKENDS6` themselves,
//! in the layout `proxy_common` defines; once the programmer does, they
//! move to the tester's tables beside their IPv4 counterparts.

use std::net::Ipv6Addr;

use aya::{
    Ebpf,
    maps::{HashMap, PerCpuArray},
};
use proxy_agent::modes::ebpf::{self, test_run};
use proxy_common::{
    Backend6, Counter, FrontendKind, ServiceKey6, ServiceValue,
    action::{TC_ACT_OK, TC_ACT_REDIRECT},
    proto,
    service::flags,
};

const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 10);
const EMPTY_VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 11);
const BACKEND: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 2);
const TARGET_PORT: u16 = 8080;
const ETH_HLEN: usize = 14;
const IP6_HLEN: usize = 40;

fn words(ip: Ipv6Addr) -> [u32; 4] {
    let o = ip.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// VIP:80/TCP and VIP:53/UDP -> BACKEND:8080; EMPTY_VIP:80/TCP and :53/UDP
/// without endpoints (rejected).
fn fixture() -> Ebpf {
    let mut ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
    {
        let mut backends: HashMap<_, u32, Backend6> =
            HashMap::try_from(ebpf.map_mut("BACKENDS6").expect("BACKENDS6")).unwrap();
        for (id, p) in [(1, proto::TCP), (2, proto::UDP)] {
            let b = Backend6 {
                addr_be: words(BACKEND),
                port_be: TARGET_PORT.to_be(),
                proto: p,
                flags: 0,
            };
            backends.insert(id, b, 0).unwrap();
        }
    }
    let mut services: HashMap<_, ServiceKey6, ServiceValue> =
        HashMap::try_from(ebpf.map_mut("SERVICES6").expect("SERVICES6")).unwrap();
    let kind = ServiceValue::kind_flags(FrontendKind::ClusterIp);
    for (service_id, port, p) in [(1, 80u16, proto::TCP), (2, 53, proto::UDP)] {
        let key = ServiceKey6::frontend(words(VIP), port.to_be(), p);
        services
            .insert(
                key.with_slot(1),
                ServiceValue::slot(service_id, service_id),
                0,
            )
            .unwrap();
        services
            .insert(key, ServiceValue::frontend(1, service_id, kind), 0)
            .unwrap();
        let empty = ServiceKey6::frontend(words(EMPTY_VIP), port.to_be(), p);
        let value = ServiceValue::frontend(0, 10 + service_id, kind | flags::REJECT_WHEN_EMPTY);
        services.insert(empty, value, 0).unwrap();
    }
    ebpf
}

fn counter(ebpf: &Ebpf, c: Counter) -> u64 {
    let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(ebpf.map("STATS").unwrap()).unwrap();
    stats.get(&(c as u32), 0).unwrap().iter().sum()
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
struct V6Frame {
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
    fn tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
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

    fn build(&self, payload: &[u8]) -> Vec<u8> {
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
    let ebpf = fixture();
    let request = V6Frame::tcp(CLIENT, 40000, VIP, 80);
    let input = request.build(b"GET /");
    let out = test_run::from_pod(&ebpf, &input).unwrap();
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
    let out = test_run::from_pod(&ebpf, &reply.build(b"")).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    let restored = V6Frame {
        src: VIP,
        sport: 80,
        ..reply
    };
    assert_eq!(out.packet, restored.build(b""), "the reply, from the VIP");
    assert_eq!(counter(&ebpf, Counter::NewFlow), 1);
    assert_eq!(counter(&ebpf, Counter::ReplyNat), 1);

    // The next packet of the flow finds its conntrack entry.
    let again = V6Frame {
        tcp_flags: ACK,
        ..V6Frame::tcp(CLIENT, 40000, VIP, 80)
    };
    let out = test_run::from_pod(&ebpf, &again.build(b"x")).unwrap();
    let expected = V6Frame {
        dst: BACKEND,
        dport: TARGET_PORT,
        ..again
    };
    assert_eq!(out.packet, expected.build(b"x"));
    assert_eq!(counter(&ebpf, Counter::Established), 1);
}

#[test]
fn ipv6_udp_is_dnatted_and_a_zero_checksum_stays_zero() {
    let ebpf = fixture();
    let request = V6Frame::udp(CLIENT, 5353, VIP, 53);
    let out = test_run::from_pod(&ebpf, &request.build(b"query")).unwrap();
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
    let out = test_run::from_pod(&ebpf, &zero).unwrap();
    assert_eq!(&out.packet[csum..csum + 2], &[0, 0]);
    assert_eq!(&out.packet[ETH_HLEN + 24..ETH_HLEN + 40], &BACKEND.octets());
}

#[test]
fn ipv6_extension_headers_are_walked_and_what_cannot_be_parsed_passes_untouched() {
    let ebpf = fixture();
    // Two destination-options headers before TCP: walked, translated.
    let walked = V6Frame {
        ext: Some(dest_opts(2, proto::TCP)),
        ..V6Frame::tcp(CLIENT, 40001, VIP, 80)
    };
    let out = test_run::from_pod(&ebpf, &walked.build(b"")).unwrap();
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
    let before = counter(&ebpf, Counter::PassUnparsed);
    let out = test_run::from_pod(&ebpf, &deep).unwrap();
    assert_eq!((out.verdict, &out.packet), (TC_ACT_OK, &deep));
    assert_eq!(counter(&ebpf, Counter::PassUnparsed), before + 1);

    // A later fragment carries no ports: left to the kernel.
    let fragment = (44, vec![proto::TCP, 0, 0x05, 0x01, 0, 0, 0, 7]);
    let later = V6Frame {
        ext: Some(fragment),
        ..V6Frame::tcp(CLIENT, 40003, VIP, 80)
    }
    .build(b"");
    let out = test_run::from_pod(&ebpf, &later).unwrap();
    assert_eq!((out.verdict, &out.packet), (TC_ACT_OK, &later));
    assert_eq!(counter(&ebpf, Counter::NewFlow), 1);
}

#[test]
fn ipv6_without_endpoints_is_answered_with_a_reset_or_icmpv6_port_unreachable() {
    let ebpf = fixture();
    let syn = V6Frame::tcp(CLIENT, 40000, EMPTY_VIP, 80);
    let out = test_run::from_pod(&ebpf, &syn.build(b"")).unwrap();
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
    let out = test_run::from_pod(&ebpf, &query).unwrap();
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
    assert_eq!(counter(&ebpf, Counter::RejectNoEndpoints), 2);
}

#[test]
fn ipv6_with_another_version_or_a_truncated_l4_header_is_dropped() {
    let ebpf = fixture();
    let mut bad_version = V6Frame::tcp(CLIENT, 40000, VIP, 80).build(b"");
    bad_version[ETH_HLEN] = 0x40;
    let truncated =
        V6Frame::tcp(CLIENT, 40000, VIP, 80).build(b"")[..ETH_HLEN + IP6_HLEN + 10].to_vec();
    for (what, frame) in [
        ("version 4 in an IPv6 frame", bad_version),
        ("TCP cut short", truncated),
    ] {
        let out = test_run::from_pod(&ebpf, &frame).unwrap();
        assert_eq!(out.verdict, proxy_common::action::TC_ACT_SHOT, "{what}");
    }
    assert_eq!(counter(&ebpf, Counter::DropMalformed), 2);
}
