use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use proxy_common::{Backend, CtKey, CtValue, FrontendKind, Scope, ServiceKey, service::flags};

use super::*;

/// These tests drive the IPv4 programmer; both families share its code.
type Programmer = FamilyProgrammer<V4>;
use crate::model::{DesiredService, Endpoint, Protocol};

type CtTuple = (u32, u32, u16, u16, u8);

/// In-memory maps that check on every write what the datapath relies on:
/// a frontend's `count` never exceeds the slots written, every slot names a
/// backend that exists, no two frontends' slots overlap, a frontend
/// checking source ranges has some, and a cluster-IP marker is only
/// written once a ClusterIP frontend is on its VIP.
#[derive(Default)]
struct FakeMaps {
    /// What `SERVICES` holds.
    entries: BTreeMap<ServiceKey, ServiceValue>,
    /// What `SLOTS` holds, by index.
    slots: BTreeMap<u32, BackendId>,
    /// Both as the tests read them: each frontend's slots as entries of
    /// their own (as snapshots present them), and `first_slot` left out
    /// (where a frontend's slots are is the programmer's business).
    services: BTreeMap<ServiceKey, ServiceValue>,
    backends: BTreeMap<BackendId, Backend>,
    source_ranges: BTreeSet<(u32, Ipv4Net)>,
    conntrack: BTreeMap<CtTuple, CtValue>,
    maglev: BTreeMap<u32, proxy_common::maglev::MaglevChunk>,
    /// XDP's filter words written (not counted as operations).
    filter: BTreeMap<u32, u64>,
    /// Every service key written or deleted, in order.
    touched: Vec<ServiceKey>,
    ops: usize,
    fail_after: Option<usize>,
    /// Damaged on purpose: frontends sharing slots are not (yet) an error.
    shared_slots_allowed: bool,
}

impl FakeMaps {
    fn step(&mut self) -> Result<(), MapError> {
        self.ops += 1;
        if self.fail_after.is_some_and(|n| self.ops > n) {
            return Err(MapError::TooManyBackends { count: 0 });
        }
        Ok(())
    }

    /// The service map's entries with every frontend's slots added, as
    /// the agent's snapshot of the kernel maps presents them.
    fn with_slots(&self) -> Vec<(ServiceKey, ServiceValue)> {
        let mut all = Vec::new();
        for (key, value) in &self.entries {
            all.push((*key, *value));
            if key.slot != 0 || value.has(flags::CLUSTER_IP_MARKER) {
                continue;
            }
            for slot in 1..=value.count {
                let id = self
                    .slots
                    .get(&value.slot_index(slot))
                    .copied()
                    .unwrap_or(0);
                all.push((
                    key.with_slot(slot),
                    ServiceValue::slot(id, value.service_id),
                ));
            }
        }
        all
    }

    fn refresh(&mut self) {
        self.services = self
            .with_slots()
            .into_iter()
            .map(|(k, v)| (k, ServiceValue { first_slot: 0, ..v }))
            .collect();
    }

    fn check_invariant(&self) {
        let mut taken: BTreeMap<u32, ServiceKey> = BTreeMap::new();
        for (key, value) in self.entries.iter().filter(|(k, _)| k.slot == 0) {
            if value.has(flags::CLUSTER_IP_MARKER) {
                continue;
            }
            for slot in 1..=value.count {
                let index = value.slot_index(slot);
                let id = self
                    .slots
                    .get(&index)
                    .unwrap_or_else(|| panic!("slot {slot} of {key:?} unwritten"));
                assert!(
                    self.backends.contains_key(id),
                    "slot names a missing backend"
                );
                if let Some(other) = taken.insert(index, *key)
                    && !self.shared_slots_allowed
                {
                    panic!("{key:?} and {other:?} share slot index {index}");
                }
            }
            if value.has(flags::MAGLEV) {
                assert!(
                    self.services.contains_key(&key.with_slot(MAGLEV_SLOT)),
                    "{key:?} balanced by a Maglev table it does not name"
                );
            }
            if value.has(flags::SOURCE_RANGES) {
                assert!(
                    self.source_ranges
                        .iter()
                        .any(|(id, _)| *id == value.service_id),
                    "{key:?} checks source ranges before any is written"
                );
            }
        }
    }

    fn frontend(&self, key: ServiceKey) -> ServiceValue {
        *self
            .services
            .get(&key)
            .unwrap_or_else(|| panic!("{key:?} missing"))
    }

    /// The backend addresses reachable through `key`, sorted.
    fn backends_of(&self, key: ServiceKey) -> Vec<(Ipv4Addr, u16)> {
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

    fn reachable(&self, vip: [u8; 4], port: u16, proto: u8) -> Vec<(Ipv4Addr, u16)> {
        self.backends_of(key(vip, port, proto))
    }

    fn frontend_keys(&self) -> Vec<ServiceKey> {
        self.services
            .iter()
            .filter(|(k, v)| k.slot == 0 && !v.has(flags::CLUSTER_IP_MARKER))
            .map(|(k, _)| *k)
            .collect()
    }

    fn markers(&self) -> Vec<Ipv4Addr> {
        self.services
            .iter()
            .filter(|(_, v)| v.has(flags::CLUSTER_IP_MARKER))
            .map(|(k, _)| Ipv4Addr::from(u32::from_be(k.addr_be)))
            .collect()
    }

    fn ranges_of(&self, service_id: u32) -> Vec<Ipv4Net> {
        self.source_ranges
            .iter()
            .filter(|(id, _)| *id == service_id)
            .map(|(_, r)| *r)
            .collect()
    }
}

impl ServiceMaps<V4> for FakeMaps {
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
        if value.has(flags::CLUSTER_IP_MARKER) {
            assert!(
                self.entries.iter().any(|(k, v)| k.addr_be == key.addr_be
                    && k.slot == 0
                    && !v.has(flags::CLUSTER_IP_MARKER)
                    && v.kind() == FrontendKind::ClusterIp),
                "marker written before any frontend on its VIP"
            );
        }
        self.entries.insert(*key, *value);
        self.touched.push(*key);
        self.check_invariant();
        self.refresh();
        Ok(())
    }
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        self.step()?;
        self.entries.remove(key);
        self.touched.push(*key);
        self.check_invariant();
        self.refresh();
        Ok(())
    }
    fn put_slots(&mut self, first: u32, ids: &[BackendId]) -> Result<(), MapError> {
        self.step()?;
        for (i, id) in ids.iter().enumerate() {
            assert!(
                self.backends.contains_key(id),
                "slot written before its backend"
            );
            self.slots.insert(first + i as u32, *id);
        }
        self.check_invariant();
        self.refresh();
        Ok(())
    }
    fn put_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError> {
        self.step()?;
        self.source_ranges.insert((service_id, range));
        Ok(())
    }
    fn delete_source_range(&mut self, service_id: u32, range: Ipv4Net) -> Result<(), MapError> {
        self.step()?;
        self.source_ranges.remove(&(service_id, range));
        self.check_invariant();
        Ok(())
    }
    fn put_maglev(
        &mut self,
        element: u32,
        chunk: &proxy_common::maglev::MaglevChunk,
    ) -> Result<(), MapError> {
        self.step()?;
        self.maglev.insert(element, *chunk);
        Ok(())
    }
    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError> {
        let before = self.conntrack.len();
        self.conntrack
            .retain(|k, v| !matches(&CtKey::new(k.0, k.1, k.2, k.3, k.4), v));
        Ok(before - self.conntrack.len())
    }
    fn put_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapError> {
        self.filter.insert(index, word);
        Ok(())
    }
}

