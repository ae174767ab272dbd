//! An experiment on the conntrack table's shape (issue 14: a new flow's
//! cost is its two inserts). `proxy-ebpf`'s `bench-ct` object holds three
//! XDP programs that do the same work for a TCP packet, look up its tuple
//! and, on a miss, insert a reply and a forward entry, in three tables:
//!
//! - `htab`: the kernel's preallocated hash map with today's `CtKey` /
//!   `CtValue` (a bucket's list head, then a 128-byte element taken from
//!   a free list);
//! - `slots`: an open-addressed array of 128-byte slots (2^19 of them,
//!   twice the hash map's entries) claimed by compare-and-swap;
//! - `lines`: the same with 64-byte slots, the value cut to fit: the
//!   proposed table (`proxy_common::ct_table`). After the rounds the bench
//!   looks every flow's two entries up as the agent would, with the shared
//!   hash and probing, through the map's fd; then maps the array into its
//!   memory, counts the live slots, deletes a flow's entries by
//!   compare-and-swap and checks that the program opens that flow anew.
//!
//! They are timed through BPF_PROG_TEST_RUN, one run per call (r=1), in a
//! throwaway network namespace, taking turns in rounds: new flows (each a
//! distinct tuple), then the same flows again (hits), and a packet none
//! touches (the per-call cost, to subtract); at the end, hits on flows
//! scattered over every round's (cold hits: entries the caches lost). Not
//! part of `cargo xtask bench`: run it with `cargo bench -p proxy-agent
//! --bench ct_table` as root; `CT_BENCH_FLOWS` (new flows per round, default
//! 10,000) and `CT_BENCH_ROUNDS` (default 10). Findings: docs/datapath.md,
//! "What a new flow costs".

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, ensure};
use aya::{Ebpf, maps::Array, programs::Xdp};
use proxy_agent::{
    cli::packet::Frame,
    modes::ebpf::{mapped_array::MappedArray, test_run},
};
use proxy_common::{
    CtKey,
    ct_table::{CtSlot, chain, state},
    proto,
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bench-ct"));
/// The three tables' programs, IPv4 then IPv6.
const PROGRAMS: [[&str; 3]; 2] = [
    ["bench_ct_htab", "bench_ct_slots", "bench_ct_lines"],
    ["bench_ct_htab6", "bench_ct_slots6", "bench_ct_lines6"],
];
const XDP_TX: i32 = 3;

fn main() {
    common::main("ct_table", run);
}

/// How many flows, in how many rounds.
#[derive(Clone, Copy)]
struct Load {
    flows: usize,
    rounds: usize,
}

fn run() -> anyhow::Result<()> {
    ensure!(
        !OBJECT.is_empty(),
        "the bench-ct object is empty: this build skipped the eBPF programs (AYA_BUILD_SKIP)"
    );
    let load = Load {
        flows: env_number("CT_BENCH_FLOWS", 10_000)?,
        rounds: env_number("CT_BENCH_ROUNDS", 10)?,
    };
    ensure!(
        load.flows * load.rounds <= 100_000,
        "CT_BENCH_FLOWS x CT_BENCH_ROUNDS: at most 100,000 flows (two entries each in 262,144)"
    );
    let uplink = common::enter_throwaway_netns()?;
    pin_to_last_cpu();
    let mut ebpf = Ebpf::load(OBJECT).context("loading the bench-ct object")?;
    for name in PROGRAMS.iter().flatten() {
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .with_context(|| format!("{name} missing"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
    }
    let lines: MappedArray<CtSlot> = MappedArray::new(
        Array::try_from(ebpf.take_map("CT_LINES").context("CT_LINES missing")?)?,
        "CT_LINES",
    )?;
    let prog = |name: &str| -> anyhow::Result<&Xdp> {
        Ok(ebpf
            .program(name)
            .with_context(|| format!("{name} missing"))?
            .try_into()?)
    };
    let programs = |family: usize| -> anyhow::Result<[&Xdp; 3]> {
        let [a, b, c] = PROGRAMS[family];
        Ok([prog(a)?, prog(b)?, prog(c)?])
    };
    let total = load.flows * load.rounds;
    println!(
        "conntrack table shapes: {total} new flows in {} rounds, r=1, kernel-reported ns",
        load.rounds
    );

    let v4 = programs(0)?;
    let mut samples = measure(v4, load, uplink, new_flow)?;
    check_agent_finds(&lines, total)?;
    check_mapped(&lines, v4[2], uplink, total)?;
    report("IPv4", &PROGRAMS[0], &mut samples);

    let mut samples = measure(programs(1)?, load, uplink, new_flow6)?;
    report("IPv6", &PROGRAMS[1], &mut samples);
    Ok(())
}

/// The three tables in turn, round after round: new flows, the same flows
/// again, and a packet none touches; then cold hits.
fn measure(
    programs: [&Xdp; 3],
    Load { flows, rounds }: Load,
    uplink: u32,
    new_flow: fn(usize) -> Vec<u8>,
) -> anyhow::Result<[Samples; 3]> {
    let mut samples: [Samples; 3] = Default::default();
    let udp = Frame::udp(
        Ipv4Addr::new(198, 18, 0, 1),
        1000,
        Ipv4Addr::new(198, 18, 0, 2),
        53,
    )
    .build(&[]);
    for round in 0..rounds {
        let packets: Vec<Vec<u8>> = (0..flows).map(|i| new_flow(round * flows + i)).collect();
        // Rotate which table goes first, so none always runs on a cache
        // another cooled.
        let order = [0, 1, 2].map(|t| (t + round) % 3);
        for t in order {
            let s = &mut samples[t];
            for (i, p) in packets.iter().enumerate() {
                let ns = timed(programs[t], p, uplink)
                    .with_context(|| format!("table {t}: new flow {i} of round {round}"))?;
                s.new.push(ns);
            }
            for (i, p) in packets.iter().enumerate() {
                let ns = timed(programs[t], p, uplink)
                    .with_context(|| format!("table {t}: flow {i} of round {round} again"))?;
                s.hit.push(ns);
            }
            for _ in 0..flows.min(2_000) {
                let out = test_run::xdp(programs[t], &udp, uplink, 1)?;
                s.pass.push(out.duration.as_nanos() as f64);
            }
        }
    }
    // Hits on entries the caches have lost: as many flows again, taken
    // all over the table in a scrambled order, after every insert.
    let total = flows * rounds;
    let stride = if gcd(7919, total) == 1 { 7919 } else { 1 };
    let scattered: Vec<Vec<u8>> = (0..flows).map(|k| new_flow(k * stride % total)).collect();
    for (t, program) in programs.iter().enumerate() {
        for p in &scattered {
            samples[t].cold_hit.push(timed(program, p, uplink)?);
        }
    }
    Ok(samples)
}

fn report(family: &str, names: &[&str; 3], samples: &mut [Samples; 3]) {
    println!(
        "{family:>8} | {:>9} {:>9} | {:>9} {:>9} | {:>9} | {:>9} | {:>9} {:>9} {:>9}",
        "new p50",
        "new p99",
        "hit p50",
        "hit p99",
        "cold p50",
        "call p50",
        "new net",
        "hit net",
        "cold net"
    );
    let mut nets = Vec::new();
    for (t, s) in samples.iter_mut().enumerate() {
        let (new50, new99) = (s.new.percentile(0.5), s.new.percentile(0.99));
        let (hit50, hit99) = (s.hit.percentile(0.5), s.hit.percentile(0.99));
        let cold50 = s.cold_hit.percentile(0.5);
        let call = s.pass.percentile(0.5);
        nets.push((new50 - call, hit50 - call, cold50 - call));
        println!(
            "{:>8} | {new50:>9.0} {new99:>9.0} | {hit50:>9.0} {hit99:>9.0} | {cold50:>9.0} | {call:>9.0} | {:>9.0} {:>9.0} {:>9.0}",
            table_name(names[t]),
            new50 - call,
            hit50 - call,
            cold50 - call
        );
    }
    for t in 1..names.len() {
        println!(
            "{family} {} / htab: new flow net {:.2}, hit net {:.2}, cold hit net {:.2}",
            table_name(names[t]),
            nets[t].0 / nets[0].0,
            nets[t].1 / nets[0].1,
            nets[t].2 / nets[0].2
        );
    }
}

fn table_name(program: &str) -> &str {
    program
        .trim_start_matches("bench_ct_")
        .trim_end_matches('6')
}

#[derive(Default)]
struct Samples {
    new: Vec<f64>,
    hit: Vec<f64>,
    cold_hit: Vec<f64>,
    pass: Vec<f64>,
}

trait Percentile {
    fn percentile(&mut self, p: f64) -> f64;
}

impl Percentile for Vec<f64> {
    fn percentile(&mut self, p: f64) -> f64 {
        self.sort_by(f64::total_cmp);
        self[((self.len() as f64 - 1.0) * p).round() as usize]
    }
}

fn timed(prog: &Xdp, packet: &[u8], ifindex: u32) -> anyhow::Result<f64> {
    let out = test_run::xdp(prog, packet, ifindex, 1)?;
    ensure!(
        out.verdict == XDP_TX,
        "verdict {} (a table full?)",
        out.verdict
    );
    Ok(out.duration.as_nanos() as f64)
}

/// Flow `i`'s client: an address and port of its own.
fn client(i: usize) -> (Ipv4Addr, u16) {
    let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + (i / 50_000) as u32);
    (addr, 10_000 + (i % 50_000) as u16)
}

const FRONTEND: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 19, 0, 1), 80);
/// Where bench-ct's programs send every flow.
const BACKEND: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 1, 1), 8080);

