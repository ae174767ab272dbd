//! IPv6 beside IPv4: the per-packet cost of `tc_from_pod` for the same
//! service in each family, timed by the kernel with BPF_PROG_TEST_RUN in one
//! run, rounds interleaved (issue 11, Performance: IPv6 within 15% of IPv4).
//!
//! `cargo bench -p proxy-agent --bench families` (root; the real object).
//! One ClusterIP service per family with one backend, programmed by the
//! agent's own [`Programmer`]; the bench's throwaway network namespace routes
//! backends of both families to a permanent neighbour, so a forwarded packet
//! takes the whole path (conntrack, DNAT, FIB lookup, MAC rewrite, redirect),
//! and every figure checks the verdict and counters of the path it claims.
//!
//! - **established**: a probe flow (pod -> VIP, DNAT to the backend) paired
//!   with a mirror service (backend address and port -> VIP), so each of the
//!   200 iterations of one call is an established flow with the full rewrite.
//! - **new flow**: distinct tuples, one run each; the median.
//! - **pass-through**: a packet to an address no service has, in a loop.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Instant,
};

use anyhow::{Context as _, ensure};
mod common;

use common::{enter_throwaway_netns, mean, median, tcp};
use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{KernelMaps, Programmer, load, test_run},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_REDIRECT},
};

const ROUNDS: usize = 15;
const LOOP_REPEAT: u32 = 200;
const LOOP_CALLS: usize = 100;
/// New flows per family and round (one run each).
const NEW_FLOWS_PER_ROUND: usize = 60;
const PASS_REPEAT: u32 = 100_000;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// One family's addresses: pod client, VIP, backend, and a non-service destination.
struct Plan {
    client: IpAddr,
    vip: IpAddr,
    backend: IpAddr,
    nowhere: IpAddr,
}

fn plans() -> [(&'static str, Plan); 2] {
    let v6 = |s: &str| IpAddr::V6(s.parse::<Ipv6Addr>().unwrap());
    [
        (
            "IPv4",
            Plan {
                client: IpAddr::V4(Ipv4Addr::new(198, 18, 128, 1)),
                vip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)),
                backend: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
                nowhere: IpAddr::V4(Ipv4Addr::new(198, 18, 126, 1)),
            },
        ),
        (
            "IPv6",
            Plan {
                client: v6("2001:db8:80::1"),
                vip: v6("2001:db8:ffff::1"),
                backend: v6("2001:db8:1::1"),
                nowhere: v6("2001:db8:7e::1"),
            },
        ),
    ]
}

fn main() {
    common::main("families", run);
}

fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let pod = enter_throwaway_netns()?;
    let mut ebpf = load().context("loading the eBPF object")?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    let plans = plans();
    let mut services = Vec::new();
    for (family, p) in &plans {
        let name = |n: &str| ServicePortName {
            namespace: "bench".into(),
            name: format!("{n}-{family}").to_lowercase().into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
        };
        services.push(DesiredService::cluster_ip(
            name("web"),
            vec![p.vip],
            80,
            vec![Endpoint::new(p.backend, 8080)],
        ));
        // The mirror: the backend's address and port back to the VIP.
        services.push(DesiredService::cluster_ip(
            name("mirror"),
            vec![p.backend],
            8080,
            vec![Endpoint::new(p.vip, 80)],
        ));
    }
    let state = DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    };
    Programmer::new().sync(&state, &mut maps)?;
    let counter =
        |c: Counter| -> anyhow::Result<u64> { Ok(stats.get(&(c as u32), 0)?.iter().sum()) };

    // [family][metric] samples in ns.
    let mut samples = vec![vec![Vec::<f64>::new(); 3]; 2];
    let mut next_port = [20_000u16; 2];
    for round in 0..ROUNDS {
        for k in 0..2 {
            let f = (round + k) % 2;
            let p = &plans[f].1;
            // Established, in a loop of mirrored flows.
            let probe = tcp(p.client, 33_333, p.vip, 80, ACK);
            // Creates both flows (the probe's and the mirror's) the first time.
            let warm = test_run::run(&ebpf, test_run::Hook::FromPod, &probe, pod, 2)?;
            ensure!(
                warm.verdict == TC_ACT_REDIRECT,
                "{}: probe not forwarded",
                plans[f].0
            );
            let before = counter(Counter::Established)?;
            for _ in 0..LOOP_CALLS {
                let out = test_run::run(&ebpf, test_run::Hook::FromPod, &probe, pod, LOOP_REPEAT)?;
                ensure!(
                    out.verdict == TC_ACT_REDIRECT,
                    "{}: loop not forwarded",
                    plans[f].0
                );
                samples[f][0].push(out.duration.as_nanos() as f64);
            }
            let established = counter(Counter::Established)? - before;
            ensure!(
                established >= LOOP_CALLS as u64 * u64::from(LOOP_REPEAT),
                "{}: the loop was not all established flows",
                plans[f].0
            );
            // New flows, one run each.
            let before = counter(Counter::NewFlow)?;
            for _ in 0..NEW_FLOWS_PER_ROUND {
                next_port[f] += 1;
                let syn = tcp(p.client, next_port[f], p.vip, 80, SYN);
                let out = test_run::run(&ebpf, test_run::Hook::FromPod, &syn, pod, 1)?;
                ensure!(
                    out.verdict == TC_ACT_REDIRECT,
                    "{}: new flow not forwarded",
                    plans[f].0
                );
                samples[f][1].push(out.duration.as_nanos() as f64);
            }
            ensure!(
                counter(Counter::NewFlow)? > before,
                "{}: no new flow counted",
                plans[f].0
            );
            // Pass-through.
            let pass = tcp(p.client, 33_334, p.nowhere, 80, ACK);
            let out = test_run::run(&ebpf, test_run::Hook::FromPod, &pass, pod, PASS_REPEAT)?;
            ensure!(
                out.verdict == TC_ACT_OK && out.packet[..pass.len()] == pass[..],
                "pass-through touched"
            );
            samples[f][2].push(out.duration.as_nanos() as f64);
        }
    }

    println!("tc_from_pod, one ClusterIP service per family, {ROUNDS} interleaved rounds\n");
    println!(
        "{:<28} {:>10} {:>10} {:>12}",
        "per packet", "IPv4 ns", "IPv6 ns", "IPv6/IPv4"
    );
    for (m, label) in [
        "established (loop, mean)",
        "new flow (r=1, median)",
        "pass-through (loop, mean)",
    ]
    .iter()
    .enumerate()
    {
        let figure = |f: usize| {
            if m == 1 {
                median(&samples[f][m])
            } else {
                mean(&samples[f][m])
            }
        };
        let (v4, v6) = (figure(0), figure(1));
        println!("{label:<28} {v4:>10.1} {v6:>10.1} {:>12.3}", v6 / v4);
    }
    println!("\n(new-flow figures include the kernel's per-call cost around a single run)");
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
