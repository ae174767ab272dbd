//! Fuzzing every datapath program (`tc_from_pod`, `tc_from_netdev`,
//! `xdp_from_netdev`) through BPF_PROG_TEST_RUN, in each address family:
//! seeded random frames (pure garbage, service requests, replies of live
//! flows, ICMP / ICMPv6 errors quoting them, VLAN frames, the other family's
//! frames, ARP) and mutations of them (truncated, wrong lengths, IPv4
//! options or IPv6 extension headers, fragments, every TCP flag
//! combination, bad checksums) go through the real programs with the real
//! maps, programmed by the agent's own `Programmer` and `NodeProgrammer`.
//! Every outcome is judged by an oracle that knows only the fixture's
//! services and the flows it saw being created, not the datapath's code:
//!
//! - the action is one the hook allows and the test run never fails (but
//!   for the frames the kernel refuses to run: shorter than an Ethernet
//!   header, or for TC than an IPv4 / IPv6 header);
//! - a new destination is an endpoint of the service whose frontend the
//!   packet was sent to (with that service's traffic policy, masquerade and
//!   source ranges applied), with checksums as valid as they came in, and
//!   only addresses, ports, checksums, TTL / hop limit and MACs changed;
//! - a source rewritten to a frontend is the reply of a flow forwarded
//!   earlier in the run, translated back to exactly that flow's client,
//!   and a new flow never takes a live flow's reply tuple;
//! - a reject (TCP RST, ICMP / ICMPv6 port unreachable) answers only a
//!   service without endpoints or an unused port of a cluster IP, and is
//!   well made;
//! - a drop has a reason the service gives (source ranges, no local
//!   endpoint, masquerade ports crowded, a reject that cannot be built);
//! - anything else leaves untouched (or, malformed, is dropped).
//!
//! Each family has a world of its own (`v4.rs`, `v6.rs`: the node's
//! addresses and the same services); the other family's frames are passed
//! on untouched there, as no service of it exists. Timeouts are an hour and
//! the conntrack table holds every flow of the run, so the oracle's model of
//! the flows stays exact. The regression cases (`regressions.rs`) are what
//! the fuzzer found, minimised.
//!
//! Each program and family gets its own object, maps and network namespace
//! (one `unshare` per test thread: a node with an external veth and a pod
//! veth, neighbours and routes for the FIB lookups; addresses from
//! 198.18.0.0/15 and 2001:db8::/32). The XDP program's `XDP_PASS` goes on to
//! `tc_from_netdev` of the same maps, as in the kernel, so flows XDP created
//! without finishing are seen.
//!
//! `KUBE_EBPF_PROXY_FUZZ_PACKETS=N` sets the packets per program and family
//! (default 20,000); `KUBE_EBPF_PROXY_FUZZ_SEED` the seed. `cargo xtask
//! fuzz` runs a million. Needs root.

mod family;
mod fixture;
mod generate;
mod oracle;
mod regressions;
mod rng;
mod shape;
mod v4;
mod v6;
mod world;

use std::time::Instant;

use proxy_agent::modes::ebpf::test_run::Hook;

use self::{
    family::Fam,
    fixture::Fixture,
    generate::Generator,
    oracle::{Judged, Oracle, hex, verdict_name},
    rng::Rng,
    v4::Ipv4,
    v6::Ipv6,
    world::World,
};

const PACKETS_VAR: &str = "KUBE_EBPF_PROXY_FUZZ_PACKETS";
const SEED_VAR: &str = "KUBE_EBPF_PROXY_FUZZ_SEED";
const DEFAULT_PACKETS: u64 = 20_000;
const DEFAULT_SEED: u64 = 0x6b75_6265_7072_7879;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim().replace('_', "");
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        }
        Err(_) => default,
    }
}

fn program_name(hook: Hook) -> &'static str {
    match hook {
        Hook::FromPod => "tc_from_pod",
        Hook::FromNetdev => "tc_from_netdev",
        Hook::Xdp => "xdp_from_netdev",
        Hook::FromHost => "tc_from_host",
    }
}

