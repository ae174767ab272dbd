//! Starting over a pinned datapath, in the real kernel: maps of this ABI are
//! taken over as they are; maps of the previous ABIs (version 5, whose
//! conntrack keys named the half of the flow, version 4, also without the
//! SOCKETS map and with an 8 bytes shorter CONFIG, and version 3, whose
//! CONFIG was 32 bytes shorter) are migrated so an established flow keeps its
//! backend and its replies their translation; an unknown version or a layout that does not match is refused,
//! naming what it found, and the pins are left as they were; the IPv6 maps
//! the affinity pins and the Maglev tables are taken over too. Needs root.

use std::{net::Ipv4Addr, path::PathBuf};

use aya::maps::{Array, HashMap, Map, MapData};

use crate::{
    abi5::{conntrack_to_abi_5, conntrack_to_lru, services_to_abi_6},
    bpffs::BpfFs,
    tester::{tcp_segment, web_service},
};
use proxy_agent::{
    cli::packet::{Frame, tcp_flags},
    modes::ebpf::{
        MapSizes, Opened, Programmer, Takeover,
        family::AgentFamily as _,
        maps::NodeMaps,
        migrate::{v3, v4, v5},
        open_pinned,
        pin::PinLayout,
        test_run,
    },
};
use proxy_common::{
    ABI_VERSION, Counter, CtKey, CtKey6, CtValue, DatapathConfig, V4, V6, conntrack::flags,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 2, 2),
    Ipv4Addr::new(198, 18, 2, 3),
    Ipv4Addr::new(198, 18, 2, 4),
];

fn root(fs: &BpfFs) -> PathBuf {
    fs.dir.join("kube-ebpf-proxy")
}

fn sizes() -> MapSizes {
    MapSizes {
        conntrack: 4096,
        ..MapSizes::default()
    }
}

fn program(opened: &mut Opened) {
    let state = web_service(VIP, &BACKENDS, 8080);
    Programmer::new().sync(&state, &mut opened.maps).unwrap();
}

/// A TCP segment with `flags` through `tc_from_pod` of `opened`.
fn send(opened: &Opened, frame: Frame, flags: u8) -> Frame {
    let out = test_run::from_pod(&opened.ebpf, &tcp_segment(frame, flags)).unwrap();
    Frame::parse(&out.packet).unwrap()
}

fn counter(opened: &Opened, c: Counter) -> u64 {
    opened.counters.get(&(c as u32), 0).unwrap().iter().sum()
}

fn conntrack_entries(opened: &Opened) -> usize {
    let ct: &HashMap<MapData, CtKey, CtValue> = &opened.maps.conntrack;
    ct.keys().filter_map(Result::ok).count()
}

