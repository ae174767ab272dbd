//! Conntrack that behaves like the kernel's, in the real programs
//! (BPF_PROG_TEST_RUN): TCP flows expire by state (a reset one after the
//! close timeout, a finished one after TIME_WAIT, a half-closed one after
//! CLOSE_WAIT, an unanswered SYN after SYN_SENT), a SYN on a finished flow's
//! tuple opens a new, newly balanced connection; a full table refuses new
//! flows and keeps the live ones, and the collector frees expired (and
//! under pressure, unanswered) flows. Needs root.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use crate::tester::{in_both_families, tcp_segment, web_service};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
};
use proxy_agent::{
    cli::packet::{Frame, tcp_flags},
    modes::ebpf::{self, KernelMaps, MapSizes, Programmer, maps::NodeMaps, test_run},
};
use proxy_common::{
    Counter, CtDirection, CtKey, CtKey6, CtKeyOf, CtValue, CtValue6, CtValueOf, DatapathConfig,
    Family,
    action::{TC_ACT_OK, TC_ACT_SHOT},
    collector::CollectorStats,
};

/// The addresses of these scenarios in one family.
struct Net {
    client: IpAddr,
    vip: IpAddr,
    backends: [IpAddr; 3],
}

const IPV4: Net = Net {
    client: IpAddr::V4(Ipv4Addr::new(198, 18, 1, 2)),
    vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 10)),
    backends: [
        IpAddr::V4(Ipv4Addr::new(198, 18, 2, 2)),
        IpAddr::V4(Ipv4Addr::new(198, 18, 2, 3)),
        IpAddr::V4(Ipv4Addr::new(198, 18, 2, 4)),
    ],
};

const fn v6(net: u16, host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net, 0, 0, 0, 0, host))
}

const IPV6: Net = Net {
    client: v6(1, 2),
    vip: v6(0xffff, 0x10),
    backends: [v6(2, 2), v6(2, 3), v6(2, 4)],
};

in_both_families!(
    a_reset_flow_expires_after_the_close_timeout,
    fins_both_ways_mean_time_wait_and_one_way_close_wait,
    an_unanswered_syn_expires_after_syn_sent_but_an_answered_one_does_not,
    a_syn_on_a_finished_flows_tuple_is_a_new_connection_balanced_again,
    a_reopened_connection_leaves_nothing_of_the_old_one,
    a_full_conntrack_table_refuses_new_flows_and_keeps_the_live_ones,
    the_collector_frees_expired_flows_and_under_pressure_unanswered_ones,
    an_evicted_half_of_a_live_flow_is_rebuilt_from_the_other,
);

const PORT: u16 = 8080;
const MS: u64 = 1_000_000;

struct Fixture {
    net: &'static Net,
    ebpf: Ebpf,
    maps: KernelMaps,
    stats: PerCpuArray<MapData, u64>,
}