fn be(ip: [u8; 4]) -> u32 {
    u32::from(Ipv4Addr::from(ip)).to_be()
}

fn key(addr: [u8; 4], port: u16, proto: u8) -> ServiceKey {
    ServiceKey::frontend(be(addr), port.to_be(), proto)
}

fn ep(ip: [u8; 4], port: u16) -> Endpoint {
    Endpoint::new(IpAddr::V4(ip.into()), port)
}

fn local(e: Endpoint) -> Endpoint {
    Endpoint {
        is_local: true,
        ..e
    }
}

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "default".into(),
        name: name.into(),
        port_name: "".into(),
        protocol,
    }
}

fn service(
    name: &str,
    vip: [u8; 4],
    port: u16,
    protocol: Protocol,
    eps: Vec<Endpoint>,
) -> DesiredService {
    DesiredService::cluster_ip(spn(name, protocol), vec![IpAddr::V4(vip.into())], port, eps)
}

/// A service with every kind of frontend: node port 30080, one external IP
/// and one LB IP, endpoints categorised as the model would (`local` are on this node).
fn external_service(
    name: &str,
    protocol: Protocol,
    remote: Vec<Endpoint>,
    local: Vec<Endpoint>,
    etp_local: bool,
) -> DesiredService {
    let mut all = local.clone();
    all.extend(remote);
    let mut svc = service(name, VIP, 80, protocol, all);
    svc.node_port = Some(NODE_PORT);
    svc.external_ips = vec![IpAddr::V4(EXTERNAL_IP.into())];
    svc.load_balancer_ips = vec![IpAddr::V4(LB_IP.into())];
    svc.local_endpoints = local;
    svc.external_policy_local = etp_local;
    svc
}

fn state(services: Vec<DesiredService>) -> DesiredState {
    DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    }
}

fn node(addrs: &[[u8; 4]]) -> NodeAddresses {
    NodeAddresses {
        primary: addrs.first().map(|a| Ipv4Addr::from(*a)),
        node_ports: addrs.iter().map(|a| Ipv4Addr::from(*a)).collect(),
        localhost_node_ports: false,
        host: Default::default(),
    }
}

/// A programmer that knows the node addresses NODE_A and NODE_B.
fn programmer(maps: &mut FakeMaps) -> Programmer {
    let mut p = Programmer::new();
    p.set_node_addresses(&node(&[NODE_A, NODE_B]), &DesiredState::default(), maps)
        .unwrap();
    p
}

const VIP: [u8; 4] = [198, 19, 0, 10];
const NODE_A: [u8; 4] = [192, 0, 2, 10];
const NODE_B: [u8; 4] = [192, 0, 2, 11];
const EXTERNAL_IP: [u8; 4] = [203, 0, 113, 7];
const LB_IP: [u8; 4] = [203, 0, 113, 50];
const NODE_PORT: u16 = 30080;
const TCP: u8 = proto::TCP;
const UDP: u8 = proto::UDP;

fn kind(kind: FrontendKind) -> u16 {
    ServiceValue::kind_flags(kind)
}

/// IPv6 maps that must not be written.
struct NoV6Writes;

impl ServiceMaps<V6> for NoV6Writes {
    fn put_backend(&mut self, _: BackendId, _: &BackendOf<V6>) -> Result<(), MapError> {
        panic!("IPv6 backend written")
    }
    fn delete_backend(&mut self, _: BackendId) -> Result<(), MapError> {
        panic!("IPv6 backend deleted")
    }
    fn put_service(&mut self, _: &ServiceKeyOf<V6>, _: &ServiceValue) -> Result<(), MapError> {
        panic!("IPv6 service written")
    }
    fn delete_service(&mut self, _: &ServiceKeyOf<V6>) -> Result<(), MapError> {
        panic!("IPv6 service deleted")
    }
    fn put_slots(&mut self, _: u32, _: &[BackendId]) -> Result<(), MapError> {
        panic!("IPv6 slots written")
    }
    fn put_source_range(&mut self, _: u32, _: ipnet::Ipv6Net) -> Result<(), MapError> {
        panic!("IPv6 source range written")
    }
    fn delete_source_range(&mut self, _: u32, _: ipnet::Ipv6Net) -> Result<(), MapError> {
        panic!("IPv6 source range deleted")
    }
    fn put_maglev(
        &mut self,
        _: u32,
        _: &proxy_common::maglev::MaglevChunk,
    ) -> Result<(), MapError> {
        panic!("IPv6 Maglev table written")
    }
    fn flush_flows(
        &mut self,
        _: &dyn Fn(&proxy_common::CtKeyOf<V6>, &proxy_common::CtValueOf<V6>) -> bool,
    ) -> Result<usize, MapError> {
        Ok(0)
    }
    fn put_filter_word(&mut self, _: u32, _: u64) -> Result<(), MapError> {
        panic!("IPv6 filter written")
    }
}

/// The IPv6 programmer keeps nothing for an IPv4-only port (it once gave
/// each an id, then a table of 50,000 entries it never gave back).
#[test]
fn the_other_family_keeps_nothing_for_a_port() {
    let eps = vec![ep([198, 18, 1, 2], 8080)];
    let web = state(vec![service("web", VIP, 80, Protocol::Tcp, eps)]);
    let mut v6 = FamilyProgrammer::<V6>::new();
    v6.sync(&web, &mut NoV6Writes).unwrap();
    assert_eq!(v6.service_ids().count(), 0);
    assert_eq!(v6.ports.capacity(), 0, "no entry was ever made");

    let mut maps = FakeMaps::default();
    let mut v4 = Programmer::new();
    v4.sync(&web, &mut maps).unwrap();
    assert_eq!(v4.service_ids().count(), 1);
    v4.sync(&state(vec![]), &mut maps).unwrap();
    assert!(v4.ports.is_empty(), "a port gone leaves no entry");
}

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
    assert_eq!(maps.services.len(), 4, "frontend, two slots, marker");
    assert_eq!(
        maps.frontend(key(VIP, 80, TCP)).flags,
        kind(FrontendKind::ClusterIp)
    );
}

