use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use proxy_common::{CtDirection, CtKey, CtValue};

use super::*;
use crate::model::{DesiredService, Endpoint, Protocol};

/// In-memory maps that also check the datapath invariant on every write:
/// a frontend's `count` never exceeds the slots written, and every slot
/// names a backend that exists.
#[derive(Default)]
struct FakeMaps {
    services: BTreeMap<ServiceKey, ServiceValue>,
    backends: BTreeMap<BackendId, Backend>,
    conntrack: BTreeMap<(u32, u32, u16, u16, u8, u8), CtValue>,
    ops: usize,
    fail_after: Option<usize>,
}

impl FakeMaps {
    fn step(&mut self) -> Result<(), MapError> {
        self.ops += 1;
        if self.fail_after.is_some_and(|n| self.ops > n) {
            return Err(MapError::TooManyBackends { count: 0 });
        }
        Ok(())
    }

    fn check_invariant(&self) {
        for (key, value) in self.services.iter().filter(|(k, _)| k.slot == 0) {
            for slot in 1..=value.count {
                let slot_value = self
                    .services
                    .get(&key.with_slot(slot))
                    .unwrap_or_else(|| panic!("slot {slot} of {key:?} unwritten"));
                assert!(
                    self.backends.contains_key(&slot_value.backend_id),
                    "slot names a missing backend"
                );
            }
        }
    }

    /// VIP (host order) and port -> the backend addresses reachable through it.
    fn reachable(&self, vip: [u8; 4], port: u16, proto: u8) -> Vec<(Ipv4Addr, u16)> {
        let key = ServiceKey::frontend(u32::from(Ipv4Addr::from(vip)).to_be(), port.to_be(), proto);
        let Some(fe) = self.services.get(&key) else {
            return vec![];
        };
        let mut out: Vec<_> = (1..=fe.count)
            .map(|s| {
                let b = self.backends[&self.services[&key.with_slot(s)].backend_id];
                (
                    Ipv4Addr::from(u32::from_be(b.addr_be)),
                    u16::from_be(b.port_be),
                )
            })
            .collect();
        out.sort();
        out
    }
}

impl ServiceMaps for FakeMaps {
    fn put_backend(&mut self, id: BackendId, backend: &Backend) -> Result<(), MapError> {
        self.step()?;
        self.backends.insert(id, *backend);
        Ok(())
    }
    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError> {
        self.step()?;
        self.backends.remove(&id);
        self.check_invariant();
        Ok(())
    }
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.step()?;
        self.services.insert(*key, *value);
        self.check_invariant();
        Ok(())
    }
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        self.step()?;
        self.services.remove(key);
        self.check_invariant();
        Ok(())
    }
    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError> {
        let before = self.conntrack.len();
        self.conntrack.retain(|k, v| {
            let dir = if k.5 == 0 {
                CtDirection::Forward
            } else {
                CtDirection::Reply
            };
            !matches(&CtKey::new(k.0, k.1, k.2, k.3, k.4, dir), v)
        });
        Ok(before - self.conntrack.len())
    }
}

fn ep(ip: [u8; 4], port: u16) -> Endpoint {
    Endpoint::new(IpAddr::V4(ip.into()), port)
}

fn service(
    name: &str,
    vip: [u8; 4],
    port: u16,
    protocol: Protocol,
    eps: Vec<Endpoint>,
) -> DesiredService {
    let name = ServicePortName {
        namespace: "default".into(),
        name: name.into(),
        port_name: String::new(),
        protocol,
    };
    DesiredService::cluster_ip(name, vec![IpAddr::V4(vip.into())], port, eps)
}

fn state(services: Vec<DesiredService>) -> DesiredState {
    DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
    }
}

const VIP: [u8; 4] = [198, 19, 0, 10];
const TCP: u8 = proto::TCP;
const UDP: u8 = proto::UDP;

#[test]
fn programs_frontend_slots_and_backends() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let eps = vec![ep([198, 18, 1, 2], 8080), ep([198, 18, 1, 3], 8080)];
    let stats = p
        .sync(
            &state(vec![service("web", VIP, 80, Protocol::Tcp, eps)]),
            &mut maps,
        )
        .unwrap();
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![
            (Ipv4Addr::new(198, 18, 1, 2), 8080),
            (Ipv4Addr::new(198, 18, 1, 3), 8080)
        ]
    );
    assert_eq!((stats.frontends, stats.backends), (1, 2));
    assert_eq!(maps.services.len(), 3);
}

#[test]
fn second_identical_sync_writes_nothing() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let s = state(vec![service(
        "web",
        VIP,
        80,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
    )]);
    p.sync(&s, &mut maps).unwrap();
    let stats = p.sync(&s, &mut maps).unwrap();
    assert_eq!((stats.writes, stats.deletes), (0, 0));
}

