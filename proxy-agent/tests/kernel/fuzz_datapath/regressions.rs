//! Regression cases the fuzzer found, minimised.

use std::net::{IpAddr, Ipv4Addr};

use proxy_agent::{
    cli::packet::{self, ETH_HLEN, Frame, IPV4_HLEN, checksums_valid, tcp_flags},
    model::Protocol,
    modes::ebpf::{
        node::{SNAT_PORT_MAX, SNAT_PORT_MIN},
        test_run::Hook,
    },
};
use proxy_common::{
    action::{TC_ACT_OK, TC_ACT_REDIRECT},
    proto,
};

use super::{
    family::Fam,
    fixture::Fixture,
    generate::Class,
    oracle::{Judged, Oracle},
    rng::Rng,
    shape::{SCTP, Shape},
    v4::{EMPTY_VIP, Ipv4, LOCAL_A, LOCAL_LB_IP, LOCAL_POD, LOCAL_VIP, REMOTE_A},
    v6::{self, Ipv6},
    world::{Spec, Tuple, World},
};

type Tuple4 = Tuple<Ipv4Addr>;

fn send(fx: &Fixture, hook: Hook, t: Tuple4, flags: u8) -> Tuple4 {
    let mut pkt = t.frame().build(b"q");
    if t.proto == proto::TCP {
        pkt[ETH_HLEN + IPV4_HLEN + 13] = flags;
        packet::fix_checksums(&mut pkt);
    }
    let out = fx.run(hook, &pkt).expect("BPF_PROG_TEST_RUN");
    assert!(
        matches!(out.verdict, TC_ACT_OK | TC_ACT_REDIRECT),
        "{t}: verdict {}",
        out.verdict
    );
    assert!(checksums_valid(&out.packet), "{t}: checksums");
    let f = Frame::parse(&out.packet).unwrap();
    let v4 = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("{t}: left as IPv6 {a}"),
    };
    Tuple {
        src: v4(f.src),
        sport: f.sport,
        dst: v4(f.dst),
        dport: f.dport,
        proto: f.proto,
    }
}

/// One client port reaching one endpoint through two frontends, neither
/// masqueraded: both flows would have the same reply tuple (endpoint ->
/// client:port). The second flow overwrites the first's reply state, so
/// the first connection's replies come back from the second frontend (and
/// the client refuses them). What is expected: as the kernel's NAT picks a
/// unique tuple, the second flow keeps the client's address but gets a
/// source port of its own. (A fix doing that, 9d72f69 with the new_flow
/// part of fd71e21, was taken back out: tests/kernel/datapath_frontends.rs's
/// external_traffic_policy_local_keeps_the_client_address sends one client
/// port to three frontends of one service and expects the port kept.)
fn one_client_port_two_frontends(specs: &[Spec<Ipv4Addr>], first: Tuple4, second: Tuple4) {
    let backend = (specs[0].endpoints[0].0, specs[0].endpoints[0].1);
    for hook in [Hook::FromPod, Hook::FromNetdev] {
        let fx = Fixture::new::<Ipv4>(1 << 12, specs);
        let syn = tcp_flags::SYN;
        let a = send(&fx, hook, first, syn);
        assert_eq!(
            a,
            Tuple {
                dst: backend.0,
                dport: backend.1,
                ..first
            },
            "{hook:?}"
        );
        let b = send(&fx, hook, second, syn);
        assert_eq!(
            (b.src, b.dst, b.dport),
            (second.src, backend.0, backend.1),
            "{hook:?}"
        );
        let synack = tcp_flags::SYN | tcp_flags::ACK;
        let back_a = send(&fx, hook, a.reversed(), synack);
        assert_eq!(back_a, first.reversed(), "{hook:?}: the first flow's reply");
        assert_ne!(
            b.sport, a.sport,
            "{hook:?}: the second flow needs a reply tuple of its own"
        );
        assert!(
            (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&b.sport),
            "{hook:?}: {b}"
        );
        let back_b = send(&fx, hook, b.reversed(), synack);
        assert_eq!(
            back_b,
            second.reversed(),
            "{hook:?}: the second flow's reply"
        );
        // Both stay on their own tuples.
        assert_eq!(send(&fx, hook, first, tcp_flags::ACK), a, "{hook:?}");
        assert_eq!(send(&fx, hook, second, tcp_flags::ACK), b, "{hook:?}");
    }
}

/// As the fuzzer found it (xdp_from_netdev run #2798, then tc_from_pod and
/// tc_from_netdev): a pod of this node to the cluster IP, then from the
/// same port to the LB IP of an externalTrafficPolicy Local service (a
/// local client short-circuits the policy, unmasqueraded).
#[test]
fn regression_a_pod_port_to_the_cluster_ip_and_lb_ip_of_one_service() {
    let specs = [Spec {
        node_port: Some(30083),
        lb_ip: Some(LOCAL_LB_IP),
        etp_local: true,
        ..Spec::cluster_ip(
            "local",
            Protocol::Tcp,
            LOCAL_VIP,
            80,
            &[(REMOTE_A, 9090, false)],
        )
    }];
    let first = Tuple {
        src: LOCAL_POD,
        sport: 40038,
        dst: LOCAL_VIP,
        dport: 80,
        proto: proto::TCP,
    };
    let second = Tuple {
        dst: LOCAL_LB_IP,
        ..first
    };
    one_client_port_two_frontends(&specs, first, second);
}

