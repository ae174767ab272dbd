//! A cold start's first sync writes frontends and backends in batches
//! (`KernelMaps::defer_writes`): the maps end up as one write at a time
//! leaves them, nothing held back reaches them before its batch or after a
//! delete, and a batch the map cannot take fails naming it.

use std::net::IpAddr;

use aya::maps::{HashMap, Map, MapData};
use ipnet::IpNet;
use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, NodeModel, Protocol, ServicePortName},
    modes::ebpf::{
        self, EbpfNodeSettings, EbpfProxier, KernelMaps, MapError, MapSizes, Programmer,
        ServiceMaps,
    },
    options::{Environment, Parsed, ProxyMode, mode::FixedSupport, parse},
    sync::{Proxier as _, SyncChanges},
};
use proxy_common::{Backend, ServiceKey, ServiceValue, V4, V6};

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "batched".into(),
        name: name.into(),
        port_name: "p".into(),
        protocol,
    }
}

/// Both families, several frontend kinds, source ranges, shared backends.
fn state() -> DesiredState {
    state_of(300, 100)
}

/// `v4` IPv4 service ports (every tenth with external and LB IPs) and `v6` IPv6 ones.
fn state_of(v4: u32, v6: u16) -> DesiredState {
    let mut services = Vec::new();
    for i in 0..v4 {
        let vip = IpAddr::from([198, 19, (i / 250) as u8, (i % 250) as u8 + 1]);
        let endpoints = (0..3)
            .map(|e| Endpoint::new(IpAddr::from([198, 18, (i % 200) as u8, e + 1]), 8080))
            .collect();
        let mut svc = DesiredService::cluster_ip(
            spn(&format!("v4-{i}"), Protocol::Tcp),
            vec![vip],
            80,
            endpoints,
        );
        if i % 10 == 0 {
            svc.external_ips = vec![IpAddr::from([198, 18, 250, (i / 10) as u8 + 1])];
            svc.load_balancer_ips = vec![IpAddr::from([198, 18, 251, (i / 10) as u8 + 1])];
            svc.load_balancer_source_ranges = vec!["198.18.128.0/18".parse::<IpNet>().unwrap()];
        }
        services.push(svc);
    }
    for i in 0..v6 {
        let vip: IpAddr = format!("2001:db8:5::{:x}", i + 1).parse().unwrap();
        let endpoints = (0..2u16)
            .map(|e| {
                Endpoint::new(
                    format!("2001:db8:6::{:x}:{:x}", i + 1, e + 1)
                        .parse()
                        .unwrap(),
                    53,
                )
            })
            .collect();
        services.push(DesiredService::cluster_ip(
            spn(&format!("v6-{i}"), Protocol::Udp),
            vec![vip],
            53,
            endpoints,
        ));
    }
    DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    }
}