#[test]
fn second_identical_sync_writes_nothing() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let s = state(vec![external_service(
        "web",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![local(ep([198, 18, 0, 2], 80))],
        true,
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
    let k = key(VIP, 80, TCP);
    let slot3 = maps.services[&k.with_slot(3)];
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
    assert_eq!(maps.services[&k.with_slot(2)].backend_id, slot3.backend_id);
    assert!(!maps.services.contains_key(&k.with_slot(3)));
}

#[test]
fn removed_service_leaves_no_entries() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let mut svc = external_service(
        "web",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![local(ep([198, 18, 0, 2], 80))],
        true,
    );
    svc.load_balancer_source_ranges = vec!["10.0.0.0/8".parse().unwrap()];
    p.sync(&state(vec![svc]), &mut maps).unwrap();
    assert!(!maps.source_ranges.is_empty());
    p.sync(&DesiredState::default(), &mut maps).unwrap();
    assert!(maps.services.is_empty());
    assert!(maps.backends.is_empty());
    assert!(maps.source_ranges.is_empty());
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
fn ipv6_addresses_are_not_programmed_in_the_ipv4_maps() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let mut s = service("web", VIP, 80, Protocol::Tcp, vec![ep([198, 18, 1, 2], 80)]);
    s.cluster_ips.push("2001:db8::10".parse().unwrap());
    s.external_ips.push("2001:db8::11".parse().unwrap());
    s.load_balancer_ips.push("2001:db8::12".parse().unwrap());
    s.load_balancer_source_ranges = vec!["2001:db8::/32".parse().unwrap()];
    s.cluster_endpoints.push(Endpoint {
        ip: "2001:db8::2".parse().unwrap(),
        ..ep([0, 0, 0, 0], 80)
    });
    p.sync(&state(vec![s]), &mut maps).unwrap();
    assert_eq!(maps.services.len(), 3, "frontend, slot, marker");
    assert_eq!(maps.backends.len(), 1);
    assert!(maps.source_ranges.is_empty());
}

#[test]
fn cluster_ip_marker_is_shared_by_the_ports_of_a_vip() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let http = service("web", VIP, 80, Protocol::Tcp, vec![ep([198, 18, 1, 2], 80)]);
    let mut https = service(
        "web",
        VIP,
        443,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 443)],
    );
    https.name.port_name = "https".into();
    let dns = service("dns", [198, 19, 0, 53], 53, Protocol::Udp, vec![]);
    p.sync(&state(vec![http.clone(), https.clone(), dns]), &mut maps)
        .unwrap();
    assert_eq!(
        maps.markers(),
        vec![Ipv4Addr::from(VIP), Ipv4Addr::new(198, 19, 0, 53)]
    );
    let marker = maps.frontend(ServiceKey::cluster_ip(be(VIP)));
    assert_eq!(
        marker,
        ServiceValue::frontend(0, 0, flags::CLUSTER_IP_MARKER)
    );

    p.sync(&state(vec![https]), &mut maps).unwrap();
    assert_eq!(
        maps.markers(),
        vec![Ipv4Addr::from(VIP)],
        "443 still uses the VIP"
    );
    p.sync(&DesiredState::default(), &mut maps).unwrap();
    assert!(maps.markers().is_empty());
}

#[test]
fn node_port_external_ip_and_lb_frontends_use_the_external_endpoints() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let remote = ep([198, 18, 1, 2], 8080);
    let mine = local(ep([198, 18, 0, 2], 8080));
    p.sync(
        &state(vec![external_service(
            "web",
            Protocol::Tcp,
            vec![remote],
            vec![mine],
            false,
        )]),
        &mut maps,
    )
    .unwrap();
    let both = vec![
        (Ipv4Addr::new(198, 18, 0, 2), 8080),
        (Ipv4Addr::new(198, 18, 1, 2), 8080),
    ];
    let external = [
        (key(NODE_A, NODE_PORT, TCP), FrontendKind::NodePort),
        (key(NODE_B, NODE_PORT, TCP), FrontendKind::NodePort),
        (key(EXTERNAL_IP, 80, TCP), FrontendKind::ExternalIp),
        (key(LB_IP, 80, TCP), FrontendKind::LoadBalancer),
    ];
    for (k, expected) in external {
        let fe = maps.frontend(k);
        assert_eq!(fe.kind(), expected);
        assert_eq!(fe.flags, kind(expected) | flags::EXTERNAL, "{expected:?}");
        assert_eq!(maps.backends_of(k), both);
    }
    assert_eq!(
        maps.frontend_keys().len(),
        5,
        "no ClusterWide scope under eTP Cluster"
    );
    assert_eq!(
        maps.markers(),
        vec![Ipv4Addr::from(VIP)],
        "markers are for cluster IPs only"
    );
    let ids: BTreeSet<u32> = maps
        .frontend_keys()
        .iter()
        .map(|k| maps.frontend(*k).service_id)
        .collect();
    assert_eq!(ids.len(), 1, "one service id per service port");
}

#[test]
fn flags_for_every_traffic_policy_combination() {
    let remote = ep([198, 18, 1, 2], 80);
    let mine = local(ep([198, 18, 0, 2], 80));
    let np = key(NODE_A, NODE_PORT, TCP);
    let cip = key(VIP, 80, TCP);
    for (etp_local, itp_local) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut maps = FakeMaps::default();
        let mut p = programmer(&mut maps);
        let mut svc = external_service(
            "web",
            Protocol::Tcp,
            vec![remote.clone()],
            vec![mine.clone()],
            etp_local,
        );
        svc.internal_policy_local = itp_local;
        p.sync(&state(vec![svc]), &mut maps).unwrap();
        let case = format!("eTP local {etp_local}, iTP local {itp_local}");

        let policy = |local: bool| if local { flags::POLICY_LOCAL } else { 0 };
        assert_eq!(
            maps.frontend(cip).flags,
            kind(FrontendKind::ClusterIp) | policy(itp_local),
            "{case}"
        );
        assert_eq!(
            maps.backends_of(cip).len(),
            if itp_local { 1 } else { 2 },
            "{case}"
        );
        assert!(
            !maps
                .services
                .contains_key(&cip.with_scope(Scope::ClusterWide)),
            "{case}: cluster IPs have no ClusterWide scope"
        );

        let external_flags = kind(FrontendKind::NodePort) | flags::EXTERNAL;
        assert_eq!(
            maps.frontend(np).flags,
            external_flags | policy(etp_local),
            "{case}"
        );
        assert_eq!(
            maps.backends_of(np).len(),
            if etp_local { 1 } else { 2 },
            "{case}"
        );
        let wide = np.with_scope(Scope::ClusterWide);
        if etp_local {
            assert_eq!(maps.frontend(wide).flags, external_flags, "{case}");
            assert_eq!(maps.frontend(wide).service_id, maps.frontend(np).service_id);
            assert_eq!(maps.backends_of(wide).len(), 2, "{case}: every endpoint");
        } else {
            assert!(!maps.services.contains_key(&wide), "{case}");
        }
    }
}