fn fuzz<F: Fam>(hook: Hook) {
    let packets = env_u64(PACKETS_VAR, DEFAULT_PACKETS);
    let seed = env_u64(SEED_VAR, DEFAULT_SEED);
    // Room for every flow of the run (two entries each) without eviction.
    let conntrack = (packets.next_power_of_two() as u32).clamp(1 << 16, 1 << 21);
    let world = World::<F>::new();
    let fx = Fixture::new::<F>(conntrack, &world.specs);
    let generator = Generator { world: &world };
    let mut oracle = Oracle::new(&world);
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    for index in 0..packets {
        let (class, pkt) = generator.next(&mut rng, &oracle.model);
        oracle.run(&fx, hook, index, class, &pkt);
    }
    let elapsed = start.elapsed();
    report(hook, seed, &oracle, elapsed);
    // A rule that never fires checks nothing: at this many packets each
    // of these has fired hundreds of times.
    if packets >= DEFAULT_PACKETS {
        let s = &oracle.stats;
        assert!(
            s.fragments_followed > 0,
            "no later fragment followed its flow"
        );
        assert!(
            s.translated_past_options > 0,
            "nothing translated past options"
        );
        assert!(
            s.results.get(&Judged::Reply).is_some_and(|&n| n > 0),
            "no reply"
        );
    }
}

fn report<F: Fam>(hook: Hook, seed: u64, oracle: &Oracle<F>, elapsed: std::time::Duration) {
    let s = &oracle.stats;
    let list = |m: &mut dyn Iterator<Item = (String, u64)>| {
        m.map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let r = |k| s.results.get(&k).copied().unwrap_or(0);
    let followups = match hook {
        Hook::Xdp => format!(
            "; then tc_from_netdev on the {} XDP_PASS of TCP/UDP and later fragments [{}]",
            s.followups,
            list(
                &mut s
                    .followup_results
                    .iter()
                    .map(|(k, v)| (format!("{k:?}").to_lowercase(), *v))
            )
        ),
        _ => String::new(),
    };
    println!(
        "fuzz {} ({}): {} packets, verdicts [{}]; forwarded {}, replies {}, rejected {}, dropped {}, passed {}, refused by the kernel {}{followups}; \
         {} flows ({} on a closed flow's reply tuple), {} later fragments translated as their flow, {} packets translated past IPv4 options / IPv6 extension headers, {}/256 TCP flag combinations, translated although the kernel's input checks would drop them [{}]; {} violations; {:.1} s (seed {seed:#x})",
        program_name(hook),
        F::NAME,
        s.packets,
        list(&mut s.verdicts.iter().map(|(k, v)| (k.clone(), *v))),
        r(Judged::Forwarded),
        r(Judged::Reply),
        r(Judged::Rejected),
        r(Judged::Dropped),
        r(Judged::Passed),
        r(Judged::Refused),
        oracle.model.forwards.len(),
        s.taken_over,
        s.fragments_followed,
        s.translated_past_options,
        s.tcp_flag_combinations.len(),
        list(
            &mut s
                .translated_invalid_header
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
        ),
        oracle.violation_count,
        elapsed.as_secs_f64(),
    );
    if oracle.violation_count > 0 {
        let mut msg = format!(
            "{} invariant violations in {} ({}) ({:?}), the first of each:\n",
            oracle.violation_count,
            program_name(hook),
            F::NAME,
            oracle.by_invariant,
        );
        for v in &oracle.violations {
            msg += &format!(
                "  #{} ({:?}, {}): {}\n    in : {}\n    out: {} {}\n",
                v.index,
                v.class,
                program_name(v.hook),
                v.what,
                hex(&v.input),
                v.verdict
                    .map_or("error".into(), |x| verdict_name(v.hook, x)),
                hex(&v.output),
            );
        }
        panic!("{msg}");
    }
}

#[test]
fn fuzz_tc_from_pod() {
    fuzz::<Ipv4>(Hook::FromPod);
}

#[test]
fn fuzz_tc_from_netdev() {
    fuzz::<Ipv4>(Hook::FromNetdev);
}

#[test]
fn fuzz_xdp_from_netdev() {
    fuzz::<Ipv4>(Hook::Xdp);
}

#[test]
fn fuzz_ipv6_tc_from_pod() {
    fuzz::<Ipv6>(Hook::FromPod);
}

#[test]
fn fuzz_ipv6_tc_from_netdev() {
    fuzz::<Ipv6>(Hook::FromNetdev);
}

#[test]
fn fuzz_ipv6_xdp_from_netdev() {
    fuzz::<Ipv6>(Hook::Xdp);
}