fn error_of(result: anyhow::Result<Opened>) -> String {
    match result {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn maps_of_abi_7_are_migrated_and_established_flows_keep_their_backend() {
    migrates_from(7);
}

#[test]
fn maps_of_abi_6_are_migrated_and_established_flows_keep_their_backend() {
    migrates_from(6);
}

#[test]
fn maps_of_abi_5_are_migrated_and_established_flows_keep_their_backend() {
    migrates_from(5);
}

#[test]
fn maps_of_abi_4_are_migrated_and_established_flows_keep_their_backend() {
    migrates_from(4);
}

#[test]
fn maps_of_abi_3_are_migrated_and_established_flows_keep_their_backend() {
    migrates_from(3);
}

/// Pins of this version, dressed up as `version`'s (its directory, its
/// conntrack and CONFIG layouts, no SOCKETS map before 5), migrated by the
/// next start.
fn migrates_from(version: u32) {
    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));

    // An agent of this version pins a datapath; a client opens a connection.
    let mut first = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(first.takeover, Takeover::Fresh);
    program(&mut first);
    let syn = send(&first, Frame::tcp(CLIENT, 40000, VIP, 80), tcp_flags::SYN);
    let backend = syn.dst;
    send(&first, syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
    let flows = conntrack_entries(&first);
    assert_eq!(flows, 2, "forward and reply entries");
    drop(first);

    // Dress the pins up as `version`: the same maps under v<version>/, with
    // that version's CONFIG and without the map it did not have.
    let old_dir = root(&fs).join(format!("v{version}/maps"));
    std::fs::rename(
        root(&fs).join(format!("v{ABI_VERSION}")),
        root(&fs).join(format!("v{version}")),
    )
    .unwrap();
    // No collector before 8, and LRU conntrack tables.
    std::fs::remove_file(old_dir.join("CT_COLLECTOR")).unwrap();
    if version <= 5 {
        assert_eq!(
            conntrack_to_abi_5::<V4>(&fs, &old_dir.join("CONNTRACK")),
            flows
        );
    } else {
        conntrack_to_lru::<V4>(&fs, &old_dir.join("CONNTRACK"));
        conntrack_to_lru::<V6>(&fs, &old_dir.join("CONNTRACK6"));
    }
    if version == 5 {
        to_abi_5_conntrack6(&fs, &old_dir);
    }
    if version <= 6 {
        // Frontend, its marker and its three slots.
        assert_eq!(
            services_to_abi_6::<V4>(&fs, &old_dir, "SERVICES", "SLOTS"),
            5
        );
        services_to_abi_6::<V6>(&fs, &old_dir, "SERVICES6", "SLOTS6");
    }
    let masquerade_addr_be = u32::from(Ipv4Addr::new(198, 18, 0, 1)).to_be();
    let expected = if version >= 5 {
        let config: Array<MapData, DatapathConfig> =
            Map::from_map_data(MapData::from_pin(old_dir.join("CONFIG")).unwrap())
                .unwrap()
                .try_into()
                .unwrap();
        config.get(&0, 0).unwrap()
    } else if version == 3 {
        std::fs::remove_file(old_dir.join("CONFIG")).unwrap();
        std::fs::remove_file(old_dir.join("SOCKETS")).unwrap();
        fs.pin_map_of(&old_dir.join("CONFIG"), "array", 4, 48, 1);
        let mut config: Array<MapData, v3::DatapathConfig> =
            Map::from_map_data(MapData::from_pin(old_dir.join("CONFIG")).unwrap())
                .unwrap()
                .try_into()
                .unwrap();
        let old = v3::DatapathConfig {
            tcp_established_ns: 7_200_000_000_000,
            tcp_closing_ns: 60_000_000_000,
            udp_ns: 30_000_000_000,
            udp_stream_ns: 120_000_000_000,
            masquerade_addr_be,
            flags: 1,
            snat_port_min: 61_000,
            snat_port_max: 65_535,
            _pad: 0,
        };
        config.set(0, old, 0).unwrap();
        DatapathConfig {
            tcp_established_ns: old.tcp_established_ns,
            tcp_closing_ns: old.tcp_closing_ns,
            udp_ns: old.udp_ns,
            udp_stream_ns: old.udp_stream_ns,
            masquerade_addr_be: old.masquerade_addr_be,
            flags: old.flags,
            snat_port_min: old.snat_port_min,
            snat_port_max: old.snat_port_max,
            ..DatapathConfig::default()
        }
    } else {
        std::fs::remove_file(old_dir.join("CONFIG")).unwrap();
        std::fs::remove_file(old_dir.join("SOCKETS")).unwrap();
        fs.pin_map_of(&old_dir.join("CONFIG"), "array", 4, 72, 1);
        let mut config: Array<MapData, v4::DatapathConfig> =
            Map::from_map_data(MapData::from_pin(old_dir.join("CONFIG")).unwrap())
                .unwrap()
                .try_into()
                .unwrap();
        // SYN_SENT's timeout long enough that the collector cannot take the
        // fresh flow's halves before the third start counts them on a busy
        // machine (1 s did, once, in CI).
        let old = v4::DatapathConfig {
            tcp_established_ns: 7_200_000_000_000,
            tcp_closing_ns: 60_000_000_000,
            udp_ns: 30_000_000_000,
            udp_stream_ns: 120_000_000_000,
            tcp_syn_sent_ns: 90_000_000_000,
            tcp_time_wait_ns: 2_000_000_000,
            tcp_close_ns: 3_000_000_000,
            masquerade_addr_be,
            flags: 3,
            snat_port_min: 62_000,
            snat_port_max: 65_000,
            _pad: 0,
        };
        config.set(0, old, 0).unwrap();
        DatapathConfig {
            tcp_established_ns: 7_200_000_000_000,
            tcp_closing_ns: 60_000_000_000,
            udp_ns: 30_000_000_000,
            udp_stream_ns: 120_000_000_000,
            tcp_syn_sent_ns: 90_000_000_000,
            tcp_time_wait_ns: 2_000_000_000,
            tcp_close_ns: 3_000_000_000,
            masquerade_addr_be,
            flags: 3,
            snat_port_min: 62_000,
            snat_port_max: 65_000,
            snat_port_min2: 0,
            snat_port_max2: 0,
            host_netns_cookie: 0,
        }
    };

    // The new agent migrates them.
    let mut second = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(
        second.takeover,
        Takeover::Migrate {
            version,
            dir: old_dir.clone()
        }
    );
    assert!(
        !root(&fs).join(format!("v{version}")).exists(),
        "the old pins are removed"
    );
    assert!(
        layout.maps_dir().join("SOCKETS").exists(),
        "the new map is pinned"
    );
    assert!(layout.maps_dir().join("CONFIG").exists());
    assert!(layout.maps_dir().join("CT_COLLECTOR").exists());
    let migrated = second.maps.config.get(&0, 0).unwrap();
    assert_eq!(migrated, expected);
    assert_eq!(conntrack_entries(&second), flows);
    let next = send(&second, Frame::tcp(CLIENT, 40000, VIP, 80), tcp_flags::ACK);
    assert_eq!(next.dst, backend, "the established flow keeps its backend");
    assert_eq!(counter(&second, Counter::Established), 1);
    let answer = send(&second, next.reply(), tcp_flags::ACK);
    assert_eq!(answer.src, VIP, "its replies are still translated");
    assert_eq!(counter(&second, Counter::ReplyNat), 2);
    if version == 5 {
        let (k, v) = abi_5_reply6();
        let key = CtKey6::new(k.saddr_be, k.daddr_be, k.sport_be, k.dport_be, k.proto);
        let migrated = second.maps.v6.conntrack.get(&key, 0).unwrap();
        assert_eq!(migrated.flags, v.flags | flags::REPLY, "an IPv6 reply half");
        assert_eq!(migrated.nat_addr_be, v.nat_addr_be);
    }
    assert_eq!(
        counter(&second, Counter::NewFlow),
        1,
        "counters were copied"
    );
    let fresh = send(&second, Frame::tcp(CLIENT, 40001, VIP, 80), tcp_flags::SYN);
    assert!(
        BACKENDS
            .iter()
            .any(|b| fresh.dst == std::net::IpAddr::V4(*b)),
        "a new flow is balanced over the migrated slots: {:?}",
        fresh.dst
    );
    second.maps.put_config(&migrated).unwrap();
    drop(second);

    // The next start finds this version's maps and takes them over as they are.
    let third = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(third.takeover, Takeover::Adopt);
    assert_eq!(
        conntrack_entries(&third),
        flows + 2,
        "and the new flow's halves"
    );
}

/// An IPv6 flow's reply half as ABI 5 keyed it.
fn abi_5_reply6() -> (v5::CtKeyOf<V6>, v5::CtValueOf<V6>) {
    let ip = |s: &str| V6::to_be(s.parse::<std::net::Ipv6Addr>().unwrap());
    let key = v5::CtKeyOf::<V6> {
        saddr_be: ip("2001:db8:2::2"),
        daddr_be: ip("2001:db8:1::2"),
        sport_be: 8080u16.to_be(),
        dport_be: 40000u16.to_be(),
        proto: 6,
        direction: 1,
        _pad: [0; 2],
    };
    let value = v5::CtValueOf::<V6> {
        nat_addr_be: ip("2001:db8:19::10"),
        nat_port_be: 80u16.to_be(),
        flags: flags::SEEN_REPLY,
        last_seen_ns: 1,
        ..Default::default()
    };
    (key, value)
}

/// Replaces the pinned IPv6 conntrack map in `dir` by one of ABI 5's
/// layout holding [`abi_5_reply6`].
fn to_abi_5_conntrack6(fs: &BpfFs, dir: &std::path::Path) {
    let path = dir.join("CONNTRACK6");
    std::fs::remove_file(&path).unwrap();
    fs.pin_map_of(&path, "lru_hash", 40, 64, 1024);
    let mut old: HashMap<MapData, v5::CtKeyOf<V6>, v5::CtValueOf<V6>> =
        Map::from_map_data(MapData::from_pin(&path).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    let (key, value) = abi_5_reply6();
    old.insert(key, value, 0).unwrap();
}

#[test]
fn an_unknown_abi_version_or_a_mismatched_layout_is_refused_and_left_alone() {
    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    std::fs::create_dir_all(root(&fs).join("v9/maps")).unwrap();
    let err = error_of(open_pinned(&layout, sizes()));
    assert!(
        err.contains("ABI version 9") && err.contains(&format!("version {ABI_VERSION}")),
        "{err}"
    );
    assert!(err.contains("keeps serving"), "{err}");
    assert!(root(&fs).join("v9/maps").exists(), "nothing was touched");

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let dir = layout.maps_dir();
    std::fs::create_dir_all(&dir).unwrap();
    fs.pin_map_of(&dir.join("CONFIG"), "array", 4, 48, 1);
    let err = error_of(open_pinned(&layout, sizes()));
    assert!(
        err.contains("CONFIG") && err.contains("value size") && err.contains("pinned 48"),
        "{err}"
    );
}

#[test]
fn a_fresh_bpffs_mount_root_works_as_the_pin_root() {
    let fs = BpfFs::new();
    let root = fs.dir.clone();
    assert!(root.join("progs.debug").exists(), "the kernel's own pins");
    let layout = PinLayout::new(&root);
    let first = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(first.takeover, Takeover::Fresh);
    drop(first);
    let second = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(second.takeover, Takeover::Adopt);
    drop(second);

    // Removing our pins (detach on exit, or --cleanup) leaves the kernel's alone.
    assert!(layout.remove_all().unwrap() > 0);
    assert!(!layout.maps_dir().exists());
    assert!(root.join("progs.debug").exists() && root.join("maps.debug").exists());
    let mut report = proxy_agent::cleanup::Report::default();
    let again = open_pinned(&layout, sizes()).unwrap();
    drop(again);
    proxy_agent::modes::ebpf::cleanup::remove_pins(&root, &mut report);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!report.removed.is_empty());
    assert!(
        root.join("progs.debug").exists(),
        "--cleanup leaves the kernel's pins"
    );
}

/// The IPv6 maps are pinned and taken over as the IPv4 ones are: an IPv6
/// flow opened before a restart keeps its backend after it, and so does a
/// client pinned by session affinity.
#[test]
fn ipv6_flows_and_affinity_pins_survive_a_restart() {
    use proxy_agent::model::SessionAffinity;
    use std::net::{IpAddr, Ipv6Addr};

    let client = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2));
    let vip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x10));
    let backends: Vec<IpAddr> = (2..5)
        .map(|h| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, h)))
        .collect();
    let mut state = web_service(vip, &backends, 8080);
    for svc in state.services.values_mut() {
        svc.session_affinity = SessionAffinity::ClientIp {
            timeout_seconds: 10_800,
        };
    }
    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut first = open_pinned(&layout, sizes()).unwrap();
    Programmer::new().sync(&state, &mut first.maps).unwrap();
    let syn = send(&first, Frame::tcp(client, 40000, vip, 80), tcp_flags::SYN);
    let backend = syn.dst;
    assert!(backends.contains(&backend));
    send(&first, syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
    drop(first);
    for map in ["CONNTRACK6", "SERVICES6", "BACKENDS6", "AFFINITY6"] {
        assert!(layout.maps_dir().join(map).exists(), "{map} pinned");
    }

    let second = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(second.takeover, Takeover::Adopt);
    let next = send(&second, Frame::tcp(client, 40000, vip, 80), tcp_flags::ACK);
    assert_eq!(
        next.dst, backend,
        "the established IPv6 flow keeps its backend"
    );
    assert_eq!(counter(&second, Counter::Established), 1);
    // A new connection of the same client follows its pin.
    let again = send(&second, Frame::tcp(client, 40001, vip, 80), tcp_flags::SYN);
    assert_eq!(again.dst, backend, "the affinity pin survived");
    assert_eq!(counter(&second, Counter::AffinityHit), 1);
}

