//! Maglev consistent hashing in the real programs (BPF_PROG_TEST_RUN), in
//! both families: a new flow goes to the backend the table every node builds
//! gives its tuple's bucket; removing one of 10 backends moves about a tenth
//! of 100,000 flows and, beyond the gone backend's, almost none; two
//! independently started agents (backends given in another order, so other
//! ids and slots) choose alike; a NodePort reaches the same backend through
//! either node for the same client tuple. Needs root.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use proxy_agent::{
    cli::packet::Frame,
    model::{Balancing, DesiredService, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        self, MaglevSettings,
        maglev::{bucket, table},
        node::{NodeAddresses, NodeAddressesOf},
        test_run::Hook::{FromNetdev, FromPod},
    },
};
use proxy_common::{V6, action::TC_ACT_OK, proto};

use crate::tester::{Datapath, in_both_families};

struct Net {
    clients: [IpAddr; 4],
    vip: IpAddr,
    node_a: IpAddr,
    node_b: IpAddr,
    backend_net: fn(u16) -> IpAddr,
}

const fn v6(net: u16, host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net, 0, 0, 0, 0, host))
}

const fn v4(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, c, d))
}

const IPV4: Net = Net {
    clients: [v4(1, 2), v4(1, 3), v4(1, 4), v4(1, 5)],
    vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 40)),
    node_a: v4(0, 10),
    node_b: v4(0, 11),
    backend_net: |i| v4(2, 10 + i as u8),
};

const IPV6: Net = Net {
    clients: [v6(1, 2), v6(1, 3), v6(1, 4), v6(1, 5)],
    vip: v6(0xffff, 0x40),
    node_a: v6(0, 10),
    node_b: v6(0, 11),
    backend_net: |i| v6(2, 10 + i),
};

in_both_families!(
    new_flows_follow_the_table_every_node_builds,
    removing_one_of_ten_backends_moves_a_tenth_of_the_flows_and_independent_agents_agree,
    a_node_port_reaches_the_same_backend_through_every_node,
);

const M: u32 = 16_381;
const TARGET: u16 = 8080;
const NODE_PORT: u16 = 30_040;

fn backends(net: &Net, n: u16) -> Vec<IpAddr> {
    (0..n).map(net.backend_net).collect()
}

fn service(net: &Net, backends: &[IpAddr]) -> DesiredService {
    let name = ServicePortName {
        namespace: "default".into(),
        name: "hashed".into(),
        port_name: "tcp".into(),
        protocol: Protocol::Tcp,
    };
    let endpoints = backends
        .iter()
        .map(|ip| Endpoint {
            is_local: true,
            ..Endpoint::new(*ip, TARGET)
        })
        .collect();
    DesiredService {
        balancing: Balancing::Maglev,
        ..DesiredService::cluster_ip(name, vec![net.vip], 80, endpoints)
    }
}

/// A freshly loaded datapath (an agent started on its own), Maglev tables
/// of `M` buckets, with node address `node`.
fn agent(net: &Net, node: IpAddr, services: Vec<DesiredService>) -> Datapath {
    let sizes = ebpf::MapSizes {
        conntrack: 1 << 18,
        maglev: 4 * proxy_common::maglev::chunks_per_table(M),
        ..ebpf::MapSizes::default()
    };
    let mut dp = Datapath::new(
        ebpf::load_with(sizes).expect("load the eBPF object (are we root?)"),
        0,
        0,
    );
    dp.programmer.set_capacity(dp.maps.capacity());
    dp.programmer.set_maglev(MaglevSettings {
        table_size: M,
        by_default: false,
    });
    let _ = net;
    let mut v4 = NodeAddresses::default();
    let mut v6 = NodeAddressesOf::<V6>::default();
    match node {
        IpAddr::V4(a) => v4.node_ports = vec![a],
        IpAddr::V6(a) => v6.node_ports = vec![a],
    }
    dp.programmer
        .set_node_addresses(&v4, &v6, &Default::default(), &mut dp.maps)
        .unwrap();
    dp.program(services);
    dp
}

/// `n` client tuples: the clients' addresses times consecutive ports.
fn tuples(net: &Net, n: usize) -> Vec<SocketAddr> {
    let per_client = n / net.clients.len();
    net.clients
        .iter()
        .flat_map(|c| (0..per_client).map(move |i| SocketAddr::new(*c, 10_000 + i as u16)))
        .collect()
}

