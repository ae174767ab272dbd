//! The monitor channel in the real programs: while a lease is held, a
//! reject, a drop and a new flow each leave exactly the expected event in
//! the monitor's own ring buffer; without one (or once it is released or
//! has run out) nothing is reported. Packets through BPF_PROG_TEST_RUN.

use std::net::Ipv4Addr;

use aya::maps::{Array, IterableMap as _, Map, MapData, RingBuf};
use proxy_agent::{
    cli::packet::Frame,
    modes::ebpf::{
        self,
        monitor::{Events, Lease, LeaseError, Reported, Wanted, monotonic_ns},
        test_run::Hook,
    },
};
use proxy_common::{
    Counter, MonitorEvent, MonitorSlot,
    action::TC_ACT_SHOT,
    maps as names,
    monitor::{MONITOR_SLOTS, event_flags, hook, kind},
    proto,
};

use crate::tester::{Datapath, web_service};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

struct Fixture {
    dp: Datapath,
    control_id: u32,
    /// Each slot's ring.
    rings: Vec<Events>,
}

/// A handle on the fixture's `MONITOR`, as each monitor process opens its own.
fn control(f: &Fixture) -> Array<MapData, MonitorSlot> {
    let data = MapData::from_id(f.control_id).unwrap();
    Map::from_map_data(data).unwrap().try_into().unwrap()
}

fn fixture(backends: &[Ipv4Addr]) -> Fixture {
    let mut ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
    let control: Array<MapData, MonitorSlot> =
        ebpf.take_map(names::MONITOR).unwrap().try_into().unwrap();
    let control_id = control.map().info().unwrap().id();
    let rings = names::MONITOR_RINGS
        .iter()
        .map(|name| {
            let ring: RingBuf<MapData> = ebpf.take_map(name).unwrap().try_into().unwrap();
            Events::new(ring)
        })
        .collect();
    let mut dp = Datapath::new(ebpf, 0, 0);
    dp.programmer
        .sync(&web_service(VIP, backends, 8080), &mut dp.maps)
        .unwrap();
    Fixture {
        dp,
        control_id,
        rings,
    }
}

impl Fixture {
    /// Every slot's IPv4 events, by slot (there must be no other).
    fn drain(&mut self) -> Vec<Vec<MonitorEvent>> {
        self.drain_all()
            .into_iter()
            .map(|slot| {
                slot.iter()
                    .map(|r| *r.v4().unwrap_or_else(|| panic!("an IPv6 report: {r:?}")))
                    .collect()
            })
            .collect()
    }

    fn drain_all(&mut self) -> Vec<Vec<Reported>> {
        self.rings.iter_mut().map(Events::drain).collect()
    }
}

fn syn(sport: u16) -> Vec<u8> {
    Frame::tcp(CLIENT, sport, VIP, 80).build(b"")
}

fn be(a: Ipv4Addr) -> u32 {
    u32::from(a).to_be()
}

const DROPS: Wanted = Wanted {
    drops: true,
    flows: false,
};
const FLOWS: Wanted = Wanted {
    drops: false,
    flows: true,
};

#[test]
fn nothing_is_reported_while_no_monitor_holds_a_lease() {
    let mut f = fixture(&[]);
    let out = f.dp.run(Hook::FromPod, &syn(40000));
    assert_ne!(out.verdict, TC_ACT_SHOT, "rejected with a RST");
    assert_eq!(f.dp.counter(Counter::RejectNoEndpoints), 1);
    assert!(f.drain().iter().all(Vec::is_empty));
}

