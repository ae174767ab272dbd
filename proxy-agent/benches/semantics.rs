//! The per-packet cost of a new flow under the service semantics of issue
//! 12, beside random balancing in one run (`tc_from_pod`, BPF_PROG_TEST_RUN,
//! one run per flow, rounds interleaved, medians; IPv4 and IPv6):
//!
//! - **random**: a service port without affinity;
//! - **affinity, pinned**: `sessionAffinity: ClientIP`, a new connection of a
//!   client already pinned (the affinity lookup hits and is refreshed);
//! - **affinity, new client**: the same service, each flow from another
//!   client address (the lookup misses, a backend is chosen and pinned);
//! - **maglev**: a service balanced by a Maglev table (the tuple's hash, the
//!   table reference and one table element read).
//!
//! Beside them, the next packet of each random flow (established: the
//! conntrack hit and the rewrite), per family.
//!
//! Then the agent side of Maglev: rebuilding the table of a service of 100
//! backends when one of them is replaced (time, and bytes written to the
//! kernel), beside writing the whole table, in the same run.
//!
//! `cargo bench -p proxy-agent --bench semantics` (root; the real object).

mod common;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Instant,
};

use anyhow::{Context as _, ensure};
use common::{enter_throwaway_netns, median, tcp};
use proxy_agent::{
    model::{
        Balancing, DesiredService, DesiredState, Endpoint, Protocol, ServicePortName,
        SessionAffinity,
    },
    modes::ebpf::{KernelMaps, MaglevSettings, MapSizes, Programmer, load_with, test_run},
};
use proxy_common::maglev::{MaglevChunk, chunks_per_table};
use proxy_common::{Counter, action::TC_ACT_REDIRECT};

const ROUNDS: usize = 15;
const FLOWS_PER_ROUND: usize = 60;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const CASES: [&str; 4] = [
    "random",
    "affinity, pinned",
    "affinity, new client",
    "maglev",
];
const MAGLEV_M: u32 = 16_381;

struct Plan {
    name: &'static str,
    client: IpAddr,
    random_vip: IpAddr,
    sticky_vip: IpAddr,
    hashed_vip: IpAddr,
    backends: [IpAddr; 3],
    /// Client `n` of the "new client" case.
    other_client: fn(u32) -> IpAddr,
}

fn plans() -> [Plan; 2] {
    let v6 = |s: &str| IpAddr::V6(s.parse::<Ipv6Addr>().unwrap());
    [
        Plan {
            name: "IPv4",
            client: IpAddr::V4(Ipv4Addr::new(198, 18, 128, 1)),
            random_vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)),
            sticky_vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 2)),
            hashed_vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 3)),
            backends: [1, 2, 3].map(|n| IpAddr::V4(Ipv4Addr::new(198, 18, 0, n))),
            other_client: |n| {
                IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 64, 0)) + n))
            },
        },
        Plan {
            name: "IPv6",
            client: v6("2001:db8:80::1"),
            random_vip: v6("2001:db8:ffff::1"),
            sticky_vip: v6("2001:db8:ffff::2"),
            hashed_vip: v6("2001:db8:ffff::3"),
            backends: ["2001:db8:1::1", "2001:db8:1::2", "2001:db8:1::3"].map(v6),
            other_client: |n| {
                IpAddr::V6(Ipv6Addr::from(
                    u128::from("2001:db8:40::".parse::<Ipv6Addr>().unwrap()) + u128::from(n),
                ))
            },
        },
    ]
}

fn main() {
    common::main("semantics", run);
}

fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let pod = enter_throwaway_netns()?;
    let sizes = MapSizes {
        maglev: 4 * chunks_per_table(MAGLEV_M),
        ..MapSizes::default()
    };
    let mut ebpf = load_with(sizes).context("loading the eBPF object")?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    let plans = plans();
    let mut services = Vec::new();
    for p in &plans {
        let endpoints: Vec<Endpoint> = p.backends.iter().map(|b| Endpoint::new(*b, 8080)).collect();
        let sticky = SessionAffinity::ClientIp {
            timeout_seconds: 10_800,
        };
        for (name, vip, affinity, balancing) in [
            (
                "random",
                p.random_vip,
                SessionAffinity::None,
                Balancing::Random,
            ),
            ("sticky", p.sticky_vip, sticky, Balancing::Random),
            (
                "hashed",
                p.hashed_vip,
                SessionAffinity::None,
                Balancing::Maglev,
            ),
        ] {
            let spn = ServicePortName {
                namespace: "bench".into(),
                name: format!("{name}-{}", p.name).to_lowercase().into(),
                port_name: "".into(),
                protocol: Protocol::Tcp,
            };
            services.push(DesiredService {
                session_affinity: affinity,
                balancing,
                ..DesiredService::cluster_ip(spn, vec![vip], 80, endpoints.clone())
            });
        }
    }
    let state = DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    };
    let mut programmer = Programmer::new();
    programmer.set_capacity(maps.capacity());
    programmer.set_maglev(MaglevSettings {
        table_size: MAGLEV_M,
        by_default: false,
    });
    programmer.sync(&state, &mut maps)?;
    let counter =
        |c: Counter| -> anyhow::Result<u64> { Ok(stats.get(&(c as u32), 0)?.iter().sum()) };

    // [family][case] samples in ns.
    let mut samples = vec![vec![Vec::<f64>::new(); CASES.len()]; 2];
    // [family]: the packet after each random flow's SYN, on the flow it opened.
    let mut established = vec![Vec::<f64>::new(); 2];
    let mut next_port = 20_000u16;
    let mut next_client = 0u32;
    for round in 0..ROUNDS {
        for k in 0..2 * CASES.len() {
            let (f, case) = ((round + k) % 2, (round + k / 2) % CASES.len());
            let p = &plans[f];
            let hits = counter(Counter::AffinityHit)?;
            for _ in 0..FLOWS_PER_ROUND {
                next_port = next_port.wrapping_add(1).max(1024);
                let (client, vip) = match case {
                    0 => (p.client, p.random_vip),
                    1 => (p.client, p.sticky_vip),
                    3 => (p.client, p.hashed_vip),
                    _ => {
                        next_client += 1;
                        ((p.other_client)(next_client), p.sticky_vip)
                    }
                };
                let syn = tcp(client, next_port, vip, 80, SYN);
                let out = test_run::run(&ebpf, test_run::Hook::FromPod, &syn, pod, 1)?;
                ensure!(
                    out.verdict == TC_ACT_REDIRECT,
                    "{} {}: not forwarded",
                    p.name,
                    CASES[case]
                );
                samples[f][case].push(out.duration.as_nanos() as f64);
                if case == 0 {
                    let before = counter(Counter::Established)?;
                    let ack = tcp(client, next_port, vip, 80, ACK);
                    let out = test_run::run(&ebpf, test_run::Hook::FromPod, &ack, pod, 1)?;
                    ensure!(
                        out.verdict == TC_ACT_REDIRECT
                            && counter(Counter::Established)? == before + 1,
                        "{}: the packet after the SYN did not take the established path",
                        p.name
                    );
                    established[f].push(out.duration.as_nanos() as f64);
                }
            }
            let hits = counter(Counter::AffinityHit)? - hits;
            let want_hits = match case {
                1 => hits + 1 >= FLOWS_PER_ROUND as u64,
                _ => hits == 0,
            };
            ensure!(
                want_hits,
                "{} {}: {hits} affinity hits in {FLOWS_PER_ROUND} flows",
                p.name,
                CASES[case]
            );
        }
    }

    println!(
        "tc_from_pod new flows (one run each, median), {ROUNDS} interleaved rounds of {FLOWS_PER_ROUND}\n"
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10}",
        "new flow", "IPv4 ns", "/random", "IPv6 ns", "/random"
    );
    for (c, label) in CASES.iter().enumerate() {
        let (v4, v6) = (median(&samples[0][c]), median(&samples[1][c]));
        let (r4, r6) = (median(&samples[0][0]), median(&samples[1][0]));
        println!(
            "{label:<24} {v4:>10.1} {:>10.3} {v6:>10.1} {:>10.3}",
            v4 / r4,
            v6 / r6
        );
    }
    let (e4, e6) = (median(&established[0]), median(&established[1]));
    println!(
        "\nestablished (the packet after a random flow's SYN): IPv4 {e4:.1} ns, IPv6 {e6:.1} ns, \
         IPv6/IPv4 {:.3}",
        e6 / e4
    );
    println!("\n(each figure includes the kernel's per-call cost around a single run)");
    drop(ebpf);
    table_rebuild()?;
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The agent's side: one backend of 100 replaced in a Maglev service,
/// against writing the whole table, both into real kernel maps.
fn table_rebuild() -> anyhow::Result<()> {
    const BACKENDS: u16 = 100;
    const ROUNDS: usize = 9;
    let sizes = MapSizes {
        maglev: 4 * chunks_per_table(MAGLEV_M),
        ..MapSizes::default()
    };
    let mut ebpf = load_with(sizes).context("loading the eBPF object")?;
    let (mut maps, _stats) = KernelMaps::take(&mut ebpf)?;
    let backend = |i: u16| {
        Endpoint::new(
            IpAddr::V4(Ipv4Addr::new(
                198,
                18,
                10 + (i / 250) as u8,
                (i % 250) as u8 + 1,
            )),
            8080,
        )
    };
    let service = |endpoints: Vec<Endpoint>| {
        let spn = ServicePortName {
            namespace: "bench".into(),
            name: "hundred".into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        };
        let svc = DesiredService {
            balancing: Balancing::Maglev,
            ..DesiredService::cluster_ip(
                spn,
                vec![IpAddr::V4(Ipv4Addr::new(198, 19, 1, 1))],
                80,
                endpoints,
            )
        };
        DesiredState {
            services: [(svc.name.clone(), svc)].into_iter().collect(),
            ..DesiredState::default()
        }
    };
    let element = std::mem::size_of::<MaglevChunk>();
    let (mut full_ns, mut change_ns, mut full_bytes, mut change_bytes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // A fresh programmer over emptied maps: the whole table is written.
        let mut programmer = Programmer::new();
        programmer.set_capacity(maps.capacity());
        programmer.set_maglev(MaglevSettings {
            table_size: MAGLEV_M,
            by_default: false,
        });
        let hundred: Vec<Endpoint> = (0..BACKENDS).map(backend).collect();
        let t = Instant::now();
        let full = programmer.sync(&service(hundred.clone()), &mut maps)?;
        full_ns.push(t.elapsed().as_nanos() as f64);
        full_bytes.push((full.maglev_elements * element) as f64);

        // One backend replaced by another.
        let mut changed = hundred;
        changed[round * 7 % BACKENDS as usize] = backend(BACKENDS + round as u16);
        let t = Instant::now();
        let change = programmer.sync(&service(changed), &mut maps)?;
        change_ns.push(t.elapsed().as_nanos() as f64);
        change_bytes.push((change.maglev_elements * element) as f64);
        programmer.sync(&DesiredState::default(), &mut maps)?;
    }
    let (full_t, change_t) = (median(&full_ns), median(&change_ns));
    let (full_b, change_b) = (median(&full_bytes), median(&change_bytes));
    println!(
        "\nMaglev table of {MAGLEV_M} buckets, {BACKENDS} backends, {ROUNDS} rounds (medians):\n"
    );
    println!(
        "{:<34} {:>12} {:>10} {:>12} {:>10}",
        "sync", "time us", "/full", "bytes", "/full"
    );
    println!(
        "{:<34} {:>12.0} {:>10.3} {:>12.0} {:>10.3}",
        "whole table (new service)",
        full_t / 1e3,
        1.0,
        full_b,
        1.0
    );
    println!(
        "{:<34} {:>12.0} {:>10.3} {:>12.0} {:>10.3}",
        "one of 100 backends replaced",
        change_t / 1e3,
        change_t / full_t,
        change_b,
        change_b / full_b
    );
    println!("(times include computing the table and the slot and backend writes)");
    Ok(())
}