/// The agent's writes to the proposed table: through the array mapped into
/// its memory (`BPF_F_MMAPABLE`), with the same compare-and-swap on a
/// slot's state as the programs. Counts the live slots by walking the
/// mapping, deletes flow 0's two entries (tombstones), and checks that the
/// `lines` program then opens that flow anew, in slots of its chains.
fn check_mapped(
    lines: &MappedArray<CtSlot>,
    lines_prog: &Xdp,
    ifindex: u32,
    flows: usize,
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let slots = lines.elements();
    let slot = |i: u32| lines.as_ptr().wrapping_add(i as usize);
    // SAFETY: `i` below `slots`: a slot of the mapping, whose state word is
    // aligned; the programs write it only with atomic or aligned stores.
    let state_of = |i: u32| unsafe { &*(&raw const (*slot(i)).state).cast::<AtomicU64>() };
    let walk = || {
        (0..slots)
            .filter(|i| state_of(*i).load(Ordering::Acquire) == state::LIVE)
            .count()
    };
    let started = std::time::Instant::now();
    let live = walk();
    let walked_in = started.elapsed();
    ensure!(live == 2 * flows, "{live} live slots for {flows} flows");
    for key in &flow_keys(0) {
        let at = chain(key, slots - 1)
            // SAFETY: as in `state_of`; the key is read once the slot is live.
            .find(|i| {
                state_of(*i).load(Ordering::Acquire) == state::LIVE
                    && unsafe { (*slot(*i)).key == *key }
            })
            .context("flow 0's entry not found through the mapping")?;
        let deleted = state_of(at).compare_exchange(
            state::LIVE,
            state::TOMBSTONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        ensure!(deleted.is_ok(), "slot {at} changed under the delete");
    }
    ensure!(
        walk() == 2 * flows - 2,
        "the deletes left {} live slots",
        walk()
    );
    let out = test_run::xdp(lines_prog, &new_flow(0), ifindex, 1)?;
    ensure!(
        out.verdict == XDP_TX,
        "flow 0 again: verdict {}",
        out.verdict
    );
    ensure!(walk() == 2 * flows, "flow 0 again: {} live slots", walk());
    println!(
        "through the mapping: {live} live slots counted in {:.1} ms ({slots} slots), flow 0 \
         deleted by compare-and-swap and opened anew by the program",
        walked_in.as_secs_f64() * 1e3
    );
    Ok(())
}

/// An address and port in network order, as keys hold them.
fn be((addr, port): (Ipv4Addr, u16)) -> (u32, u16) {
    (u32::from(addr).to_be(), port.to_be())
}

/// Flow `i`'s forward entry's key (client -> frontend) and its reply's
/// (backend -> client).
fn flow_keys(i: usize) -> [CtKey; 2] {
    let ((client, client_port), (frontend, frontend_port), (backend, backend_port)) =
        (be(client(i)), be(FRONTEND), be(BACKEND));
    [
        CtKey::new(client, frontend, client_port, frontend_port, proto::TCP),
        CtKey::new(backend, client, backend_port, client_port, proto::TCP),
    ]
}

/// Flow `i`'s first packet, to the one frontend.
fn new_flow(i: usize) -> Vec<u8> {
    let (addr, port) = client(i);
    Frame::tcp(addr, port, FRONTEND.0, FRONTEND.1).build(&[])
}

/// The same flow in IPv6: the client 2001:db8:ff::<its IPv4 address>, the
/// frontend 2001:db8:ff::1.
fn new_flow6(i: usize) -> Vec<u8> {
    let (addr, port) = client(i);
    let client =
        Ipv6Addr::from(0x2001_0db8_00ff_0000_0000_0000_0000_0000u128 | u32::from(addr) as u128);
    Frame::tcp(
        client,
        port,
        Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1),
        FRONTEND.1,
    )
    .build(&[])
}

