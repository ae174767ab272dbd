//! Conntrack that behaves like the kernel's, in the real programs
//! (BPF_PROG_TEST_RUN): TCP flows expire by state (a reset one after the
//! close timeout, a finished one after TIME_WAIT, a half-closed one after
//! CLOSE_WAIT, an unanswered SYN after SYN_SENT), a SYN on a finished flow's
//! tuple opens a new, newly balanced connection, and a full table still
//! balances new flows. Needs root.

use std::{collections::BTreeSet, net::Ipv4Addr, time::Duration};

use crate::tester::{tcp_segment, web_service};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
};
use proxy_agent::{
    cli::packet::{Frame, tcp_flags},
    modes::ebpf::{self, KernelMaps, MapSizes, Programmer, maps::NodeMaps, test_run},
};
use proxy_common::{Counter, CtKey, CtValue, DatapathConfig, action::TC_ACT_OK};

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 2, 2),
    Ipv4Addr::new(198, 18, 2, 3),
    Ipv4Addr::new(198, 18, 2, 4),
];
const PORT: u16 = 8080;
const MS: u64 = 1_000_000;

struct Fixture {
    ebpf: Ebpf,
    maps: KernelMaps,
    stats: PerCpuArray<MapData, u64>,
}

impl Fixture {
    /// One ClusterIP service on three backends; conntrack timeouts from `config`.
    fn new(config: DatapathConfig, conntrack_entries: u32) -> Self {
        let sizes = MapSizes {
            conntrack: conntrack_entries,
            ..MapSizes::default()
        };
        let mut ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
        let (mut maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        maps.put_config(&config).unwrap();
        let state = web_service(VIP, &BACKENDS, PORT);
        Programmer::new().sync(&state, &mut maps).unwrap();
        Fixture { ebpf, maps, stats }
    }

    /// A TCP segment with `flags` through `tc_from_pod`: the frame it leaves as.
    fn send(&self, frame: Frame, flags: u8) -> Frame {
        let out =
            test_run::from_pod(&self.ebpf, &tcp_segment(frame, flags)).expect("BPF_PROG_TEST_RUN");
        assert_eq!(out.verdict, TC_ACT_OK);
        Frame::parse(&out.packet).unwrap()
    }

    /// The client opens a connection from `sport`: SYN, SYN-ACK, ACK. Returns the backend.
    fn connect(&self, sport: u16) -> Ipv4Addr {
        let syn = self.send(request(sport), tcp_flags::SYN);
        assert!(BACKENDS.contains(&syn.dst), "{syn:?}");
        let synack = self.send(syn.reply(), tcp_flags::SYN | tcp_flags::ACK);
        assert_eq!(synack.src, VIP, "the reply is translated back");
        self.send(request(sport), tcp_flags::ACK);
        syn.dst
    }

    /// Whether a segment from `backend` to the client on `sport` is still
    /// translated as the flow's reply (i.e. its conntrack entry is alive).
    fn reply_translated(&self, backend: Ipv4Addr, sport: u16) -> bool {
        let from_backend = Frame::tcp(backend, PORT, CLIENT, sport);
        self.send(from_backend, tcp_flags::ACK).src == VIP
    }

    fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }

    fn conntrack_entries(&self) -> usize {
        let ct: &HashMap<MapData, CtKey, CtValue> = &self.maps.conntrack;
        ct.keys().filter_map(Result::ok).count()
    }
}