#[test]
fn cluster_wide_scope_goes_when_the_policy_becomes_cluster() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let remote = vec![ep([198, 18, 1, 2], 80)];
    let mine = vec![local(ep([198, 18, 0, 2], 80))];
    let local_policy = external_service("web", Protocol::Tcp, remote.clone(), mine.clone(), true);
    p.sync(&state(vec![local_policy]), &mut maps).unwrap();
    assert_eq!(
        maps.frontend_keys().len(),
        9,
        "cluster IP + 4 external x 2 scopes"
    );

    let cluster_policy = external_service("web", Protocol::Tcp, remote, mine, false);
    p.sync(&state(vec![cluster_policy]), &mut maps).unwrap();
    assert_eq!(maps.frontend_keys().len(), 5);
    assert!(
        maps.frontend_keys()
            .iter()
            .all(|k| k.scope == Scope::Primary as u8)
    );
    assert_eq!(maps.backends_of(key(LB_IP, 80, TCP)).len(), 2);
}

#[test]
fn no_endpoint_anywhere_rejects_but_local_policy_with_remote_endpoints_drops() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let mut empty = external_service("empty", Protocol::Tcp, vec![], vec![], true);
    empty.cluster_ips = vec![IpAddr::V4([198, 19, 0, 20].into())];
    empty.node_port = Some(30081);
    empty.external_ips.clear();
    empty.load_balancer_ips.clear();
    let remote_only = external_service(
        "remote",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![],
        true,
    );
    p.sync(&state(vec![empty, remote_only]), &mut maps).unwrap();

    for k in [
        key([198, 19, 0, 20], 80, TCP),
        key(NODE_A, 30081, TCP),
        key(NODE_A, 30081, TCP).with_scope(Scope::ClusterWide),
    ] {
        let fe = maps.frontend(k);
        assert_eq!(fe.count, 0);
        assert!(fe.has(flags::REJECT_WHEN_EMPTY), "{k:?}");
    }
    let np = key(NODE_A, NODE_PORT, TCP);
    let fe = maps.frontend(np);
    assert_eq!(fe.count, 0, "no local endpoint");
    assert!(fe.has(flags::POLICY_LOCAL));
    assert!(!fe.has(flags::REJECT_WHEN_EMPTY), "dropped, not rejected");
    assert_eq!(maps.frontend(np.with_scope(Scope::ClusterWide)).count, 1);
    assert!(
        !maps
            .frontend(key(VIP, 80, TCP))
            .has(flags::REJECT_WHEN_EMPTY)
    );
}

#[test]
fn endpoints_arriving_clear_the_reject_flag() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    p.sync(
        &state(vec![service("web", VIP, 80, Protocol::Tcp, vec![])]),
        &mut maps,
    )
    .unwrap();
    let k = key(VIP, 80, TCP);
    assert_eq!(
        maps.frontend(k),
        ServiceValue::frontend(
            0,
            1,
            kind(FrontendKind::ClusterIp) | flags::REJECT_WHEN_EMPTY
        )
    );
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
    assert_eq!(maps.frontend(k).count, 1);
    assert!(!maps.frontend(k).has(flags::REJECT_WHEN_EMPTY));
}

fn with_ranges(mut svc: DesiredService, ranges: &[&str]) -> DesiredService {
    svc.load_balancer_source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
    svc
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[test]
fn source_ranges_guard_lb_ips_only_and_follow_changes() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let base = external_service(
        "web",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![],
        false,
    );
    p.sync(
        &state(vec![with_ranges(
            base.clone(),
            &["10.1.2.3/16", "fd00::/8"],
        )]),
        &mut maps,
    )
    .unwrap();
    let lb = maps.frontend(key(LB_IP, 80, TCP));
    assert!(lb.has(flags::SOURCE_RANGES));
    assert_eq!(maps.ranges_of(lb.service_id), vec![net("10.1.0.0/16")]);
    for k in [
        key(VIP, 80, TCP),
        key(NODE_A, NODE_PORT, TCP),
        key(EXTERNAL_IP, 80, TCP),
    ] {
        assert!(!maps.frontend(k).has(flags::SOURCE_RANGES), "{k:?}");
    }

    p.sync(
        &state(vec![with_ranges(base.clone(), &["172.16.0.0/12"])]),
        &mut maps,
    )
    .unwrap();
    assert_eq!(maps.ranges_of(lb.service_id), vec![net("172.16.0.0/12")]);

    p.sync(&state(vec![base]), &mut maps).unwrap();
    assert!(!maps.frontend(key(LB_IP, 80, TCP)).has(flags::SOURCE_RANGES));
    assert!(maps.source_ranges.is_empty());
}

#[test]
fn source_ranges_without_lb_ip_or_ipv4_range_restrict_nothing() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let mut no_lb = with_ranges(
        external_service(
            "a",
            Protocol::Tcp,
            vec![ep([198, 18, 1, 2], 80)],
            vec![],
            false,
        ),
        &["10.0.0.0/8"],
    );
    no_lb.load_balancer_ips.clear();
    let v6_only = with_ranges(
        external_service(
            "b",
            Protocol::Udp,
            vec![ep([198, 18, 1, 2], 80)],
            vec![],
            false,
        ),
        &["fd00::/8"],
    );
    p.sync(&state(vec![no_lb, v6_only]), &mut maps).unwrap();
    assert!(maps.source_ranges.is_empty());
    assert!(!maps.frontend(key(LB_IP, 80, UDP)).has(flags::SOURCE_RANGES));
}

#[test]
fn a_range_holding_the_node_ip_also_allows_the_lb_ips() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let svc = with_ranges(
        external_service(
            "web",
            Protocol::Tcp,
            vec![ep([198, 18, 1, 2], 80)],
            vec![],
            false,
        ),
        &["192.0.2.0/24"],
    );
    p.sync(&state(vec![svc.clone()]), &mut maps).unwrap();
    let id = maps.frontend(key(LB_IP, 80, TCP)).service_id;
    assert_eq!(
        maps.ranges_of(id),
        vec![net("192.0.2.0/24"), net("203.0.113.50/32")]
    );

    // The primary IP moves out of the range: the LB IPs are no longer allowed.
    p.set_node_addresses(&node(&[[198, 51, 100, 1]]), &state(vec![svc]), &mut maps)
        .unwrap();
    assert_eq!(maps.ranges_of(id), vec![net("192.0.2.0/24")]);
}