#[test]
fn removing_a_backend_keeps_others_in_place_and_frees_it() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let a = ep([198, 18, 1, 2], 80);
    let b = ep([198, 18, 1, 3], 80);
    let c = ep([198, 18, 1, 4], 80);
    p.sync(
        &state(vec![service(
            "web",
            VIP,
            80,
            Protocol::Tcp,
            vec![a.clone(), b, c.clone()],
        )]),
        &mut maps,
    )
    .unwrap();
    let slot3 = maps.services[&ServiceKey::frontend(
        u32::from(Ipv4Addr::from(VIP)).to_be(),
        80u16.to_be(),
        TCP,
    )
    .with_slot(3)];
    p.sync(
        &state(vec![service("web", VIP, 80, Protocol::Tcp, vec![a, c])]),
        &mut maps,
    )
    .unwrap();
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![
            (Ipv4Addr::new(198, 18, 1, 2), 80),
            (Ipv4Addr::new(198, 18, 1, 4), 80)
        ]
    );
    assert_eq!(maps.backends.len(), 2, "the removed backend is deleted");
    // The backend that sat in slot 3 moved into the freed slot 2; slot 1 was untouched.
    let key = ServiceKey::frontend(u32::from(Ipv4Addr::from(VIP)).to_be(), 80u16.to_be(), TCP);
    assert_eq!(
        maps.services[&key.with_slot(2)].backend_id,
        slot3.backend_id
    );
    assert!(!maps.services.contains_key(&key.with_slot(3)));
}

#[test]
fn removed_service_leaves_no_entries() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    p.sync(
        &state(vec![service(
            "web",
            VIP,
            80,
            Protocol::Tcp,
            vec![ep([198, 18, 1, 2], 80)],
        )]),
        &mut maps,
    )
    .unwrap();
    p.sync(&DesiredState::default(), &mut maps).unwrap();
    assert!(maps.services.is_empty());
    assert!(maps.backends.is_empty());
}

#[test]
fn backends_are_shared_between_services() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let e = ep([198, 18, 1, 2], 80);
    let s1 = service("a", VIP, 80, Protocol::Tcp, vec![e.clone()]);
    let s2 = service("b", [198, 19, 0, 11], 80, Protocol::Tcp, vec![e]);
    p.sync(&state(vec![s1.clone(), s2]), &mut maps).unwrap();
    assert_eq!(maps.backends.len(), 1);
    p.sync(&state(vec![s1]), &mut maps).unwrap();
    assert_eq!(maps.backends.len(), 1, "still used by service a");
}

#[test]
fn service_without_endpoints_has_count_zero() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    p.sync(
        &state(vec![service("web", VIP, 80, Protocol::Tcp, vec![])]),
        &mut maps,
    )
    .unwrap();
    let key = ServiceKey::frontend(u32::from(Ipv4Addr::from(VIP)).to_be(), 80u16.to_be(), TCP);
    assert_eq!(maps.services[&key].count, 0);
}

#[test]
fn ipv6_addresses_are_not_programmed_in_the_ipv4_maps() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let mut s = service("web", VIP, 80, Protocol::Tcp, vec![ep([198, 18, 1, 2], 80)]);
    s.cluster_ips.push("2001:db8::10".parse().unwrap());
    s.cluster_endpoints.push(Endpoint {
        ip: "2001:db8::2".parse().unwrap(),
        ..ep([0, 0, 0, 0], 80)
    });
    p.sync(&state(vec![s]), &mut maps).unwrap();
    assert_eq!(maps.services.len(), 2);
    assert_eq!(maps.backends.len(), 1);
}

#[test]
fn removing_a_udp_backend_flushes_its_flows_only() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let a = ep([198, 18, 1, 2], 53);
    let b = ep([198, 18, 1, 3], 53);
    p.sync(
        &state(vec![service(
            "dns",
            VIP,
            53,
            Protocol::Udp,
            vec![a.clone(), b],
        )]),
        &mut maps,
    )
    .unwrap();
    let vip_be = u32::from(Ipv4Addr::from(VIP)).to_be();
    let client = u32::from(Ipv4Addr::new(198, 18, 2, 2)).to_be();
    let id_of = |maps: &FakeMaps, last: u8| {
        *maps
            .backends
            .iter()
            .find(|(_, b)| b.addr_be == u32::from(Ipv4Addr::new(198, 18, 1, last)).to_be())
            .unwrap()
            .0
    };
    for (last, sport) in [(2u8, 1000u16), (3, 1001)] {
        let backend = u32::from(Ipv4Addr::new(198, 18, 1, last)).to_be();
        let id = id_of(&maps, last);
        let v = CtValue {
            nat_addr_be: backend,
            nat_port_be: 53u16.to_be(),
            backend_id: id,
            ..Default::default()
        };
        maps.conntrack
            .insert((client, vip_be, sport.to_be(), 53u16.to_be(), UDP, 0), v);
        let r = CtValue {
            nat_addr_be: vip_be,
            nat_port_be: 53u16.to_be(),
            backend_id: id,
            ..Default::default()
        };
        maps.conntrack
            .insert((backend, client, 53u16.to_be(), sport.to_be(), UDP, 1), r);
    }
    let stats = p
        .sync(
            &state(vec![service("dns", VIP, 53, Protocol::Udp, vec![a])]),
            &mut maps,
        )
        .unwrap();
    assert_eq!(stats.flushed_flows, 2);
    assert_eq!(maps.conntrack.len(), 2);
    assert!(
        maps.conntrack
            .keys()
            .all(|k| k.2 == 1000u16.to_be() || k.3 == 1000u16.to_be())
    );
}

