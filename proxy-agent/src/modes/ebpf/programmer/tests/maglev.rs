//! Maglev tables as the programmer writes them.

use proxy_common::maglev::{MAGLEV_SLOT, chunks_per_table, locate};

use super::*;
use crate::model::Balancing;
use crate::modes::ebpf::maglev::table;

const M: u32 = 251;

fn settings(by_default: bool) -> MaglevSettings {
    MaglevSettings {
        table_size: M,
        by_default,
    }
}

fn backends(n: u8) -> Vec<Endpoint> {
    (0..n).map(|i| ep([198, 18, 2, 10 + i], 8080)).collect()
}

fn maglev_service(name: &str, eps: Vec<Endpoint>) -> DesiredService {
    DesiredService {
        balancing: Balancing::Maglev,
        ..external_service(name, Protocol::Tcp, eps, Vec::new(), false)
    }
}

fn programmer_with_tables(maps: &mut FakeMaps, tables: u32) -> Programmer {
    let mut p = Programmer::new();
    p.set_capacity(Capacity {
        services: 1 << 16,
        backends: 1 << 16,
        maglev_chunks: tables * chunks_per_table(M),
        slots: 1 << 16,
    });
    p.set_maglev(settings(false));
    p.set_node_addresses(&node(&[NODE_A, NODE_B]), &DesiredState::default(), maps)
        .unwrap();
    p
}

/// What the frontend at `key` balances bucket `b` to, as the datapath reads
/// the maps: its table's slot, then that slot's backend.
fn bucket_backends(maps: &FakeMaps, key: ServiceKey) -> Vec<String> {
    let (first, m) = maps.services[&key.with_slot(MAGLEV_SLOT)].maglev_table();
    assert_eq!(m, M);
    (0..m)
        .map(|b| {
            let (element, at) = locate(first, b);
            let slot = maps.maglev[&element].slots[at];
            let id = maps.services[&key.with_slot(slot)].backend_id;
            let backend = maps.backends[&id];
            socket_addr::<V4>(backend.addr_be, backend.port_be).to_string()
        })
        .collect()
}

/// The table every node builds for `eps`, by backend name.
fn expected(eps: &[Endpoint]) -> Vec<String> {
    let names: Vec<String> = eps
        .iter()
        .map(|e| std::net::SocketAddr::new(e.ip, e.port).to_string())
        .collect();
    table(&names, M)
        .into_iter()
        .map(|i| names[i as usize].clone())
        .collect()
}

#[test]
fn every_frontend_balances_by_the_table_of_its_endpoint_set() {
    let mut maps = FakeMaps::default();
    let mut p = programmer_with_tables(&mut maps, 4);
    let eps = backends(10);
    p.sync(&state(vec![maglev_service("web", eps.clone())]), &mut maps)
        .unwrap();

    let frontends = [
        key(VIP, 80, proto::TCP),
        key(NODE_A, NODE_PORT, proto::TCP),
        key(NODE_B, NODE_PORT, proto::TCP),
        key(EXTERNAL_IP, 80, proto::TCP),
        key(LB_IP, 80, proto::TCP),
    ];
    for k in frontends {
        assert!(maps.services[&k].has(flags::MAGLEV), "{k:?}");
        assert_eq!(bucket_backends(&maps, k), expected(&eps), "{k:?}");
    }
    let refs: BTreeSet<(u32, u32)> = frontends
        .iter()
        .map(|k| maps.services[&k.with_slot(MAGLEV_SLOT)].maglev_table())
        .collect();
    // The cluster IP's set (internal policy) and the external frontends' set.
    assert_eq!(refs.len(), 2, "{refs:?}");
}

#[test]
fn a_backend_leaving_rewrites_only_the_elements_whose_buckets_change() {
    let mut maps = FakeMaps::default();
    let mut p = programmer_with_tables(&mut maps, 4);
    let eps = backends(10);
    let first = p
        .sync(&state(vec![maglev_service("web", eps.clone())]), &mut maps)
        .unwrap();
    let per_table = chunks_per_table(M) as usize;
    assert_eq!(first.maglev_elements, 2 * per_table);

    let fewer: Vec<Endpoint> = eps
        .iter()
        .filter(|e| e.port != 0)
        .skip(1)
        .cloned()
        .collect();
    let before = bucket_backends(&maps, key(VIP, 80, proto::TCP));
    let stats = p
        .sync(
            &state(vec![maglev_service("web", fewer.clone())]),
            &mut maps,
        )
        .unwrap();
    let after = bucket_backends(&maps, key(VIP, 80, proto::TCP));
    assert_eq!(after, expected(&fewer));
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    // The gone backend's buckets move, and those of the backend that took
    // its slot are renumbered: both in at most one element per bucket.
    assert!(stats.maglev_elements > 0);
    assert!(
        stats.maglev_elements < 2 * per_table,
        "{} elements rewritten for {moved} moved buckets",
        stats.maglev_elements
    );
}