#[test]
fn maglev_tables_survive_a_restart_unchanged() {
    use proxy_agent::model::Balancing;
    use proxy_agent::modes::ebpf::{MaglevSettings, node::NodeAddresses};
    use proxy_common::maglev::chunks_per_table;

    const M: u32 = 251;
    let settings = MaglevSettings {
        table_size: M,
        by_default: false,
    };
    let sizes = MapSizes {
        maglev: 4 * chunks_per_table(M),
        ..sizes()
    };
    let backends: Vec<Ipv4Addr> = (10..15).map(|h| Ipv4Addr::new(198, 18, 2, h)).collect();
    let mut state = web_service(VIP, &backends, 8080);
    for svc in state.services.values_mut() {
        svc.balancing = Balancing::Maglev;
    }
    let choices = |opened: &Opened, first_port: u16| -> Vec<std::net::IpAddr> {
        (first_port..first_port + 200)
            .map(|sport| send(opened, Frame::tcp(CLIENT, sport, VIP, 80), tcp_flags::SYN).dst)
            .collect()
    };

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut first = open_pinned(&layout, sizes).unwrap();
    let mut programmer = Programmer::new();
    programmer.set_capacity(first.maps.capacity());
    programmer.set_maglev(settings);
    programmer.sync(&state, &mut first.maps).unwrap();
    let before = choices(&first, 20_000);
    let services = first.maps.service_snapshot::<proxy_common::V4>().unwrap();
    drop(first);
    assert!(layout.maps_dir().join("MAGLEV").exists(), "MAGLEV pinned");

    let mut second = open_pinned(&layout, sizes).unwrap();
    assert_eq!(second.takeover, Takeover::Adopt);
    let mut programmer = Programmer::new();
    programmer.set_capacity(second.maps.capacity());
    programmer.set_maglev(settings);
    let snapshot4 = second.maps.service_snapshot::<proxy_common::V4>().unwrap();
    let snapshot6 = second.maps.service_snapshot::<proxy_common::V6>().unwrap();
    programmer.adopt(
        (&snapshot4, &snapshot6),
        &state,
        (&NodeAddresses::default(), &Default::default()),
    );
    let stats = programmer.sync(&state, &mut second.maps).unwrap();
    assert_eq!(stats.writes, 0, "no service entry rewritten");
    assert_eq!(
        second
            .maps
            .service_snapshot::<proxy_common::V4>()
            .unwrap()
            .services,
        services.services,
        "the table references are the ones pinned"
    );
    // The first agent's tuples, once their flows are gone, are balanced
    // by the adopted tables as before.
    let fresh_ct: Vec<_> = {
        use aya::maps::HashMap;
        let ct: &HashMap<MapData, CtKey, CtValue> = &second.maps.conntrack;
        ct.keys().filter_map(Result::ok).collect()
    };
    for key in fresh_ct {
        second.maps.conntrack.remove(&key).unwrap();
    }
    assert_eq!(
        choices(&second, 20_000),
        before,
        "the same tuples, the same backends"
    );
}