#[test]
fn a_released_service_id_takes_no_stale_ranges_along() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let guarded = with_ranges(
        external_service(
            "a",
            Protocol::Tcp,
            vec![ep([198, 18, 1, 2], 80)],
            vec![],
            false,
        ),
        &["10.0.0.0/8"],
    );
    p.sync(&state(vec![guarded]), &mut maps).unwrap();
    let id = maps.frontend(key(LB_IP, 80, TCP)).service_id;
    p.sync(&DesiredState::default(), &mut maps).unwrap();
    let open = external_service(
        "b",
        Protocol::Udp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![],
        false,
    );
    p.sync(&state(vec![open]), &mut maps).unwrap();
    assert_eq!(
        maps.frontend(key(LB_IP, 80, UDP)).service_id,
        id,
        "id reused"
    );
    assert!(maps.ranges_of(id).is_empty());
}

#[test]
fn node_address_change_resyncs_node_ports_only() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let web = external_service(
        "web",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![],
        false,
    );
    let plain = service(
        "plain",
        [198, 19, 0, 30],
        80,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 3], 80)],
    );
    p.sync(&state(vec![web.clone(), plain]), &mut maps).unwrap();

    // `plain` changed in the state but is not synced by a node address change.
    let plain2 = service(
        "plain",
        [198, 19, 0, 30],
        80,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 9], 80)],
    );
    let s = state(vec![web, plain2]);
    maps.touched.clear();
    let new_node = [192, 0, 2, 12];
    let stats = p
        .set_node_addresses(&node(&[NODE_A, new_node]), &s, &mut maps)
        .unwrap();
    assert!(stats.writes > 0 && stats.deletes > 0);
    let node_ips = [be(NODE_B), be(new_node)];
    assert!(
        maps.touched.iter().all(|k| node_ips.contains(&k.addr_be)),
        "only the node ports on the changed addresses were written: {:?}",
        maps.touched
    );
    let node_ports: Vec<_> = maps
        .frontend_keys()
        .into_iter()
        .filter(|k| maps.frontend(*k).kind() == FrontendKind::NodePort)
        .map(|k| k.addr_be)
        .collect();
    assert_eq!(node_ports, vec![be(NODE_A), be(new_node)]);
    assert_eq!(
        maps.reachable([198, 19, 0, 30], 80, TCP),
        vec![(Ipv4Addr::new(198, 18, 1, 3), 80)]
    );

    maps.touched.clear();
    let stats = p
        .set_node_addresses(&node(&[NODE_A, new_node]), &s, &mut maps)
        .unwrap();
    assert_eq!((stats.writes, stats.deletes), (0, 0));
    assert!(maps.touched.is_empty());
}

#[test]
fn node_ports_wait_for_node_addresses() {
    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    let web = external_service(
        "web",
        Protocol::Tcp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![],
        false,
    );
    let s = state(vec![web]);
    p.sync(&s, &mut maps).unwrap();
    assert_eq!(
        maps.frontend_keys().len(),
        3,
        "cluster IP, external IP, LB IP"
    );
    p.set_node_addresses(&node(&[NODE_A]), &s, &mut maps)
        .unwrap();
    assert_eq!(maps.backends_of(key(NODE_A, NODE_PORT, TCP)).len(), 1);
}

fn ct_insert(maps: &mut FakeMaps, key: CtTuple, value: CtValue) {
    maps.conntrack.insert(key, value);
}

fn backend_id(maps: &FakeMaps, addr: [u8; 4]) -> BackendId {
    *maps
        .backends
        .iter()
        .find(|(_, b)| b.addr_be == be(addr))
        .unwrap()
        .0
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
    let vip_be = be(VIP);
    let client = be([198, 18, 2, 2]);
    for (last, sport) in [(2u8, 1000u16), (3, 1001)] {
        let backend = be([198, 18, 1, last]);
        let id = backend_id(&maps, [198, 18, 1, last]);
        let forward = CtValue {
            nat_addr_be: backend,
            nat_port_be: 53u16.to_be(),
            backend_id: id,
            ..Default::default()
        };
        ct_insert(
            &mut maps,
            (client, vip_be, sport.to_be(), 53u16.to_be(), UDP),
            forward,
        );
        let reply = CtValue {
            nat_addr_be: vip_be,
            nat_port_be: 53u16.to_be(),
            flags: proxy_common::conntrack::flags::REPLY,
            ..Default::default()
        };
        ct_insert(
            &mut maps,
            (backend, client, 53u16.to_be(), sport.to_be(), UDP),
            reply,
        );
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
fn removing_a_udp_backend_flushes_masqueraded_node_port_flows() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let gone = ep([198, 18, 1, 2], 5353);
    let stays = ep([198, 18, 1, 3], 5353);
    let svc = |eps: Vec<Endpoint>| external_service("dns", Protocol::Udp, eps, vec![], false);
    p.sync(
        &state(vec![svc(vec![gone.clone(), stays.clone()])]),
        &mut maps,
    )
    .unwrap();

    let client = be([203, 0, 113, 99]);
    let masq = be(NODE_A);
    let np = NODE_PORT.to_be();
    for (addr, client_port, snat_port) in [
        ([198, 18, 1, 2], 4000u16, 61000u16),
        ([198, 18, 1, 3], 4001, 61001),
    ] {
        let id = backend_id(&maps, addr);
        // client -> NODE_A:30080, masqueraded to NODE_A:snat_port towards the backend
        ct_insert(
            &mut maps,
            (client, be(NODE_A), client_port.to_be(), np, UDP),
            CtValue {
                nat_addr_be: be(addr),
                nat_port_be: 5353u16.to_be(),
                backend_id: id,
                flags: proxy_common::conntrack::flags::SNAT,
                snat_addr_be: masq,
                snat_port_be: snat_port.to_be(),
                ..Default::default()
            },
        );
        // backend -> NODE_A:snat_port, restored to NODE_A:30080 -> client
        ct_insert(
            &mut maps,
            (be(addr), masq, 5353u16.to_be(), snat_port.to_be(), UDP),
            CtValue {
                nat_addr_be: be(NODE_A),
                nat_port_be: np,
                flags: proxy_common::conntrack::flags::SNAT | proxy_common::conntrack::flags::REPLY,
                snat_addr_be: client,
                snat_port_be: client_port.to_be(),
                ..Default::default()
            },
        );
    }
    let stats = p.sync(&state(vec![svc(vec![stays])]), &mut maps).unwrap();
    assert_eq!(stats.flushed_flows, 2);
    assert!(
        maps.conntrack
            .iter()
            .all(|(k, v)| v.backend_id == backend_id(&maps, [198, 18, 1, 3])
                || k.0 == be([198, 18, 1, 3]))
    );
    assert_eq!(maps.conntrack.len(), 2);
}

#[test]
fn a_backend_still_serving_the_other_scope_keeps_its_udp_flows() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let mine = local(ep([198, 18, 0, 2], 53));
    let remote = ep([198, 18, 1, 2], 53);
    let mut svc = external_service(
        "dns",
        Protocol::Udp,
        vec![remote.clone()],
        vec![mine.clone()],
        true,
    );
    p.sync(&state(vec![svc.clone()]), &mut maps).unwrap();
    let id = backend_id(&maps, [198, 18, 0, 2]);
    let client = be([203, 0, 113, 99]);
    ct_insert(
        &mut maps,
        (client, be(NODE_A), 4000u16.to_be(), NODE_PORT.to_be(), UDP),
        CtValue {
            backend_id: id,
            ..Default::default()
        },
    );

    // Topology hints leave the local endpoint out of the cluster-wide set only.
    svc.cluster_endpoints = vec![remote];
    let stats = p.sync(&state(vec![svc]), &mut maps).unwrap();
    assert_eq!(stats.flushed_flows, 0);
    assert_eq!(maps.conntrack.len(), 1);
}