#[test]
fn failed_write_is_repaired_by_the_next_sync() {
    let mut maps = FakeMaps {
        fail_after: Some(2),
        ..Default::default()
    };
    let mut p = Programmer::new();
    let s = state(vec![service(
        "web",
        VIP,
        80,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80), ep([198, 18, 1, 3], 80)],
    )]);
    assert!(p.sync(&s, &mut maps).is_err());
    maps.fail_after = None;
    p.sync(&s, &mut maps).unwrap();
    assert_eq!(maps.reachable(VIP, 80, TCP).len(), 2);
    assert_eq!(maps.services.len(), 3);
}

#[test]
fn stable_slots_fills_holes_with_newcomers() {
    assert_eq!(stable_slots(&[1, 2, 3], &[3, 1, 4]), vec![1, 4, 3]);
    assert_eq!(stable_slots(&[], &[5, 6]), vec![5, 6]);
    assert_eq!(stable_slots(&[1, 2], &[]), Vec::<BackendId>::new());
}

#[test]
fn partial_sync_touches_only_the_changed_ports() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let shared = ep([198, 18, 1, 2], 80);
    let a = service("a", VIP, 80, Protocol::Tcp, vec![shared.clone()]);
    let b = service(
        "b",
        [198, 19, 0, 11],
        80,
        Protocol::Tcp,
        vec![shared.clone()],
    );
    p.sync(&state(vec![a.clone(), b.clone()]), &mut maps)
        .unwrap();

    // `a` changes in the state but only `b` is named as changed: `a` must stay as programmed.
    let a2 = service("a", VIP, 80, Protocol::Tcp, vec![ep([198, 18, 1, 9], 80)]);
    let b2 = service(
        "b",
        [198, 19, 0, 11],
        80,
        Protocol::Tcp,
        vec![shared, ep([198, 18, 1, 3], 80)],
    );
    let changed: BTreeSet<ServicePortName> = [b2.name.clone()].into();
    let stats = p
        .sync_changed(&state(vec![a2, b2]), &changed, &mut maps)
        .unwrap();
    assert_eq!(stats.writes, 3, "one backend, one slot, one count");
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![(Ipv4Addr::new(198, 18, 1, 2), 80)]
    );
    assert_eq!(maps.reachable([198, 19, 0, 11], 80, TCP).len(), 2);
}

#[test]
fn partial_sync_removes_a_deleted_port_but_keeps_shared_backends() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let shared = ep([198, 18, 1, 2], 80);
    let a = service("a", VIP, 80, Protocol::Tcp, vec![shared.clone()]);
    let b = service(
        "b",
        [198, 19, 0, 11],
        80,
        Protocol::Tcp,
        vec![shared, ep([198, 18, 1, 3], 80)],
    );
    p.sync(&state(vec![a.clone(), b.clone()]), &mut maps)
        .unwrap();
    let changed: BTreeSet<ServicePortName> = [b.name.clone()].into();
    p.sync_changed(&state(vec![a]), &changed, &mut maps)
        .unwrap();
    assert!(maps.reachable([198, 19, 0, 11], 80, TCP).is_empty());
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![(Ipv4Addr::new(198, 18, 1, 2), 80)]
    );
    assert_eq!(
        maps.backends.len(),
        1,
        "198.18.1.3 is unused now, 198.18.1.2 still used by a"
    );
    assert_eq!(maps.services.len(), 2);
}

#[test]
fn ids_are_reused_after_release() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    for round in 0..3u8 {
        let s = service(
            "web",
            VIP,
            80,
            Protocol::Tcp,
            vec![ep([198, 18, 2, round], 80)],
        );
        p.sync(&state(vec![s]), &mut maps).unwrap();
    }
    assert_eq!(
        maps.backends.keys().copied().collect::<Vec<_>>(),
        vec![1],
        "the freed id 1 is reused"
    );
}