impl Fixture {
    /// One ClusterIP service on three backends; conntrack timeouts from
    /// `config`; each family's conntrack table of `conntrack_entries`.
    fn new(net: &'static Net, config: DatapathConfig, conntrack_entries: u32) -> Self {
        let sizes = MapSizes {
            conntrack: conntrack_entries,
            ..MapSizes::default()
        };
        let mut ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
        let (mut maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        maps.put_config(&config).unwrap();
        let state = web_service(net.vip, &net.backends, PORT);
        Programmer::new().sync(&state, &mut maps).unwrap();
        Fixture {
            net,
            ebpf,
            maps,
            stats,
        }
    }

    /// A TCP segment with `flags` through `tc_from_pod`: the frame it leaves as.
    fn send(&self, frame: Frame, flags: u8) -> Frame {
        let out =
            test_run::from_pod(&self.ebpf, &tcp_segment(frame, flags)).expect("BPF_PROG_TEST_RUN");
        assert_eq!(out.verdict, TC_ACT_OK);
        Frame::parse(&out.packet).unwrap()
    }

    /// A TCP segment with `flags` through `tc_from_pod`, whatever the verdict.
    fn try_send(&self, frame: Frame, flags: u8) -> test_run::Outcome {
        test_run::from_pod(&self.ebpf, &tcp_segment(frame, flags)).expect("BPF_PROG_TEST_RUN")
    }

    /// What the conntrack collector did so far.
    fn collector(&self) -> CollectorStats {
        ebpf::collector::stats(&self.ebpf).unwrap()
    }

    /// The client opens a connection from `sport`: SYN, SYN-ACK, ACK. Returns the backend.
    fn connect(&self, sport: u16) -> IpAddr {
        let syn = self.send(self.request(sport), tcp_flags::SYN);
        assert!(self.net.backends.contains(&syn.dst), "{syn:?}");
        let synack = self.send(syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
        assert_eq!(synack.src, self.net.vip, "the reply is translated back");
        self.send(self.request(sport), tcp_flags::ACK);
        syn.dst
    }

    /// The client's segment of the connection from `sport`.
    fn request(&self, sport: u16) -> Frame {
        Frame::tcp(self.net.client, sport, self.net.vip, 80)
    }

    /// The backend's segment of the connection from `sport`.
    fn response(&self, backend: IpAddr, sport: u16) -> Frame {
        Frame::tcp(backend, PORT, self.net.client, sport)
    }

    /// Whether a segment from `backend` to the client on `sport` is still
    /// translated as the flow's reply (i.e. its conntrack entry is alive).
    fn reply_translated(&self, backend: IpAddr, sport: u16) -> bool {
        self.send(self.response(backend, sport), tcp_flags::ACK).src == self.net.vip
    }

    fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }

    /// The entries of this family's conntrack table.
    fn conntrack_entries(&self) -> usize {
        if self.net.client.is_ipv6() {
            let ct: &HashMap<MapData, CtKey6, CtValue6> = &self.maps.v6.conntrack;
            ct.keys().filter_map(Result::ok).count()
        } else {
            let ct: &HashMap<MapData, CtKey, CtValue> = &self.maps.conntrack;
            ct.keys().filter_map(Result::ok).count()
        }
    }

    /// Deletes the flow's entries of `direction`, as an LRU eviction would.
    fn evict(&mut self, direction: CtDirection) -> usize {
        fn evict<F: Family>(
            ct: &mut HashMap<MapData, CtKeyOf<F>, CtValueOf<F>>,
            direction: CtDirection,
        ) -> usize
        where
            CtKeyOf<F>: aya::Pod,
            CtValueOf<F>: aya::Pod,
        {
            let doomed: Vec<CtKeyOf<F>> = ct
                .iter()
                .filter_map(Result::ok)
                .filter(|(_, v)| v.direction() == direction)
                .map(|(k, _)| k)
                .collect();
            for k in &doomed {
                ct.remove(k).unwrap();
            }
            doomed.len()
        }
        if self.net.client.is_ipv6() {
            evict(&mut self.maps.v6.conntrack, direction)
        } else {
            evict(&mut self.maps.conntrack, direction)
        }
    }
}

fn timeouts(close: u64, time_wait: u64, close_wait: u64, syn_sent: u64) -> DatapathConfig {
    DatapathConfig {
        tcp_close_ns: close * MS,
        tcp_time_wait_ns: time_wait * MS,
        tcp_closing_ns: close_wait * MS,
        tcp_syn_sent_ns: syn_sent * MS,
        ..DatapathConfig::default()
    }
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn a_reset_flow_expires_after_the_close_timeout(net: &'static Net) {
    let f = Fixture::new(net, timeouts(150, 60_000, 60_000, 60_000), 1024);
    let backend = f.connect(40000);
    f.send(f.request(40000), tcp_flags::RST | tcp_flags::ACK);
    assert!(
        f.reply_translated(backend, 40000),
        "alive right after the RST"
    );
    sleep_ms(400);
    assert!(
        !f.reply_translated(backend, 40000),
        "a reset flow is gone after the close timeout"
    );

    // A RST from the backend closes the flow the same way.
    let backend = f.connect(40001);
    f.send(f.response(backend, 40001), tcp_flags::RST);
    sleep_ms(400);
    assert!(!f.reply_translated(backend, 40001));
}

fn fins_both_ways_mean_time_wait_and_one_way_close_wait(net: &'static Net) {
    let f = Fixture::new(net, timeouts(60_000, 150, 1_500, 60_000), 1024);
    let both = f.connect(40000);
    f.send(f.request(40000), tcp_flags::FIN | tcp_flags::ACK);
    f.send(f.response(both, 40000), tcp_flags::FIN | tcp_flags::ACK);
    let half = f.connect(40001);
    f.send(f.request(40001), tcp_flags::FIN | tcp_flags::ACK);
    sleep_ms(500);
    assert!(
        !f.reply_translated(both, 40000),
        "finished both ways: gone after TIME_WAIT"
    );
    assert!(
        f.reply_translated(half, 40001),
        "half closed: alive until CLOSE_WAIT"
    );
    sleep_ms(1_500);
    assert!(!f.reply_translated(half, 40001), "gone after CLOSE_WAIT");
}

fn an_unanswered_syn_expires_after_syn_sent_but_an_answered_one_does_not(net: &'static Net) {
    let f = Fixture::new(net, timeouts(60_000, 60_000, 60_000, 150), 1024);
    f.send(f.request(40000), tcp_flags::SYN);
    let established = f.connect(40001);
    sleep_ms(400);
    f.send(f.request(40000), tcp_flags::SYN);
    assert_eq!(
        f.counter(Counter::NewFlow),
        3,
        "the unanswered SYN's entry expired, its retry is a new flow"
    );
    assert!(f.reply_translated(established, 40001));
}

fn a_syn_on_a_finished_flows_tuple_is_a_new_connection_balanced_again(net: &'static Net) {
    let f = Fixture::new(net, timeouts(60_000, 60_000, 60_000, 60_000), 1024);
    // A load test reusing one client port: every connection ends (FIN both
    // ways, or RST) and the next SYN on the same tuple is balanced anew.
    let mut reached = BTreeSet::new();
    for i in 0..60 {
        let backend = f.connect(40000);
        reached.insert(backend);
        if i % 2 == 0 {
            f.send(f.request(40000), tcp_flags::FIN | tcp_flags::ACK);
            f.send(f.response(backend, 40000), tcp_flags::FIN | tcp_flags::ACK);
            f.send(f.request(40000), tcp_flags::ACK);
        } else {
            f.send(f.request(40000), tcp_flags::RST);
        }
    }
    assert_eq!(f.counter(Counter::NewFlow), 60);
    assert_eq!(f.counter(Counter::Reopened), 59);
    assert_eq!(reached.len(), 3, "reused tuples still reach every backend");

    // A retransmitted SYN of a live connection stays on its backend.
    let backend = f.connect(40001);
    let again = f.send(f.request(40001), tcp_flags::SYN);
    assert_eq!(again.dst, backend);
    assert_eq!(f.counter(Counter::Reopened), 59);
}

fn a_reopened_connection_leaves_nothing_of_the_old_one(net: &'static Net) {
    let f = Fixture::new(net, timeouts(60_000, 60_000, 60_000, 60_000), 1024);
    let old = f.connect(40000);
    // Until the new connection lands on another backend than the old one.
    for _ in 0..60 {
        f.send(f.request(40000), tcp_flags::FIN | tcp_flags::ACK);
        f.send(f.response(old, 40000), tcp_flags::FIN | tcp_flags::ACK);
        f.send(f.request(40000), tcp_flags::ACK);
        let new = f.connect(40000);
        if new == old {
            continue;
        }
        // As the kernel's conntrack, which drops the old connection when a
        // SYN reuses its tuple: a late segment of the old backend is no
        // longer the client's, and does not bring the old flow back.
        assert_eq!(f.conntrack_entries(), 2, "the new flow's two halves alone");
        assert!(
            !f.reply_translated(old, 40000),
            "the old backend's late segment is not translated"
        );
        assert_eq!(f.send(f.request(40000), tcp_flags::ACK).dst, new);
        assert!(f.reply_translated(new, 40000));
        assert_eq!(f.conntrack_entries(), 2);
        return;
    }
    panic!("60 reopened connections all reached {old}");
}

fn a_full_conntrack_table_refuses_new_flows_and_keeps_the_live_ones(net: &'static Net) {
    const ENTRIES: u32 = 256;
    let f = Fixture::new(net, timeouts(60_000, 60_000, 60_000, 60_000), ENTRIES);
    let mut reached = BTreeSet::new();
    let flows: Vec<(u16, IpAddr)> = (0..ENTRIES as u16 / 2)
        .map(|i| (20_000 + i, f.connect(20_000 + i)))
        .collect();
    for (_, backend) in &flows {
        reached.insert(*backend);
    }
    assert_eq!(reached.len(), 3);
    assert_eq!(f.conntrack_entries(), ENTRIES as usize);
    assert_eq!(f.counter(Counter::DropConntrackFull), 0);

    // As the kernel's conntrack: the new flow's packet is dropped, no
    // live flow is evicted for it.
    let refused = f.try_send(f.request(30_000), tcp_flags::SYN);
    assert_eq!(refused.verdict, TC_ACT_SHOT);
    assert_eq!(f.counter(Counter::DropConntrackFull), 1);
    for (sport, backend) in &flows {
        assert_eq!(f.send(f.request(*sport), tcp_flags::ACK).dst, *backend);
        assert!(f.reply_translated(*backend, *sport));
    }
    // The refusal asked for a sweep under pressure: every flow here was
    // answered and is live, so nothing is removed and the table stays full.
    sleep_ms(300);
    let stats = f.collector();
    assert!(stats.sweeps >= 1, "{stats:?}");
    assert_eq!(stats.removed, 0, "{stats:?}");
    assert_eq!(f.conntrack_entries(), ENTRIES as usize);
}

fn the_collector_frees_expired_flows_and_under_pressure_unanswered_ones(net: &'static Net) {
    const ENTRIES: u32 = 256;
    // Resets expire after 150 ms; nothing else expires during the test.
    let f = Fixture::new(net, timeouts(150, 60_000, 60_000, 60_000), ENTRIES);
    let reset: Vec<u16> = (0..40).map(|i| 20_000 + i).collect();
    let live: Vec<(u16, IpAddr)> = (0..40)
        .map(|i| (21_000 + i, f.connect(21_000 + i)))
        .collect();
    for sport in &reset {
        f.connect(*sport);
        f.send(f.request(*sport), tcp_flags::RST | tcp_flags::ACK);
    }
    // Unanswered SYNs (a flood, or backends that do not answer) fill the rest.
    for i in 0..48 {
        f.send(f.request(22_000 + i), tcp_flags::SYN);
    }
    assert_eq!(f.conntrack_entries(), ENTRIES as usize);

    // Past the resets' timeout, and the SYNs idle for a second: a new flow
    // finds the table full, is dropped, and asks for a sweep at once.
    sleep_ms(1_200);
    let before = f.collector();
    assert_eq!(
        f.try_send(f.request(30_000), tcp_flags::SYN).verdict,
        TC_ACT_SHOT
    );
    sleep_ms(300);
    let after = f.collector();
    assert_eq!(after.sweeps, before.sweeps + 1, "{after:?}");
    assert_eq!(after.removed - before.removed, 80 + 96, "{after:?}");
    assert_eq!(
        after.removed_under_pressure - before.removed_under_pressure,
        96,
        "{after:?}"
    );
    let left = if net.client.is_ipv6() {
        after.live6
    } else {
        after.live
    };
    assert_eq!(left, 80, "{after:?}");
    assert_eq!(f.conntrack_entries(), 80);

    // The live flows kept their backends; new flows get in again.
    for (sport, backend) in &live {
        assert_eq!(f.send(f.request(*sport), tcp_flags::ACK).dst, *backend);
        assert!(f.reply_translated(*backend, *sport));
    }
    let again = f.send(f.request(30_000), tcp_flags::SYN);
    assert!(f.net.backends.contains(&again.dst));
}

fn an_evicted_half_of_a_live_flow_is_rebuilt_from_the_other(net: &'static Net) {
    let mut f = Fixture::new(net, timeouts(60_000, 60_000, 60_000, 60_000), 1024);
    let backend = f.connect(40000);

    // The reply entry is gone; the next refresh of the forward entry (at
    // most once a second) rebuilds it, and replies are translated again.
    assert_eq!(f.evict(CtDirection::Reply), 1);
    sleep_ms(1_100);
    assert_eq!(f.send(f.request(40000), tcp_flags::ACK).dst, backend);
    assert!(f.reply_translated(backend, 40000));
    assert_eq!(f.counter(Counter::ConntrackRebuilt), 1);

    // The forward entry is gone: a reply rebuilds it, so the client's next
    // segment stays on its backend instead of being balanced anew.
    assert_eq!(f.evict(CtDirection::Forward), 1);
    sleep_ms(1_100);
    assert!(f.reply_translated(backend, 40000));
    let new_flows = f.counter(Counter::NewFlow);
    assert_eq!(f.send(f.request(40000), tcp_flags::ACK).dst, backend);
    assert_eq!(f.counter(Counter::NewFlow), new_flows);
    assert_eq!(f.counter(Counter::ConntrackRebuilt), 2);
}