#[test]
fn a_udp_endpoint_passed_over_keeps_its_flows_until_it_no_longer_serves() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let (a, b) = (ep([198, 18, 1, 2], 53), ep([198, 18, 1, 3], 53));
    let dns = |eps: Vec<Endpoint>, others: &[[u8; 4]]| DesiredService {
        other_serving_ips: others.iter().map(|ip| Ipv4Addr::from(*ip).into()).collect(),
        ..service("dns", VIP, 53, Protocol::Udp, eps)
    };
    p.sync(
        &state(vec![dns(vec![a.clone(), b.clone()], &[])]),
        &mut maps,
    )
    .unwrap();
    let client = be([198, 18, 2, 2]);
    ct_insert(
        &mut maps,
        (client, be(VIP), 1000u16.to_be(), 53u16.to_be(), UDP),
        CtValue {
            nat_addr_be: be([198, 18, 1, 3]),
            nat_port_be: 53u16.to_be(),
            ..Default::default()
        },
    );
    // Terminating while `a` is ready: balanced to no more, still serving.
    let stats = p
        .sync(
            &state(vec![dns(vec![a.clone()], &[[198, 18, 1, 3]])]),
            &mut maps,
        )
        .unwrap();
    assert_eq!((stats.udp_frontends_judged, stats.flushed_flows), (0, 0));
    assert_eq!(maps.conntrack.len(), 1);
    // No longer serving.
    let stats = p.sync(&state(vec![dns(vec![a], &[])]), &mut maps).unwrap();
    assert_eq!((stats.udp_frontends_judged, stats.flushed_flows), (1, 1));
    assert!(maps.conntrack.is_empty());
}

/// One UDP flow from a client to `VIP:53`, sent to `backend`.
fn dns_flow(maps: &mut FakeMaps, backend: [u8; 4]) {
    ct_insert(
        maps,
        (
            be([198, 18, 2, 2]),
            be(VIP),
            1000u16.to_be(),
            53u16.to_be(),
            UDP,
        ),
        CtValue {
            nat_addr_be: be(backend),
            nat_port_be: 53u16.to_be(),
            ..Default::default()
        },
    );
}

#[test]
fn a_failed_sync_does_not_lose_the_udp_flows_it_judged() {
    let (a, b) = (ep([198, 18, 1, 2], 53), ep([198, 18, 1, 3], 53));
    let dns = |eps| service("dns", VIP, 53, Protocol::Udp, eps);
    let web = service(
        "web",
        [198, 19, 0, 11],
        80,
        Protocol::Tcp,
        vec![ep([198, 18, 1, 5], 80)],
    );
    let before = state(vec![dns(vec![a.clone(), b]), web]);
    // `web` goes too: map operations after the UDP port was judged.
    let after = state(vec![dns(vec![a])]);
    for fail_after in 0..16 {
        let mut maps = FakeMaps::default();
        let mut p = programmer(&mut maps);
        p.sync(&before, &mut maps).unwrap();
        dns_flow(&mut maps, [198, 18, 1, 3]);
        maps.ops = 0;
        maps.fail_after = Some(fail_after);
        let failed = p.sync(&after, &mut maps).is_err();
        maps.fail_after = None;
        p.sync(&after, &mut maps).unwrap();
        assert!(
            maps.conntrack.is_empty(),
            "failing after {fail_after} operations (the sync failed: {failed})"
        );
    }
}

#[test]
fn a_udp_frontend_taken_over_by_another_service_port_is_judged_by_its_endpoints() {
    // One sync deletes a service and creates another on its cluster IP.
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    let old = service(
        "kube-dns",
        VIP,
        53,
        Protocol::Udp,
        vec![ep([198, 18, 1, 2], 53)],
    );
    p.sync(&state(vec![old]), &mut maps).unwrap();
    dns_flow(&mut maps, [198, 18, 1, 2]);
    let new = service(
        "coredns",
        VIP,
        53,
        Protocol::Udp,
        vec![ep([198, 18, 1, 3], 53)],
    );
    let stats = p.sync(&state(vec![new]), &mut maps).unwrap();
    assert_eq!(stats.flushed_flows, 1, "{stats:?}");
    assert!(maps.conntrack.is_empty());
}

#[test]
fn an_adopting_programmer_judges_the_udp_flows_it_finds() {
    // After a restart the maps hold flows begun under the previous agent:
    // one to an endpoint deleted while no agent ran goes at the first sync.
    let mut maps = FakeMaps::default();
    let dns = |ip: [u8; 4]| service("dns", VIP, 53, Protocol::Udp, vec![ep(ip, 53)]);
    programmer(&mut maps)
        .sync(&state(vec![dns([198, 18, 1, 9])]), &mut maps)
        .unwrap();
    let client = be([198, 18, 2, 2]);
    for (sport, backend) in [(1000u16, [198, 18, 1, 2]), (1001, [198, 18, 1, 9])] {
        ct_insert(
            &mut maps,
            (client, be(VIP), sport.to_be(), 53u16.to_be(), UDP),
            CtValue {
                nat_addr_be: be(backend),
                nat_port_be: 53u16.to_be(),
                ..Default::default()
            },
        );
    }
    let now = state(vec![dns([198, 18, 1, 2])]);
    let mut second = Programmer::new();
    second.adopt(&snapshot(&maps), &now, &node(&[NODE_A, NODE_B]));
    let stats = second.sync(&now, &mut maps).unwrap();
    assert_eq!(stats.flushed_flows, 1);
    assert!(maps.conntrack.keys().all(|k| k.2 == 1000u16.to_be()));
    // A new programmer's new port has no flows to judge.
    let stats = Programmer::new()
        .sync(&now, &mut FakeMaps::default())
        .unwrap();
    assert_eq!(stats.udp_frontends_judged, 0);
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
    assert_eq!(maps.services.len(), 4);
}