/// The agent's side of the proposed table: every flow's forward and reply
/// entries found in the programs' `CT_LINES` with `proxy_common::ct_table`'s
/// hash and probing, as the agent would look them up (a program and the
/// agent that disagree on either lose every flow at a restart).
fn check_agent_finds(lines: &MappedArray<CtSlot>, flows: usize) -> anyhow::Result<()> {
    let (lines, mask) = (lines.array(), lines.elements() - 1);
    let find = |key: &CtKey| -> anyhow::Result<Option<CtSlot>> {
        for at in chain(key, mask) {
            let slot = lines.get(&at, 0)?;
            match slot.state {
                state::LIVE if slot.key == *key => return Ok(Some(slot)),
                state::EMPTY => return Ok(None),
                _ => {}
            }
        }
        Ok(None)
    };
    let nat = |slot: Option<CtSlot>| slot.map(|s| (s.value.nat_addr_be, s.value.nat_port_be));
    for i in 0..flows {
        let [forward, reply] = flow_keys(i);
        ensure!(
            nat(find(&forward)?) == Some(be(BACKEND)),
            "flow {i}: its forward entry is not where the agent looks for it"
        );
        ensure!(
            nat(find(&reply)?) == Some(be(FRONTEND)),
            "flow {i}: its reply entry is not where the agent looks for it"
        );
    }
    println!(
        "the agent's lookups found all {flows} flows' entries in the programs' one-line slots"
    );
    Ok(())
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn env_number(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}: not a number: {v:?}")),
        Err(_) => Ok(default),
    }
}

/// The last CPU, so that the figures are not one CPU's and then another's.
fn pin_to_last_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is valid; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus - 1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