/// The everyday form: two Services selecting the same pods, a pod
/// reaching both from one source port.
#[test]
fn regression_a_pod_port_to_two_services_on_one_endpoint() {
    const ENDPOINT: &[(Ipv4Addr, u16, bool)] = &[(LOCAL_A, 8080, true)];
    const WEB: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 20);
    const ALIAS: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 21);
    let specs = [
        Spec::cluster_ip("web", Protocol::Tcp, WEB, 80, ENDPOINT),
        Spec::cluster_ip("web-alias", Protocol::Tcp, ALIAS, 80, ENDPOINT),
    ];
    let first = Tuple {
        src: LOCAL_POD,
        sport: 40000,
        dst: WEB,
        dport: 80,
        proto: proto::TCP,
    };
    let second = Tuple {
        dst: ALIAS,
        ..first
    };
    one_client_port_two_frontends(&specs, first, second);
}

/// Found by the fuzzer in CI: an IPv6 frame whose SCTP header stops inside
/// its first chunk header; the datapath drops it as malformed, which the
/// oracle must allow (it once took SCTP for a protocol nobody parses).
#[test]
fn regression_truncated_ipv6_sctp_may_be_dropped() {
    let hex = "dcd5adbc99e5b592b9d4f7a986dd62e69a9419e08404b1501d8d4c85a2e8b1c122aee4377f917679f48f0355a2b2602853165e51a7cb74412bbf39dd5f0dfd63209d9f39db";
    let frame: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(frame[20], SCTP, "next header");
    assert!(Shape::of::<Ipv4>(&frame).malformed());
    assert_eq!(Shape::of::<Ipv6>(&frame), Shape::L4Truncated);
    // The same frame with its chunk header whole is not malformed.
    let mut whole = frame.clone();
    whole.extend_from_slice(&[0, 0]);
    whole[18..20].copy_from_slice(&16u16.to_be_bytes());
    assert!(!Shape::of::<Ipv4>(&whole).malformed());
}

/// Found by the fuzzer in CI (tc_from_netdev #19213, tc_from_pod #19514):
/// SCTP to port 80 of a cluster IP whose ports serve only TCP and UDP is
/// rejected, as upstream's `cluster-ips` reject rule does for any protocol;
/// the oracle once required every SCTP packet to pass untouched. Elsewhere
/// SCTP still passes untouched.
#[test]
fn regression_sctp_to_an_unserved_cluster_ip_port_is_rejected() {
    let world = World::<Ipv4>::new();
    let fx = Fixture::new::<Ipv4>(1 << 12, &world.specs);
    let mut oracle = Oracle::new(&world);
    let to = |dst: Ipv4Addr| {
        Frame {
            src: Ipv4Addr::new(198, 18, 9, 9).into(),
            dst: dst.into(),
            sport: 40039,
            dport: 80,
            proto: proto::SCTP,
        }
        .build(&[])
    };
    let to_vip = to(EMPTY_VIP);
    let elsewhere = to(Ipv4Addr::new(198, 18, 200, 1));
    for (index, hook) in [Hook::FromPod, Hook::FromNetdev, Hook::Xdp]
        .into_iter()
        .enumerate()
    {
        for pkt in [&to_vip, &elsewhere] {
            oracle.run(&fx, hook, index as u64, Class::ToFrontend, pkt);
        }
    }
    let violations: Vec<String> = oracle.violations.iter().map(|v| v.what.clone()).collect();
    assert!(violations.is_empty(), "{violations:#?}");
    let r = |k| oracle.stats.results.get(&k).copied().unwrap_or(0);
    // tc_from_pod, tc_from_netdev, and tc_from_netdev after XDP_PASS.
    assert_eq!(
        r(Judged::Rejected)
            + oracle
                .stats
                .followup_results
                .get(&Judged::Rejected)
                .copied()
                .unwrap_or(0),
        3
    );
    // XDP passes both up; TC passes the one for no cluster IP.
    assert_eq!(r(Judged::Passed), 4);
}

/// Found by the fuzzer (IPv6, tc_from_pod and tc_from_netdev): a service
/// packet whose extension headers put L4 past what the rewrite reaches
/// (1 KiB) opened a flow, then was dropped as malformed; its flow's later
/// packets and replies went wrong. Now it is passed on untouched, as
/// headers the datapath does not walk are; with short headers the same
/// packet is translated.
#[test]
fn ipv6_headers_too_long_to_rewrite_behind_pass_untouched_and_open_no_flow() {
    let world = World::<Ipv6>::new();
    let fx = Fixture::new::<Ipv6>(1 << 12, &world.specs);
    let mut oracle = Oracle::new(&world);
    let web = &world.specs[0];
    let syn = |units: usize| {
        let mut pkt = Frame {
            src: Ipv6::NET.local_pod.into(),
            dst: web.vip.into(),
            sport: 40100,
            dport: web.port,
            proto: proto::TCP,
        }
        .build(b"q");
        let header = v6::options_header(&mut Rng::new(1), units);
        v6::push_header(&mut pkt, v6::ext::DEST_OPTS, header);
        packet::fix_checksums(&mut pkt);
        pkt
    };
    let (long, short) = (syn(128), syn(1));
    assert!(long.len() > 1024 + 20 && long.len() < 1600);
    for hook in [Hook::FromPod, Hook::FromNetdev, Hook::Xdp] {
        oracle.run(&fx, hook, 0, Class::ToFrontend, &long);
    }
    let violations: Vec<String> = oracle.violations.iter().map(|v| v.what.clone()).collect();
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(oracle.stats.results.get(&Judged::Passed), Some(&3));
    assert!(oracle.model.forwards.is_empty());
    oracle.run(&fx, Hook::FromPod, 1, Class::ToFrontend, &short);
    assert!(oracle.violations.is_empty());
    assert_eq!(oracle.stats.results.get(&Judged::Forwarded), Some(&1));
}