#[test]
fn a_reject_and_a_malformed_drop_are_reported_with_their_reason() {
    let mut f = fixture(&[]);
    let before = monotonic_ns();
    let lease = Lease::take(control(&f), DROPS).unwrap();
    f.dp.run(Hook::FromPod, &syn(40000));
    // A TCP packet cut inside its header.
    let mut cut = syn(40001);
    cut.truncate(14 + 20 + 10);
    cut[16..18].copy_from_slice(&30u16.to_be_bytes());
    assert_eq!(f.dp.run(Hook::FromNetdev, &cut).verdict, TC_ACT_SHOT);
    let mut by_slot = f.drain();
    let events = std::mem::take(&mut by_slot[lease.slot()]);
    assert!(
        by_slot.iter().all(Vec::is_empty),
        "other slots: {by_slot:?}"
    );
    assert_eq!(events.len(), 2, "{events:#?}");
    let (reject, malformed) = (events[0], events[1]);
    assert!(reject.time_ns >= before && reject.time_ns <= monotonic_ns());
    assert_eq!(
        reject,
        MonitorEvent {
            time_ns: reject.time_ns,
            ifindex: reject.ifindex,
            kind: kind::REJECT,
            hook: hook::FROM_POD,
            reason: Counter::RejectNoEndpoints as u8,
            proto: proto::TCP,
            saddr_be: be(CLIENT),
            daddr_be: be(VIP),
            sport_be: 40000u16.to_be(),
            dport_be: 80u16.to_be(),
            ..MonitorEvent::default()
        }
    );
    assert_eq!(
        (
            malformed.kind,
            malformed.hook,
            malformed.reason,
            malformed.saddr_be
        ),
        (
            kind::DROP,
            hook::FROM_NETDEV,
            Counter::DropMalformed as u8,
            0
        ),
        "{malformed:?}"
    );
}

#[test]
fn each_monitor_gets_its_kinds_in_its_own_ring_and_established_packets_never() {
    let mut f = fixture(&[BACKEND]);
    let mut drops = Lease::take(control(&f), DROPS).unwrap();
    let mut flows = Lease::take(control(&f), FLOWS).unwrap();
    assert_ne!(drops.slot(), flows.slot());
    let out = f.dp.run(Hook::FromPod, &syn(40001));
    let again = f.dp.run(Hook::FromPod, &syn(40001));
    assert_eq!(out.packet, again.packet, "the second SYN is established");
    let mut by_slot = f.drain();
    assert!(
        by_slot[drops.slot()].is_empty(),
        "a drops monitor sees no flows"
    );
    let events = std::mem::take(&mut by_slot[flows.slot()]);
    assert_eq!(events.len(), 1, "{events:#?}");
    let flow = events[0];
    assert_eq!(
        flow,
        MonitorEvent {
            time_ns: flow.time_ns,
            ifindex: flow.ifindex,
            kind: kind::FLOW,
            hook: hook::FROM_POD,
            reason: Counter::NewFlow as u8,
            proto: proto::TCP,
            saddr_be: be(CLIENT),
            daddr_be: be(VIP),
            sport_be: 40001u16.to_be(),
            dport_be: 80u16.to_be(),
            service_id: flow.service_id,
            backend_id: flow.backend_id,
            nat_saddr_be: be(CLIENT),
            nat_daddr_be: be(BACKEND),
            nat_sport_be: 40001u16.to_be(),
            nat_dport_be: 8080u16.to_be(),
            flags: 0,
            family: 0,
            _pad: [0; 3],
        }
    );
    assert!(flow.service_id != 0 && flow.backend_id != 0, "{flow:?}");
    assert_eq!(
        flow.flags & event_flags::SNAT,
        0,
        "a pod's flow is not masqueraded"
    );

    // The flows monitor leaves; the drops monitor keeps its lease.
    flows.release().unwrap();
    f.dp.run(Hook::FromPod, &syn(40002));
    assert!(
        f.drain().iter().all(Vec::is_empty),
        "no flows monitor any more"
    );
    let slot = control(&f).get(&(drops.slot() as u32), 0).unwrap();
    assert!(slot.drops_until_ns > monotonic_ns(), "{slot:?}");
    drops.renew().unwrap();
    drops.release().unwrap();
    let slot = control(&f).get(&(drops.slot() as u32), 0).unwrap();
    assert!(slot.drops_until_ns <= monotonic_ns(), "{slot:?}");
}

#[test]
fn a_lease_nobody_renews_ends_by_itself_and_frees_its_slot() {
    let mut f = fixture(&[BACKEND]);
    // What a monitor killed with -9 leaves: a lease that runs out.
    let soon = monotonic_ns() + 100_000_000;
    let dead = MonitorSlot {
        drops_until_ns: soon,
        flows_until_ns: soon,
        owner: 1,
        _pad: 0,
    };
    control(&f).set(0, dead, 0).unwrap();
    f.dp.run(Hook::FromPod, &syn(40000));
    assert_eq!(f.drain()[0].len(), 1, "reported while the lease runs");
    let busy = Lease::take(control(&f), DROPS).unwrap();
    assert_ne!(busy.slot(), 0, "a running lease keeps its slot");
    std::thread::sleep(std::time::Duration::from_millis(150));
    f.dp.run(Hook::FromPod, &syn(40001));
    assert!(f.drain()[0].is_empty(), "the lease ran out");
    let next = Lease::take(control(&f), DROPS).unwrap();
    assert_eq!(next.slot(), 0, "an expired slot is free again");
}