/// Syncs `before` cleanly, then `attempt` with a failure after `fail_after`
/// writes, then `then` cleanly; returns the maps.
fn sync_with_failure(
    before: &DesiredState,
    attempt: &DesiredState,
    fail_after: usize,
    then: &DesiredState,
) -> FakeMaps {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    p.sync(before, &mut maps).unwrap();
    maps.ops = 0;
    maps.fail_after = Some(fail_after);
    let _ = p.sync(attempt, &mut maps);
    maps.fail_after = None;
    p.sync(then, &mut maps).unwrap();
    maps
}

#[test]
fn every_failure_point_is_repaired_by_the_next_sync() {
    let full = external_service(
        "web",
        Protocol::Udp,
        vec![ep([198, 18, 1, 2], 80)],
        vec![local(ep([198, 18, 0, 2], 80))],
        true,
    );
    let full = state(vec![with_ranges(full, &["192.0.2.0/24"])]);
    let empty = DesiredState::default();
    let mut reference = FakeMaps::default();
    programmer(&mut reference)
        .sync(&full, &mut reference)
        .unwrap();
    // Removing writes no more than adding, so this covers every failure point.
    for fail_after in 0..reference.ops {
        let maps = sync_with_failure(&empty, &full, fail_after, &full);
        assert_eq!(
            maps.services, reference.services,
            "adding, failure after {fail_after}"
        );
        assert_eq!(maps.source_ranges, reference.source_ranges);
        for maps in [
            sync_with_failure(&full, &empty, fail_after, &empty),
            sync_with_failure(&empty, &full, fail_after, &empty),
        ] {
            assert!(maps.services.is_empty(), "failure after {fail_after}");
            assert!(
                maps.backends.is_empty(),
                "failure after {fail_after}: a backend leaked"
            );
            assert!(maps.source_ranges.is_empty(), "failure after {fail_after}");
        }
    }
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
    assert_eq!(maps.services.len(), 3, "a's frontend, slot and marker");
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

/// What `maps` holds, as a restarted agent reads it back from pinned maps.
fn snapshot(maps: &FakeMaps) -> ServiceSnapshot {
    ServiceSnapshot {
        services: maps.with_slots(),
        backends: maps.backends.iter().map(|(k, v)| (*k, *v)).collect(),
        source_ranges: maps.source_ranges.iter().copied().collect(),
    }
}

#[test]
fn an_adopting_programmer_rewrites_nothing_for_the_same_state_and_keeps_every_id() {
    let mut maps = FakeMaps::default();
    let mut first = programmer(&mut maps);
    let s = state(vec![
        with_ranges(
            external_service(
                "web",
                Protocol::Tcp,
                vec![ep([198, 18, 1, 2], 80)],
                vec![local(ep([198, 18, 0, 2], 80))],
                true,
            ),
            &["10.1.0.0/16"],
        ),
        service(
            "dns",
            [198, 19, 0, 53],
            53,
            Protocol::Udp,
            vec![ep([198, 18, 1, 9], 53)],
        ),
    ]);
    first.sync(&s, &mut maps).unwrap();
    let before = (
        maps.services.clone(),
        maps.backends.clone(),
        maps.source_ranges.clone(),
    );

    let mut second = Programmer::new();
    let adopted = second.adopt(&snapshot(&maps), &s, &node(&[NODE_A, NODE_B]));
    assert_eq!(adopted.stale_frontends, 0);
    assert_eq!(adopted.backends, 3);
    maps.touched.clear();
    let stats = second.sync(&s, &mut maps).unwrap();
    assert_eq!(
        (stats.writes, stats.deletes),
        (0, 0),
        "touched {:?}",
        maps.touched
    );
    assert_eq!(
        (
            maps.services.clone(),
            maps.backends.clone(),
            maps.source_ranges.clone()
        ),
        before
    );
}

#[test]
fn adoption_removes_what_no_service_wants_and_changes_only_the_rest() {
    let mut maps = FakeMaps::default();
    let mut first = programmer(&mut maps);
    let web = |eps| service("web", VIP, 80, Protocol::Tcp, eps);
    let old = state(vec![
        web(vec![ep([198, 18, 1, 2], 80), ep([198, 18, 1, 3], 80)]),
        service(
            "gone",
            [198, 19, 0, 99],
            81,
            Protocol::Tcp,
            vec![ep([198, 18, 1, 7], 81)],
        ),
    ]);
    first.sync(&old, &mut maps).unwrap();
    let kept_id = backend_id(&maps, [198, 18, 1, 2]);
    let web_service_id = maps.frontend(key(VIP, 80, TCP)).service_id;

    // The restarted agent lists a world where "gone" was deleted and web lost
    // one endpoint and gained another while it was down.
    let new = state(vec![web(vec![
        ep([198, 18, 1, 2], 80),
        ep([198, 18, 1, 4], 80),
    ])]);
    let mut second = Programmer::new();
    let adopted = second.adopt(&snapshot(&maps), &new, &node(&[NODE_A, NODE_B]));
    assert_eq!(adopted.stale_frontends, 1);
    second.sync(&new, &mut maps).unwrap();
    maps.check_invariant();
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![
            (Ipv4Addr::new(198, 18, 1, 2), 80),
            (Ipv4Addr::new(198, 18, 1, 4), 80)
        ]
    );
    assert!(maps.reachable([198, 19, 0, 99], 81, TCP).is_empty());
    assert_eq!(
        maps.markers(),
        vec![Ipv4Addr::from(VIP)],
        "the stale VIP's marker went too"
    );
    assert_eq!(
        backend_id(&maps, [198, 18, 1, 2]),
        kept_id,
        "a kept backend keeps its id"
    );
    assert_eq!(maps.frontend(key(VIP, 80, TCP)).service_id, web_service_id);
    assert_eq!(maps.backends.len(), 2);

    // New ids never collide with adopted ones.
    let third = state(vec![
        web(vec![ep([198, 18, 1, 2], 80), ep([198, 18, 1, 4], 80)]),
        service(
            "new",
            [198, 19, 0, 77],
            82,
            Protocol::Tcp,
            vec![ep([198, 18, 1, 8], 82)],
        ),
    ]);
    second.sync(&third, &mut maps).unwrap();
    maps.check_invariant();
    let ids: BTreeSet<u32> = maps
        .frontend_keys()
        .iter()
        .map(|k| maps.frontend(*k).service_id)
        .collect();
    assert_eq!(ids.len(), 2, "distinct service ids");
    assert_eq!(maps.backends.len(), 3);
}

