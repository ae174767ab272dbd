//! The per-packet cost of a new flow under the service semantics of issue
//! 12, beside random balancing in one run (`tc_from_pod`, BPF_PROG_TEST_RUN,
//! one run per flow, rounds interleaved, medians; IPv4 and IPv6):
//!
//! - **random**: a service port without affinity;
//! - **affinity, pinned**: `sessionAffinity: ClientIP`, a new connection of a
//!   client already pinned (the affinity lookup hits and is refreshed);
//! - **affinity, new client**: the same service, each flow from another
//!   client address (the lookup misses, a backend is chosen and pinned).
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
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName, SessionAffinity},
    modes::ebpf::{KernelMaps, Programmer, load, test_run},
};
use proxy_common::{Counter, action::TC_ACT_REDIRECT};

const ROUNDS: usize = 15;
const FLOWS_PER_ROUND: usize = 60;
const SYN: u8 = 0x02;
const CASES: [&str; 3] = ["random", "affinity, pinned", "affinity, new client"];

struct Plan {
    name: &'static str,
    client: IpAddr,
    random_vip: IpAddr,
    sticky_vip: IpAddr,
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
    let mut ebpf = load().context("loading the eBPF object")?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    let plans = plans();
    let mut services = Vec::new();
    for p in &plans {
        let endpoints: Vec<Endpoint> = p.backends.iter().map(|b| Endpoint::new(*b, 8080)).collect();
        for (name, vip, affinity) in [
            ("random", p.random_vip, SessionAffinity::None),
            (
                "sticky",
                p.sticky_vip,
                SessionAffinity::ClientIp {
                    timeout_seconds: 10_800,
                },
            ),
        ] {
            let spn = ServicePortName {
                namespace: "bench".into(),
                name: format!("{name}-{}", p.name).to_lowercase(),
                port_name: String::new(),
                protocol: Protocol::Tcp,
            };
            services.push(DesiredService {
                session_affinity: affinity,
                ..DesiredService::cluster_ip(spn, vec![vip], 80, endpoints.clone())
            });
        }
    }
    let state = DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    };
    Programmer::new().sync(&state, &mut maps)?;
    let counter =
        |c: Counter| -> anyhow::Result<u64> { Ok(stats.get(&(c as u32), 0)?.iter().sum()) };

    // [family][case] samples in ns.
    let mut samples = vec![vec![Vec::<f64>::new(); CASES.len()]; 2];
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
    println!("\n(each figure includes the kernel's per-call cost around a single run)");
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