fn fresh_maps(sizes: MapSizes) -> (aya::Ebpf, KernelMaps) {
    let mut object = ebpf::load_with(sizes).expect("loading the object");
    let (maps, _stats) = KernelMaps::take(&mut object).unwrap();
    (object, maps)
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// Every frontend, slot and backend of both families, in a stable order.
fn contents(maps: &mut KernelMaps) -> Vec<String> {
    let v4 = maps.service_snapshot::<V4>().unwrap();
    let v6 = maps.service_snapshot::<V6>().unwrap();
    let mut all: Vec<String> = Vec::new();
    all.extend(v4.services.iter().map(|(k, v)| format!("{k:?} => {v:?}")));
    all.extend(v4.backends.iter().map(|(k, v)| format!("{k} => {v:?}")));
    all.extend(
        v4.source_ranges
            .iter()
            .map(|(id, net)| format!("range {id} {net}")),
    );
    all.extend(v6.services.iter().map(|(k, v)| format!("{k:?} => {v:?}")));
    all.extend(v6.backends.iter().map(|(k, v)| format!("{k} => {v:?}")));
    sorted(all)
}

#[test]
fn a_batched_sync_leaves_the_maps_as_writes_one_at_a_time_do() {
    let state = state();
    let (_a, mut one_by_one) = fresh_maps(MapSizes::default());
    Programmer::new().sync(&state, &mut one_by_one).unwrap();

    let (_b, mut batched) = fresh_maps(MapSizes::default());
    batched.defer_writes();
    Programmer::new().sync(&state, &mut batched).unwrap();
    let held = contents(&mut batched);
    assert!(
        !held.iter().any(|e| e.contains("ServiceKey")),
        "no frontend reached the maps before its batch"
    );
    let written = batched.write_deferred().unwrap();

    let expected = contents(&mut one_by_one);
    let frontends_and_backends = expected.iter().filter(|e| !e.starts_with("range")).count();
    assert!(
        frontends_and_backends > 1_000,
        "a state worth batching: {frontends_and_backends}"
    );
    assert!(
        written > 900,
        "the writes were held back and batched: {written}"
    );
    assert_eq!(contents(&mut batched), expected);
    // Holding back ended with the batch: the next write goes straight in.
    let later = Backend {
        addr_be: u32::from_be_bytes([198, 18, 252, 1]).to_be(),
        port_be: 80u16.to_be(),
        proto: 6,
        flags: 0,
    };
    ServiceMaps::<V4>::put_backend(&mut batched, 999_999, &later).unwrap();
    assert!(
        contents(&mut batched)
            .iter()
            .any(|e| e.starts_with("999999 =>"))
    );
}

fn backend(n: u8) -> Backend {
    Backend {
        addr_be: u32::from_be_bytes([198, 18, 253, n]).to_be(),
        port_be: 8080u16.to_be(),
        proto: 6,
        flags: 0,
    }
}

fn frontend(n: u8) -> ServiceKey {
    ServiceKey::frontend(
        u32::from_be_bytes([198, 19, 253, n]).to_be(),
        80u16.to_be(),
        6,
    )
}

#[test]
fn a_delete_writes_what_is_held_back_before_it() {
    let (_o, mut maps) = fresh_maps(MapSizes::default());
    ServiceMaps::<V4>::put_service(&mut maps, &frontend(9), &ServiceValue::default()).unwrap();
    maps.defer_writes();
    ServiceMaps::<V4>::put_backend(&mut maps, 1, &backend(1)).unwrap();
    ServiceMaps::<V4>::put_service(&mut maps, &frontend(1), &ServiceValue::default()).unwrap();
    assert!(maps.backends.get(&1, 0).is_err(), "held back");

    ServiceMaps::<V4>::delete_service(&mut maps, &frontend(9)).unwrap();
    assert!(
        maps.backends.get(&1, 0).is_ok(),
        "written before the delete"
    );
    assert!(maps.services.get(&frontend(1), 0).is_ok());
    assert!(maps.services.get(&frontend(9), 0).is_err());

    // Still holding back after the delete.
    ServiceMaps::<V4>::put_backend(&mut maps, 2, &backend(2)).unwrap();
    assert!(maps.backends.get(&2, 0).is_err());
    assert_eq!(maps.write_deferred().unwrap(), 1);
    assert!(maps.backends.get(&2, 0).is_ok());
}

#[test]
fn a_batch_the_map_cannot_hold_fails_naming_the_map() {
    let (_o, mut maps) = fresh_maps(MapSizes {
        services: 8,
        ..MapSizes::default()
    });
    maps.defer_writes();
    for n in 1..=20 {
        ServiceMaps::<V4>::put_service(&mut maps, &frontend(n), &ServiceValue::default()).unwrap();
    }
    let error = maps.write_deferred().unwrap_err();
    assert!(
        matches!(error, MapError::Write { map, .. } if map == proxy_common::maps::SERVICES),
        "{error}"
    );
    assert!(error.to_string().contains("SERVICES"), "{error}");
    // Nothing is held back any more.
    assert_eq!(maps.write_deferred().unwrap(), 0);
}

fn settings() -> EbpfNodeSettings {
    let support = FixedSupport {
        supported: vec![ProxyMode::Ebpf],
    };
    let env = Environment {
        support: &support,
        hostname: Some("node-a".into()),
    };
    match parse(["kube-proxy", "--proxy-mode", "ebpf"], &env).unwrap() {
        Parsed::Run(opts) => EbpfNodeSettings::from_options(&opts),
        other => panic!("unexpected {other:?}"),
    }
}

/// The entries of the IPv4 service map whose id is `id`, through a handle of its own.
fn services_in(id: u32) -> usize {
    let map = Map::HashMap(MapData::from_id(id).unwrap());
    let services: HashMap<_, ServiceKey, ServiceValue> = HashMap::try_from(&map).unwrap();
    services.keys().count()
}

/// The first sync (the batched one) failing leaves the proxier able to
/// program the next state exactly. (A batch failing half-way, after which
/// the proxier takes over what the maps hold, cannot be provoked here: the
/// capacity check refuses a state that would not fit before anything is
/// written.)
#[test]
fn a_first_sync_that_fails_leaves_the_next_to_program_the_state() {
    use aya::maps::IterableMap as _;
    let (_o, maps) = fresh_maps(MapSizes {
        services: 64,
        ..MapSizes::default()
    });
    let services_id = maps.services.map().info().unwrap().id();
    let mut proxier = EbpfProxier::new(maps, settings(), &NodeModel::default()).unwrap();
    let full = SyncChanges {
        full: true,
        ..SyncChanges::default()
    };
    // More frontends than the map holds: the first (batched) sync fails.
    let error = proxier.sync(&state_of(100, 0), &full).unwrap_err();
    assert!(error.to_string().contains("SERVICES"), "{error}");
    // The next takes over what the maps hold and programs what fits.
    proxier.sync(&state_of(10, 0), &full).unwrap();
    // 10 cluster IPs, service 0's external and LB IPs, a marker per cluster IP.
    assert_eq!(services_in(services_id), 10 + 2 + 10);
    // And a later change goes straight in (services 10 and 11, 10 with
    // its external and LB IPs).
    proxier.sync(&state_of(12, 0), &full).unwrap();
    assert_eq!(services_in(services_id), 12 + 4 + 12);
}