#[test]
fn adopted_frontends_keep_their_slot_ranges_and_one_sharing_another_gets_its_own() {
    let mut maps = FakeMaps::default();
    let mut first = programmer(&mut maps);
    let s = state(vec![
        service("web", VIP, 80, Protocol::Tcp, vec![ep([198, 18, 1, 2], 80)]),
        service(
            "dns",
            [198, 19, 0, 53],
            53,
            Protocol::Udp,
            vec![ep([198, 18, 1, 9], 53), ep([198, 18, 1, 10], 53)],
        ),
    ]);
    first.sync(&s, &mut maps).unwrap();
    let web = maps.entries[&key(VIP, 80, TCP)];
    let dns_key = key([198, 19, 0, 53], 53, proto::UDP);
    assert_ne!(web.first_slot, maps.entries[&dns_key].first_slot);

    // Adopted as they are: the same state rewrites nothing.
    let mut second = Programmer::new();
    second.adopt(&snapshot(&maps), &s, &node(&[NODE_A, NODE_B]));
    let stats = second.sync(&s, &mut maps).unwrap();
    assert_eq!((stats.writes, stats.deletes), (0, 0));

    // Pins whose dns frontend names web's range (it could only come from a
    // damaged map): the second adopter gives one of them a range of its own.
    let web_id = maps.slots[&web.first_slot];
    let moved = ServiceValue {
        first_slot: web.first_slot,
        ..maps.entries[&dns_key]
    };
    maps.shared_slots_allowed = true;
    maps.entries.insert(dns_key, moved);
    maps.slots.insert(web.first_slot + 1, web_id);
    let mut third = Programmer::new();
    third.adopt(&snapshot(&maps), &s, &node(&[NODE_A, NODE_B]));
    third.sync(&s, &mut maps).unwrap();
    maps.shared_slots_allowed = false;
    maps.check_invariant();
    assert_eq!(
        maps.reachable([198, 19, 0, 53], 53, proto::UDP),
        vec![
            (Ipv4Addr::new(198, 18, 1, 9), 53),
            (Ipv4Addr::new(198, 18, 1, 10), 53)
        ]
    );
    assert_eq!(
        maps.reachable(VIP, 80, TCP),
        vec![(Ipv4Addr::new(198, 18, 1, 2), 80)]
    );
}

#[test]
fn a_sync_that_would_not_fit_is_refused_before_anything_is_written() {
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    // One frontend and its marker = 2 entries, its 2 slots in a range of
    // 4; 2 backends.
    p.set_capacity(Capacity {
        services: 2,
        backends: 2,
        maglev_chunks: 0,
        slots: 4,
    });
    let two = vec![ep([198, 18, 1, 2], 80), ep([198, 18, 1, 3], 80)];
    let good = state(vec![service("web", VIP, 80, Protocol::Tcp, two.clone())]);
    p.sync(&good, &mut maps).unwrap();
    let programmed = (maps.services.clone(), maps.backends.clone());

    let three = vec![
        ep([198, 18, 1, 2], 80),
        ep([198, 18, 1, 3], 80),
        ep([198, 18, 1, 4], 80),
    ];
    let err = p
        .sync(
            &state(vec![service("web", VIP, 80, Protocol::Tcp, three)]),
            &mut maps,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            MapError::Capacity {
                map: "BACKENDS",
                needed: 3,
                capacity: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("--ebpf-map-size-backends"),
        "{err}"
    );
    assert_eq!((maps.services.clone(), maps.backends.clone()), programmed);

    let more = state(vec![
        service("web", VIP, 80, Protocol::Tcp, two.clone()),
        service("api", [198, 19, 0, 11], 80, Protocol::Tcp, two.clone()),
    ]);
    let err = p.sync(&more, &mut maps).unwrap_err();
    assert!(
        matches!(
            err,
            MapError::Capacity {
                map: "SERVICES",
                needed: 4,
                capacity: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("maps.services"), "{err}");
    assert_eq!((maps.services.clone(), maps.backends.clone()), programmed);

    // Within the sizes again, the sync goes through.
    p.sync(&good, &mut maps).unwrap();

    // The slots of a second frontend would not fit in the array.
    let mut maps = FakeMaps::default();
    let mut p = programmer(&mut maps);
    p.set_capacity(Capacity {
        services: 8,
        backends: 8,
        maglev_chunks: 0,
        slots: 6,
    });
    p.sync(&good, &mut maps).unwrap();
    let programmed = (maps.services.clone(), maps.backends.clone());
    let err = p.sync(&more, &mut maps).unwrap_err();
    assert!(
        matches!(
            err,
            MapError::Capacity {
                map: "SLOTS",
                needed: 8,
                capacity: 6,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("--ebpf-map-size-backend-slots"),
        "{err}"
    );
    assert_eq!((maps.services.clone(), maps.backends.clone()), programmed);
}

mod maglev;

/// XDP's filter has the bit of every frontend programmed (to it) and of
/// every backend (from it), and loses them once they are gone; a programmer
/// taking over pinned maps rewrites every word, clearing what the agent
/// before it left.
#[test]
fn the_xdp_filter_follows_the_frontends_and_backends() {
    use proxy_common::filter::{FILTER_WORDS, backend_bit, frontend_bit, word_of};
    let has = |maps: &FakeMaps, bit: u32| {
        let (word, mask) = word_of(bit);
        maps.filter.get(&word).is_some_and(|w| w & mask != 0)
    };
    let backend = [198, 18, 1, 2];
    let web = state(vec![service(
        "web",
        VIP,
        80,
        Protocol::Tcp,
        vec![ep(backend, 8080)],
    )]);
    let to_web = frontend_bit::<V4>(&be(VIP), 80u16.to_be(), proto::TCP);
    let from_backend = backend_bit::<V4>(&be(backend), 8080u16.to_be(), proto::TCP);
    let to_backend = frontend_bit::<V4>(&be(backend), 8080u16.to_be(), proto::TCP);

    let mut maps = FakeMaps::default();
    let mut p = Programmer::new();
    p.sync(&web, &mut maps).unwrap();
    assert!(has(&maps, to_web) && has(&maps, from_backend));
    assert!(!has(&maps, to_backend), "a backend is not a frontend");

    p.sync(&state(vec![]), &mut maps).unwrap();
    assert!(maps.filter.values().all(|w| *w == 0), "every bit cleared");

    // Pins whose every bit is set, as if by services gone since: the next
    // agent leaves only its own.
    p.sync(&web, &mut maps).unwrap();
    for word in 0..FILTER_WORDS {
        maps.filter.insert(word, u64::MAX);
    }
    let mut next = Programmer::new();
    next.adopt(&snapshot(&maps), &web, &node(&[]));
    next.sync(&web, &mut maps).unwrap();
    let set: u32 = maps.filter.values().map(|w| w.count_ones()).sum();
    assert_eq!(set, 2, "only the frontend's and the backend's bits");
    assert!(has(&maps, to_web) && has(&maps, from_backend));
    assert!(!has(&maps, to_backend));
}