/// The conntrack collector is the datapath's, not the agent's: after the
/// agent that armed it is gone, it still sweeps the pinned tables and
/// deletes the flows whose timeout passed, and a new agent takes it over.
#[test]
fn the_conntrack_collector_keeps_sweeping_after_the_agent_is_gone() {
    use proxy_agent::modes::ebpf::collector::Value;
    use proxy_common::collector::SWEEP_INTERVAL_NS;

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut first = open_pinned(&layout, sizes()).unwrap();
    program(&mut first);
    first
        .maps
        .put_config(&DatapathConfig {
            tcp_close_ns: 100_000_000,
            ..DatapathConfig::default()
        })
        .unwrap();
    for sport in [40000, 40001] {
        let syn = send(&first, Frame::tcp(CLIENT, sport, VIP, 80), tcp_flags::SYN);
        send(&first, syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
    }
    // One flow is reset (gone after 100 ms), the other stays.
    send(
        &first,
        Frame::tcp(CLIENT, 40000, VIP, 80),
        tcp_flags::RST | tcp_flags::ACK,
    );
    assert_eq!(conntrack_entries(&first), 4);
    drop(first);

    // No agent: only the pins hold the datapath.
    std::thread::sleep(std::time::Duration::from_nanos(
        SWEEP_INTERVAL_NS + 1_500_000_000,
    ));
    let pinned = |name: &str| {
        Map::from_map_data(MapData::from_pin(layout.maps_dir().join(name)).unwrap()).unwrap()
    };
    let conntrack: HashMap<MapData, CtKey, CtValue> = pinned("CONNTRACK").try_into().unwrap();
    let left: Vec<CtKey> = conntrack.keys().map(Result::unwrap).collect();
    assert_eq!(
        left.len(),
        2,
        "the reset flow's halves were swept: {left:?}"
    );
    assert!(
        left.iter()
            .all(|k| k.sport_be == 40001u16.to_be() || k.dport_be == 40001u16.to_be())
    );
    let collector: Array<MapData, Value> = pinned("CT_COLLECTOR").try_into().unwrap();
    let stats = collector.get(&0, 0).unwrap().0.stats;
    assert!(stats.sweeps >= 1 && stats.removed == 2, "{stats:?}");
    assert_eq!(stats.live, 2, "{stats:?}");
    drop((conntrack, collector));

    // A new agent takes the datapath over, collector included.
    let second = open_pinned(&layout, sizes()).unwrap();
    assert_eq!(second.takeover, Takeover::Adopt);
    let taken = proxy_agent::modes::ebpf::collector::stats(&second.ebpf).unwrap();
    assert_eq!(taken.removed, 2, "the collector's counts carry over");
}

/// While an agent runs it sweeps itself (in process context, where the
/// CPU's softirqs go on), and each of its sweeps holds the datapath's timer
/// off for `AGENT_GRACE_NS`; once the agent stops sweeping, the timer
/// sweeps again.
#[test]
fn the_agents_sweeps_hold_the_timer_off_until_they_stop() {
    use proxy_agent::modes::ebpf::collector::{self, Sweeper};
    use proxy_common::collector::AGENT_GRACE_NS;
    use std::{
        sync::{Arc, atomic::AtomicBool},
        time::{Duration, Instant},
    };

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut agent = open_pinned(&layout, sizes()).unwrap();
    program(&mut agent);
    agent
        .maps
        .put_config(&DatapathConfig {
            tcp_close_ns: 100_000_000,
            ..DatapathConfig::default()
        })
        .unwrap();
    let sweeps = |agent: &Opened| collector::stats(&agent.ebpf).unwrap().sweeps;
    let reset = |agent: &Opened, sport: u16| {
        send(
            agent,
            Frame::tcp(CLIENT, sport, VIP, 80),
            tcp_flags::RST | tcp_flags::ACK,
        );
    };
    for sport in [40000, 40001, 40002] {
        let syn = send(&agent, Frame::tcp(CLIENT, sport, VIP, 80), tcp_flags::SYN);
        send(&agent, syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
    }
    assert_eq!(conntrack_entries(&agent), 6);

    // The agent's sweeper thread: a sweep at once, then one per period,
    // until it is stopped.
    let stopped = Arc::new(AtomicBool::new(false));
    let before = sweeps(&agent);
    reset(&agent, 40000);
    std::thread::sleep(Duration::from_millis(150));
    let thread = Sweeper {
        sweep: collector::Sweep::of(&agent.ebpf).unwrap(),
        every: Duration::from_millis(100),
        stopped: stopped.clone(),
    }
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(450));
    stopped.store(true, std::sync::atomic::Ordering::Relaxed);
    let stopping = Instant::now();
    thread.join().unwrap();
    assert!(
        stopping.elapsed() < Duration::from_millis(500),
        "the sweeper ends soon after its stop"
    );
    let by_thread = sweeps(&agent) - before;
    assert!(
        (4..=6).contains(&by_thread),
        "a sweep at once and one per 100 ms: {by_thread}"
    );
    assert_eq!(conntrack_entries(&agent), 4, "the reset flow was swept");

    // One more sweep of the agent's, then none: the timer does not sweep
    // for AGENT_GRACE_NS (twice its own period), then it does.
    reset(&agent, 40001);
    std::thread::sleep(Duration::from_millis(150));
    collector::Sweep::of(&agent.ebpf).unwrap().run().unwrap();
    let swept_at = Instant::now();
    let after_agent = sweeps(&agent);
    assert_eq!(conntrack_entries(&agent), 2);
    reset(&agent, 40002);
    let grace = Duration::from_nanos(AGENT_GRACE_NS);
    std::thread::sleep(grace - Duration::from_millis(1_500) - swept_at.elapsed());
    assert_eq!(sweeps(&agent), after_agent, "the timer was held off");
    assert_eq!(conntrack_entries(&agent), 2, "expired, not swept yet");
    std::thread::sleep(Duration::from_millis(3_000));
    assert_eq!(sweeps(&agent), after_agent + 1, "the timer took over");
    assert_eq!(conntrack_entries(&agent), 0);
}

/// A kick whose firing was cancelled (here: the timer is gone, as an
/// agent's push landing between a kick and its firing cancels that firing)
/// is served by the agent's next sweep, under pressure.
#[test]
fn an_agents_sweep_serves_a_kick_the_timer_did_not() {
    use proxy_agent::modes::ebpf::collector::{self, Value};

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut agent = open_pinned(&layout, sizes()).unwrap();
    program(&mut agent);
    agent.maps.put_config(&DatapathConfig::default()).unwrap();
    // Three unanswered SYNs, idle past UNANSWERED_UNDER_PRESSURE_NS.
    for sport in [40000, 40001, 40002] {
        send(&agent, Frame::tcp(CLIENT, sport, VIP, 80), tcp_flags::SYN);
    }
    assert_eq!(conntrack_entries(&agent), 6);
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let sweep = collector::Sweep::of(&agent.ebpf).unwrap();
    sweep.run().unwrap();
    assert_eq!(conntrack_entries(&agent), 6, "no pressure, nothing removed");

    // A pending kick, and no timer to serve it (a write from user space
    // frees the value's timer).
    let now = crate::tester::coarse_now_ns();
    let map = agent
        .ebpf
        .map_mut(proxy_common::maps::CT_COLLECTOR)
        .unwrap();
    let mut collector_map: Array<&mut MapData, Value> = Array::try_from(map).unwrap();
    let mut value = collector_map.get(&0, 0).unwrap();
    value.0.stats.kicked_ns = now;
    collector_map.set(0, value, 0).unwrap();

    let report = sweep.run().unwrap();
    assert_eq!(report.pressure, 1, "{report:?}");
    let stats = collector::stats(&agent.ebpf).unwrap();
    assert_eq!(stats.removed_under_pressure, 6, "{stats:?}");
    assert_eq!(conntrack_entries(&agent), 0);
}

/// The agent's sweep deletes each batch's expired entries before it reads
/// the next: of 20,000 entries (five batches), every expired one goes and
/// every live one stays, wherever the table holds them.
#[test]
fn an_agents_sweep_removes_exactly_the_expired_entries_over_many_batches() {
    use proxy_agent::modes::ebpf::collector;

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let entries: u32 = 20_000;
    let mut agent = open_pinned(
        &layout,
        MapSizes {
            conntrack: 32_768,
            ..MapSizes::default()
        },
    )
    .unwrap();
    agent.maps.put_config(&DatapathConfig::default()).unwrap();
    let key = |i: u32| {
        CtKey::new(
            (0xc612_8000u32 + (i >> 16)).to_be(),
            u32::from(VIP).to_be(),
            ((i & 0xffff) as u16).to_be(),
            80u16.to_be(),
            proxy_common::proto::TCP,
        )
    };
    // Odd entries closed by a RST a minute ago (their timeout is 10 s).
    let expired = |i: u32| i % 2 == 1;
    let now = crate::tester::coarse_now_ns();
    {
        let ct: &mut HashMap<MapData, CtKey, CtValue> = &mut agent.maps.conntrack;
        for i in 0..entries {
            let (flags, last_seen_ns) = if expired(i) {
                (flags::SEEN_REPLY | flags::RST, now - 60_000_000_000)
            } else {
                (flags::SEEN_REPLY, now)
            };
            let value = CtValue {
                flags,
                last_seen_ns,
                created_ns: now - 60_000_000_000,
                ..CtValue::default()
            };
            ct.insert(key(i), value, 0).unwrap();
        }
    }
    let report = collector::Sweep::of(&agent.ebpf).unwrap().run().unwrap();
    assert_eq!(report.removed, u64::from(entries / 2), "{report:?}");
    assert_eq!(report.live, u64::from(entries / 2), "{report:?}");
    let ct: &HashMap<MapData, CtKey, CtValue> = &agent.maps.conntrack;
    for i in 0..entries {
        assert_eq!(
            ct.get(&key(i), 0).is_ok(),
            !expired(i),
            "entry {i} (expired: {})",
            expired(i)
        );
    }
    let stats = collector::stats(&agent.ebpf).unwrap();
    assert_eq!(
        (stats.removed, stats.live),
        (u64::from(entries / 2), u64::from(entries / 2))
    );
}

/// An entry the walk read as expired but whose flow was refreshed before it
/// was taken out goes back as it was; an expired one goes; a key already
/// gone is no removal.
#[test]
fn a_sweep_puts_back_an_entry_refreshed_since_the_walk_read_it() {
    use proxy_agent::modes::ebpf::collector::{Judge, remove_if_due};
    use proxy_common::collector::Removal;
    use std::os::fd::AsFd as _;

    let fs = BpfFs::new();
    let layout = PinLayout::new(root(&fs));
    let mut agent = open_pinned(&layout, sizes()).unwrap();
    let key = |sport: u16| {
        CtKey::new(
            u32::from(CLIENT).to_be(),
            u32::from(VIP).to_be(),
            sport.to_be(),
            80u16.to_be(),
            proxy_common::proto::TCP,
        )
    };
    let now = crate::tester::coarse_now_ns();
    let entry = |last_seen_ns| CtValue {
        flags: flags::SEEN_REPLY | flags::RST,
        last_seen_ns,
        created_ns: now - 60_000_000_000,
        ..CtValue::default()
    };
    let (refreshed, expired) = (entry(now), entry(now - 60_000_000_000));
    let ct: &mut HashMap<MapData, CtKey, CtValue> = &mut agent.maps.conntrack;
    ct.insert(key(40000), refreshed, 0).unwrap();
    ct.insert(key(40001), expired, 0).unwrap();
    let judge = Judge {
        config: DatapathConfig::default(),
        now,
        pressure: false,
    };
    let ct: &HashMap<MapData, CtKey, CtValue> = ct;
    let fd = aya::maps::IterableMap::map(ct).fd().as_fd();
    assert_eq!(remove_if_due::<V4>(fd, &key(40000), &judge).unwrap(), None);
    assert_eq!(
        remove_if_due::<V4>(fd, &key(40001), &judge).unwrap(),
        Some(Removal::Expired)
    );
    assert_eq!(remove_if_due::<V4>(fd, &key(40002), &judge).unwrap(), None);
    assert_eq!(
        ct.get(&key(40000), 0).unwrap(),
        refreshed,
        "put back as it was"
    );
    assert!(ct.get(&key(40001), 0).is_err(), "the expired entry went");
}