/// The backend each tuple's new connection to `dst:dport` reached.
fn reached(
    dp: &Datapath,
    hook: ebpf::test_run::Hook,
    tuples: &[SocketAddr],
    dst: IpAddr,
    dport: u16,
) -> Vec<IpAddr> {
    tuples
        .iter()
        .map(|c| {
            let out = dp.run(hook, &Frame::tcp(c.ip(), c.port(), dst, dport).build(b""));
            assert_eq!(out.verdict, TC_ACT_OK, "{c} -> {dst}:{dport}");
            let f = Frame::parse(&out.packet).unwrap();
            assert_eq!(f.dport, TARGET);
            f.dst
        })
        .collect()
}

fn new_flows_follow_the_table_every_node_builds(net: &Net) {
    let all = backends(net, 10);
    let dp = agent(net, net.node_a, vec![service(net, &all)]);
    let flows = tuples(net, 4_000);
    let got = reached(&dp, FromPod, &flows, net.vip, 80);

    // What an independent implementation of the paper says: the table over
    // the backends' names, and the bucket of the client tuple.
    let names: Vec<String> = all
        .iter()
        .map(|ip| SocketAddr::new(*ip, TARGET).to_string())
        .collect();
    let entries = table(&names, M);
    for (client, backend) in flows.iter().zip(&got) {
        let b = bucket(*client, 80, proto::TCP, M);
        assert_eq!(
            *backend, all[entries[b as usize] as usize],
            "{client}: bucket {b}"
        );
    }
    // Spread: every backend serves a tenth, give or take.
    for ip in &all {
        let share = got.iter().filter(|b| *b == ip).count() as f64 / got.len() as f64;
        assert!((0.07..0.13).contains(&share), "{ip}: {share}");
    }
}

fn removing_one_of_ten_backends_moves_a_tenth_of_the_flows_and_independent_agents_agree(net: &Net) {
    let all = backends(net, 10);
    let gone = all[3];
    let rest: Vec<IpAddr> = all.iter().copied().filter(|b| *b != gone).collect();
    let flows = tuples(net, 100_000);

    let before = reached(
        &agent(net, net.node_a, vec![service(net, &all)]),
        FromPod,
        &flows,
        net.vip,
        80,
    );

    // Another agent, the backends listed the other way round: its ids and
    // slots differ, its choices do not.
    let mut reversed = all.clone();
    reversed.reverse();
    let other = reached(
        &agent(net, net.node_b, vec![service(net, &reversed)]),
        FromPod,
        &flows,
        net.vip,
        80,
    );
    assert!(
        before == other,
        "two agents disagree on some of 100,000 flows"
    );

    // One backend leaves: programmed over the first agent's maps, as a sync does.
    let mut dp = agent(net, net.node_a, vec![service(net, &all)]);
    dp.program(vec![service(net, &rest)]);
    let after = reached(&dp, FromPod, &flows, net.vip, 80);

    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let of_gone = before.iter().filter(|b| **b == gone).count();
    assert!(after.iter().all(|a| *a != gone));
    let share = moved as f64 / flows.len() as f64;
    let collateral = (moved - of_gone) as f64 / flows.len() as f64;
    eprintln!(
        "maglev remap: {moved} of {} flows moved ({:.2}%), {of_gone} were on the gone backend, collateral {:.2}%",
        flows.len(),
        share * 100.0,
        collateral * 100.0
    );
    assert!((0.08..0.13).contains(&share), "{share}");
    assert!(collateral < 0.02, "{collateral}");
}

fn a_node_port_reaches_the_same_backend_through_every_node(net: &Net) {
    let all = backends(net, 5);
    let svc = DesiredService {
        node_port: Some(NODE_PORT),
        external_policy_local: true,
        local_endpoints: service(net, &all).cluster_endpoints,
        ..service(net, &all)
    };
    let flows = tuples(net, 400);
    let a = reached(
        &agent(net, net.node_a, vec![svc.clone()]),
        FromNetdev,
        &flows,
        net.node_a,
        NODE_PORT,
    );
    let b = reached(
        &agent(net, net.node_b, vec![svc]),
        FromNetdev,
        &flows,
        net.node_b,
        NODE_PORT,
    );
    assert!(a == b, "the nodes chose differently");
    assert!(
        all.iter().all(|ip| a.contains(ip)),
        "some backend never chosen"
    );
}