#[test]
fn no_more_monitors_than_slots_run_at_once() {
    let f = fixture(&[BACKEND]);
    let held: Vec<Lease> = (0..MONITOR_SLOTS)
        .map(|_| Lease::take(control(&f), FLOWS).unwrap())
        .collect();
    let slots: std::collections::BTreeSet<usize> = held.iter().map(Lease::slot).collect();
    assert_eq!(slots.len(), MONITOR_SLOTS);
    let refused = Lease::take(control(&f), FLOWS).err().unwrap();
    assert!(matches!(refused, LeaseError::Full), "{refused}");
}

#[test]
fn a_full_ring_counts_every_event_it_could_not_hold() {
    let mut f = fixture(&[BACKEND]);
    let lease = Lease::take(control(&f), FLOWS).unwrap();
    // More new flows than a 256 KiB ring holds, none read meanwhile.
    let sent = 6000u16;
    for i in 0..sent {
        f.dp.run(Hook::FromPod, &syn(20000 + i));
    }
    let received = f.drain()[lease.slot()].len() as u64;
    let lost = f.dp.counter(Counter::MonitorLost);
    assert!(lost > 0, "the ring never filled ({received} received)");
    assert_eq!(
        received + lost,
        u64::from(sent),
        "{received} received, {lost} lost"
    );
}

#[test]
fn an_ipv6_flow_and_reject_are_reported_in_the_ipv6_layout() {
    use proxy_agent::model::{DesiredService, Endpoint, Protocol, ServicePortName};
    use std::net::{IpAddr, Ipv6Addr};

    use crate::datapath_ipv6::V6Frame;

    let (client, vip, empty, backend): (Ipv6Addr, Ipv6Addr, Ipv6Addr, Ipv6Addr) = (
        "2001:db8:1::2".parse().unwrap(),
        "2001:db8:ffff::10".parse().unwrap(),
        "2001:db8:ffff::11".parse().unwrap(),
        "2001:db8:2::2".parse().unwrap(),
    );
    let mut f = fixture(&[]);
    let name = |n: &str| {
        ServicePortName::new(
            &proxy_agent::model::NamespacedName::new("demo", n),
            "",
            Protocol::Tcp,
        )
    };
    f.dp.program(vec![
        DesiredService::cluster_ip(
            name("web6"),
            vec![IpAddr::V6(vip)],
            80,
            vec![Endpoint::new(IpAddr::V6(backend), 8080)],
        ),
        DesiredService::cluster_ip(name("empty6"), vec![IpAddr::V6(empty)], 80, vec![]),
    ]);
    let lease = Lease::take(
        control(&f),
        Wanted {
            drops: true,
            flows: true,
        },
    )
    .unwrap();
    f.dp.run(
        Hook::FromPod,
        &V6Frame::tcp(client, 40000, vip, 80).build(b""),
    );
    f.dp.run(
        Hook::FromPod,
        &V6Frame::tcp(client, 40001, empty, 80).build(b""),
    );
    let events = std::mem::take(&mut f.drain_all()[lease.slot()]);
    assert_eq!(events.len(), 2, "{events:#?}");
    let (flow, reject) = (
        events[0].v6().copied().unwrap(),
        events[1].v6().copied().unwrap(),
    );
    assert_eq!(flow.family, 10, "AF_INET6 marks an IPv6 event");
    assert_eq!(flow.kind, kind::FLOW);
    let report = events[0].report();
    assert_eq!(report.source, "[2001:db8:1::2]:40000".parse().unwrap());
    assert_eq!(
        report.destination,
        "[2001:db8:ffff::10]:80".parse().unwrap()
    );
    assert_eq!(
        report.translated_destination,
        "[2001:db8:2::2]:8080".parse().unwrap()
    );
    assert_eq!(reject.kind, kind::REJECT);
    assert_eq!(reject.reason, Counter::RejectNoEndpoints as u8);
    assert_eq!(
        events[1].report().destination,
        "[2001:db8:ffff::11]:80".parse().unwrap()
    );
}
