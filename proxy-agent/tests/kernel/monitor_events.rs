//! The monitor channel in the real programs: while a lease is held, a
//! reject, a drop and a new flow each leave exactly the expected event in
//! the ring buffer; without one (or once it is released) nothing is
//! reported. Packets through BPF_PROG_TEST_RUN.

use std::net::Ipv4Addr;

use aya::maps::{Array, IterableMap as _, Map, MapData, RingBuf};
use proxy_agent::{
    cli::packet::Frame,
    modes::ebpf::{
        self,
        monitor::{Events, Lease, Wanted, monotonic_ns},
        test_run::Hook,
    },
};
use proxy_common::{
    Counter, MonitorControl, MonitorEvent,
    action::TC_ACT_SHOT,
    maps as names,
    monitor::{event_flags, hook, kind},
    proto,
};

use crate::tester::{Datapath, web_service};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

struct Fixture {
    dp: Datapath,
    control_id: u32,
    events: Events,
}

/// A handle on the fixture's `MONITOR`, as each monitor process opens its own.
fn control(f: &Fixture) -> Array<MapData, MonitorControl> {
    let data = MapData::from_id(f.control_id).unwrap();
    Map::from_map_data(data).unwrap().try_into().unwrap()
}

fn fixture(backends: &[Ipv4Addr]) -> Fixture {
    let mut ebpf = ebpf::load().expect("load the eBPF object (are we root?)");
    let control: Array<MapData, MonitorControl> =
        ebpf.take_map(names::MONITOR).unwrap().try_into().unwrap();
    let control_id = control.map().info().unwrap().id();
    let ring: RingBuf<MapData> = ebpf
        .take_map(names::MONITOR_EVENTS)
        .unwrap()
        .try_into()
        .unwrap();
    let mut dp = Datapath::new(ebpf, 0, 0);
    dp.programmer
        .sync(&web_service(VIP, backends, 8080), &mut dp.maps)
        .unwrap();
    Fixture {
        dp,
        control_id,
        events: Events::new(ring),
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
    assert!(f.events.drain().is_empty());
}

#[test]
fn a_reject_and_a_malformed_drop_are_reported_with_their_reason() {
    let mut f = fixture(&[]);
    let before = monotonic_ns();
    let _lease = Lease::take(control(&f), DROPS).unwrap();
    f.dp.run(Hook::FromPod, &syn(40000));
    // A TCP packet cut inside its header.
    let mut cut = syn(40001);
    cut.truncate(14 + 20 + 10);
    cut[16..18].copy_from_slice(&30u16.to_be_bytes());
    assert_eq!(f.dp.run(Hook::FromNetdev, &cut).verdict, TC_ACT_SHOT);
    let events = f.events.drain();
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
fn new_flows_reach_a_flows_lease_only_and_established_packets_never() {
    let mut f = fixture(&[BACKEND]);
    let mut drops = Lease::take(control(&f), DROPS).unwrap();
    f.dp.run(Hook::FromPod, &syn(40000));
    assert!(f.events.drain().is_empty(), "a drops lease sees no flows");

    let mut flows = Lease::take(control(&f), FLOWS).unwrap();
    let out = f.dp.run(Hook::FromPod, &syn(40001));
    let again = f.dp.run(Hook::FromPod, &syn(40001));
    assert_eq!(out.packet, again.packet, "the second SYN is established");
    let events = f.events.drain();
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
            _pad: 0,
        }
    );
    assert!(flow.service_id != 0 && flow.backend_id != 0, "{flow:?}");
    assert_eq!(
        flow.flags & event_flags::SNAT,
        0,
        "a pod's flow is not masqueraded"
    );

    // The flows monitor leaves: the drops monitor keeps its own lease.
    flows.release().unwrap();
    f.dp.run(Hook::FromPod, &syn(40002));
    assert!(f.events.drain().is_empty(), "no flows monitor any more");
    let current = control(&f).get(&0, 0).unwrap();
    assert!(current.drops_until_ns > monotonic_ns(), "{current:?}");
    drops.renew().unwrap();
    drops.release().unwrap();
    let current = control(&f).get(&0, 0).unwrap();
    assert!(current.drops_until_ns <= monotonic_ns(), "{current:?}");
}

#[test]
fn a_lease_nobody_renews_ends_by_itself() {
    let mut f = fixture(&[BACKEND]);
    // What a monitor killed with -9 leaves: a lease that runs out.
    let soon = monotonic_ns() + 100_000_000;
    control(&f)
        .set(
            0,
            MonitorControl {
                drops_until_ns: soon,
                flows_until_ns: soon,
            },
            0,
        )
        .unwrap();
    f.dp.run(Hook::FromPod, &syn(40000));
    assert_eq!(f.events.drain().len(), 1, "reported while the lease runs");
    std::thread::sleep(std::time::Duration::from_millis(150));
    f.dp.run(Hook::FromPod, &syn(40001));
    assert!(f.events.drain().is_empty(), "the lease ran out");
}
