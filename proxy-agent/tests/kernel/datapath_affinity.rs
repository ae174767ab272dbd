//! `sessionAffinity: ClientIP` in the real programs (BPF_PROG_TEST_RUN), in
//! both families: every new connection of a client goes to the backend its
//! previous one went to until the timeout passes without one; another
//! client is balanced on its own; a backend that leaves releases its
//! clients; switching affinity off and on takes effect at the next sync.
//! Needs root.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use proxy_agent::{
    cli::packet::Frame,
    model::{DesiredService, Endpoint, Protocol, ServicePortName, SessionAffinity},
    modes::ebpf::{self, test_run::Hook::FromPod},
};
use proxy_common::{Counter, action::TC_ACT_OK};

use crate::tester::{Datapath, in_both_families};

struct Net {
    client: IpAddr,
    other_client: IpAddr,
    vip: IpAddr,
    backends: [IpAddr; 3],
}

const fn v4(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, c, d))
}

const fn v6(net: u16, host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net, 0, 0, 0, 0, host))
}

const IPV4: Net = Net {
    client: v4(1, 2),
    other_client: v4(1, 3),
    vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 30)),
    backends: [v4(2, 2), v4(2, 3), v4(2, 4)],
};

const IPV6: Net = Net {
    client: v6(1, 2),
    other_client: v6(1, 3),
    vip: v6(0xffff, 0x30),
    backends: [v6(2, 2), v6(2, 3), v6(2, 4)],
};

in_both_families!(
    each_client_is_pinned_to_one_backend_until_its_timeout_passes,
    a_backend_that_leaves_releases_its_clients,
    switching_affinity_off_and_on_takes_effect,
);

const TARGET: u16 = 8080;

/// The service port `VIP:80/TCP` on `backends`, with `affinity`.
fn service(net: &Net, backends: &[IpAddr], affinity: SessionAffinity) -> DesiredService {
    let name = ServicePortName {
        namespace: "default".into(),
        name: "sticky".into(),
        port_name: "tcp".into(),
        protocol: Protocol::Tcp,
    };
    let endpoints = backends
        .iter()
        .map(|ip| Endpoint::new(*ip, TARGET))
        .collect();
    DesiredService {
        session_affinity: affinity,
        ..DesiredService::cluster_ip(name, vec![net.vip], 80, endpoints)
    }
}

fn client_ip(timeout_seconds: u32) -> SessionAffinity {
    SessionAffinity::ClientIp { timeout_seconds }
}

/// The backends `n` new connections of `client` (fresh source ports from
/// `first_port`) reached.
fn connect(dp: &Datapath, net: &Net, client: IpAddr, first_port: u16, n: u16) -> Vec<IpAddr> {
    (first_port..first_port + n)
        .map(|sport| {
            let out = dp.run(FromPod, &Frame::tcp(client, sport, net.vip, 80).build(b""));
            assert_eq!(out.verdict, TC_ACT_OK);
            let f = Frame::parse(&out.packet).unwrap();
            assert_eq!(f.dport, TARGET);
            f.dst
        })
        .collect()
}

fn distinct(backends: &[IpAddr]) -> BTreeSet<IpAddr> {
    backends.iter().copied().collect()
}

fn datapath(net: &Net, affinity: SessionAffinity) -> Datapath {
    let mut dp = Datapath::new(
        ebpf::load().expect("load the eBPF object (are we root?)"),
        0,
        0,
    );
    dp.program(vec![service(net, &net.backends, affinity)]);
    dp
}

fn each_client_is_pinned_to_one_backend_until_its_timeout_passes(net: &Net) {
    let dp = datapath(net, client_ip(1));
    // upstream's e2e: 15 consecutive requests reach one backend.
    let first = connect(&dp, net, net.client, 40000, 15);
    assert_eq!(distinct(&first).len(), 1, "{first:?}");
    assert_eq!(dp.counter(Counter::AffinityHit), 14);
    assert_eq!(dp.counter(Counter::NewFlow), 15);

    // Another client is balanced on its own, then pinned too.
    let other = connect(&dp, net, net.other_client, 41000, 15);
    assert_eq!(distinct(&other).len(), 1, "{other:?}");
    assert_eq!(dp.counter(Counter::AffinityHit), 28);

    // Connections keep the pin alive (each refreshes it) ...
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(
            connect(&dp, net, net.client, 42000 + round * 10, 1),
            [first[0]],
            "within the timeout of the last connection"
        );
    }
    assert_eq!(dp.counter(Counter::AffinityHit), 31);
    // ... and once the timeout passes without one, the client is balanced anew.
    std::thread::sleep(Duration::from_millis(1_200));
    connect(&dp, net, net.client, 43000, 1);
    assert_eq!(
        dp.counter(Counter::AffinityHit),
        31,
        "expired: chosen again"
    );
    connect(&dp, net, net.client, 43001, 1);
    assert_eq!(dp.counter(Counter::AffinityHit), 32, "and pinned again");
}

fn a_backend_that_leaves_releases_its_clients(net: &Net) {
    let mut dp = datapath(net, client_ip(10_800));
    let pinned = connect(&dp, net, net.client, 40000, 3)[0];
    let rest: Vec<IpAddr> = net
        .backends
        .iter()
        .copied()
        .filter(|b| *b != pinned)
        .collect();
    dp.program(vec![service(net, &rest, client_ip(10_800))]);
    let hits = dp.counter(Counter::AffinityHit);
    let after = connect(&dp, net, net.client, 41000, 10);
    assert!(!after.contains(&pinned), "{pinned} left: {after:?}");
    assert_eq!(
        distinct(&after).len(),
        1,
        "pinned to one of the others: {after:?}"
    );
    assert_eq!(dp.counter(Counter::AffinityHit), hits + 9);
}

fn switching_affinity_off_and_on_takes_effect(net: &Net) {
    let mut dp = datapath(net, client_ip(10_800));
    assert_eq!(distinct(&connect(&dp, net, net.client, 40000, 15)).len(), 1);
    dp.program(vec![service(net, &net.backends, SessionAffinity::None)]);
    let hits = dp.counter(Counter::AffinityHit);
    let spread = connect(&dp, net, net.client, 41000, 60);
    assert!(distinct(&spread).len() >= 2, "balanced again: {spread:?}");
    assert_eq!(dp.counter(Counter::AffinityHit), hits);
    dp.program(vec![service(net, &net.backends, client_ip(10_800))]);
    let again = connect(&dp, net, net.client, 42000, 15);
    assert_eq!(distinct(&again).len(), 1, "pinned again: {again:?}");
}