fn request(sport: u16) -> Frame {
    Frame::tcp(CLIENT, sport, VIP, 80)
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

#[test]
fn a_reset_flow_expires_after_the_close_timeout() {
    let f = Fixture::new(timeouts(150, 60_000, 60_000, 60_000), 1024);
    let backend = f.connect(40000);
    f.send(request(40000), tcp_flags::RST | tcp_flags::ACK);
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
    f.send(Frame::tcp(backend, PORT, CLIENT, 40001), tcp_flags::RST);
    sleep_ms(400);
    assert!(!f.reply_translated(backend, 40001));
}

#[test]
fn fins_both_ways_mean_time_wait_and_one_way_close_wait() {
    let f = Fixture::new(timeouts(60_000, 150, 1_500, 60_000), 1024);
    let both = f.connect(40000);
    f.send(request(40000), tcp_flags::FIN | tcp_flags::ACK);
    f.send(
        Frame::tcp(both, PORT, CLIENT, 40000),
        tcp_flags::FIN | tcp_flags::ACK,
    );
    let half = f.connect(40001);
    f.send(request(40001), tcp_flags::FIN | tcp_flags::ACK);
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

#[test]
fn an_unanswered_syn_expires_after_syn_sent_but_an_answered_one_does_not() {
    let f = Fixture::new(timeouts(60_000, 60_000, 60_000, 150), 1024);
    f.send(request(40000), tcp_flags::SYN);
    let established = f.connect(40001);
    sleep_ms(400);
    f.send(request(40000), tcp_flags::SYN);
    assert_eq!(
        f.counter(Counter::NewFlow),
        3,
        "the unanswered SYN's entry expired, its retry is a new flow"
    );
    assert!(f.reply_translated(established, 40001));
}

#[test]
fn a_syn_on_a_finished_flows_tuple_is_a_new_connection_balanced_again() {
    let f = Fixture::new(timeouts(60_000, 60_000, 60_000, 60_000), 1024);
    // A load test reusing one client port: every connection ends (FIN both
    // ways, or RST) and the next SYN on the same tuple is balanced anew.
    let mut reached = BTreeSet::new();
    for i in 0..60 {
        let backend = f.connect(40000);
        reached.insert(backend);
        if i % 2 == 0 {
            f.send(request(40000), tcp_flags::FIN | tcp_flags::ACK);
            f.send(
                Frame::tcp(backend, PORT, CLIENT, 40000),
                tcp_flags::FIN | tcp_flags::ACK,
            );
            f.send(request(40000), tcp_flags::ACK);
        } else {
            f.send(request(40000), tcp_flags::RST);
        }
    }
    assert_eq!(f.counter(Counter::NewFlow), 60);
    assert_eq!(f.counter(Counter::Reopened), 59);
    assert_eq!(reached.len(), 3, "reused tuples still reach every backend");

    // A retransmitted SYN of a live connection stays on its backend.
    let backend = f.connect(40001);
    let again = f.send(request(40001), tcp_flags::SYN);
    assert_eq!(again.dst, backend);
    assert_eq!(f.counter(Counter::Reopened), 59);
}

#[test]
fn a_full_conntrack_table_still_balances_new_flows() {
    const ENTRIES: u32 = 256;
    let f = Fixture::new(timeouts(60_000, 60_000, 60_000, 60_000), ENTRIES);
    let mut reached = BTreeSet::new();
    for sport in 0..1_000u16 {
        reached.insert(f.connect(20_000 + sport));
    }
    assert_eq!(f.counter(Counter::NewFlow), 1_000);
    assert_eq!(f.counter(Counter::DropConntrackFull), 0);
    assert_eq!(reached.len(), 3);
    // The LRU map evicted the least recently used flows: it is full, and the
    // most recent flow is intact in both directions.
    let entries = f.conntrack_entries();
    assert!(
        entries <= ENTRIES as usize && entries >= ENTRIES as usize * 3 / 4,
        "{entries} of {ENTRIES}"
    );
    let last = f.send(request(20_999), tcp_flags::ACK);
    assert!(f.reply_translated(last.dst, 20_999));
}

impl Fixture {
    /// Deletes the flow's entries of `direction`, as an LRU eviction would.
    fn evict(&mut self, direction: proxy_common::CtDirection) -> usize {
        let ct: &mut HashMap<MapData, CtKey, CtValue> = &mut self.maps.conntrack;
        let doomed: Vec<CtKey> = ct
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.direction == direction as u8)
            .collect();
        for k in &doomed {
            ct.remove(k).unwrap();
        }
        doomed.len()
    }
}

#[test]
fn an_evicted_half_of_a_live_flow_is_rebuilt_from_the_other() {
    use proxy_common::CtDirection;
    let mut f = Fixture::new(timeouts(60_000, 60_000, 60_000, 60_000), 1024);
    let backend = f.connect(40000);

    // The reply entry is gone; the next refresh of the forward entry (at
    // most once a second) rebuilds it, and replies are translated again.
    assert_eq!(f.evict(CtDirection::Reply), 1);
    sleep_ms(1_100);
    assert_eq!(f.send(request(40000), tcp_flags::ACK).dst, backend);
    assert!(f.reply_translated(backend, 40000));
    assert_eq!(f.counter(Counter::ConntrackRebuilt), 1);

    // The forward entry is gone: a reply rebuilds it, so the client's next
    // segment stays on its backend instead of being balanced anew.
    assert_eq!(f.evict(CtDirection::Forward), 1);
    sleep_ms(1_100);
    assert!(f.reply_translated(backend, 40000));
    let new_flows = f.counter(Counter::NewFlow);
    assert_eq!(f.send(request(40000), tcp_flags::ACK).dst, backend);
    assert_eq!(f.counter(Counter::NewFlow), new_flows);
    assert_eq!(f.counter(Counter::ConntrackRebuilt), 2);
}