#[test]
fn switching_maglev_off_removes_the_table_reference_and_frees_the_table() {
    let mut maps = FakeMaps::default();
    // Room for one service's two tables only.
    let mut p = programmer_with_tables(&mut maps, 2);
    let web = maglev_service("web", backends(3));
    p.sync(&state(vec![web.clone()]), &mut maps).unwrap();

    let random = DesiredService {
        balancing: Balancing::Random,
        ..web.clone()
    };
    let other = DesiredService {
        cluster_ips: vec![IpAddr::V4([198, 19, 0, 11].into())],
        node_port: Some(30081),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        ..maglev_service("other", backends(4))
    };
    p.sync(&state(vec![random, other.clone()]), &mut maps)
        .unwrap();
    let vip = key(VIP, 80, proto::TCP);
    assert!(!maps.services[&vip].has(flags::MAGLEV));
    assert!(!maps.services.contains_key(&vip.with_slot(MAGLEV_SLOT)));
    // The freed tables serve the other service.
    let other_vip = key([198, 19, 0, 11], 80, proto::TCP);
    assert!(maps.services[&other_vip].has(flags::MAGLEV));
    assert_eq!(bucket_backends(&maps, other_vip), expected(&backends(4)));

    // Back on: no table is left, so the service is balanced at random.
    p.sync(&state(vec![web, other]), &mut maps).unwrap();
    assert!(!maps.services[&vip].has(flags::MAGLEV));
}

#[test]
fn the_configured_algorithm_applies_to_services_without_the_annotation() {
    let mut maps = FakeMaps::default();
    let mut p = programmer_with_tables(&mut maps, 4);
    p.set_maglev(settings(true));
    let plain = service("plain", VIP, 80, Protocol::Tcp, backends(3));
    let opted_out = DesiredService {
        balancing: Balancing::Random,
        ..service("random", [198, 19, 0, 11], 80, Protocol::Tcp, backends(3))
    };
    p.sync(&state(vec![plain, opted_out]), &mut maps).unwrap();
    assert!(maps.services[&key(VIP, 80, proto::TCP)].has(flags::MAGLEV));
    assert!(!maps.services[&key([198, 19, 0, 11], 80, proto::TCP)].has(flags::MAGLEV));
}

#[test]
fn an_adopting_programmer_keeps_the_tables_and_their_references() {
    let mut maps = FakeMaps::default();
    let mut first = programmer_with_tables(&mut maps, 4);
    let s = state(vec![maglev_service("web", backends(5))]);
    first.sync(&s, &mut maps).unwrap();
    let services = maps.services.clone();
    let tables = maps.maglev.clone();

    let mut second = Programmer::new();
    second.set_capacity(Capacity {
        services: 1 << 16,
        backends: 1 << 16,
        maglev_chunks: 4 * chunks_per_table(M),
        slots: 1 << 16,
    });
    second.set_maglev(settings(false));
    second.adopt(&snapshot(&maps), &s, &node(&[NODE_A, NODE_B]));
    let stats = second.sync(&s, &mut maps).unwrap();
    // The tables are rewritten once (the agent does not read them back),
    // with the same contents; no service entry changes.
    assert_eq!(stats.writes, 0, "{:?}", maps.touched);
    assert_eq!(maps.services, services);
    assert_eq!(maps.maglev, tables);
}

#[test]
fn slots_left_free_are_taken_by_the_last_backends() {
    assert_eq!(stable_slots(&[1, 2, 3, 4, 5], &[1, 3, 4, 5]), [1, 5, 3, 4]);
    assert_eq!(
        stable_slots(&[1, 2, 3, 4, 5], &[1, 3, 4, 5, 6]),
        [1, 6, 3, 4, 5]
    );
    assert_eq!(stable_slots(&[1, 2, 3], &[3]), [3]);
    assert_eq!(stable_slots(&[1, 2, 3], &[]), Vec::<BackendId>::new());
}
