//! New TCP connections per second from a process of the node to a
//! ClusterIP through the socket hooks, against the same process connecting
//! to the backend's address directly, in one run (issue 9, Performance:
//! target at least 95% of direct).
//!
//! `cargo bench -p proxy-agent --bench socket_lb`: needs root and the real
//! object. A testbed (node namespace, one pod with a server that accepts and
//! closes) and a cgroup of the bench's own carry it; nothing else is touched.
//!
//! Three ways are timed side by side, in rotating order, each round opening
//! and closing (with a RST, so no TIME_WAIT piles up) the same number of
//! connections from one thread of the node's namespace:
//! - **service**: the socket is made inside the hooks' cgroup and connects
//!   to the ClusterIP; `sock_connect4` points it at the backend.
//! - **direct, hooks present**: made inside the cgroup, connects to the
//!   backend's address (the hook looks it up and leaves it alone).
//! - **direct, no hooks**: made outside the cgroup, to the backend: the
//!   reference.

mod common;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Instant,
};

use anyhow::{Context as _, ensure};
use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        self, KernelMaps, Programmer,
        maps::NodeMaps as _,
        sockets::{SocketHooks, join_cgroup, netns_cookie, own_cgroup},
    },
};
use proxy_common::{Counter, DatapathConfig, config::flags};
use testbed::{Cni, Testbed, cgroup::TestCgroup, netns};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const PORT: u16 = 8080;
const ROUNDS: usize = 30;
const PER_ROUND: usize = 2000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Service,
    DirectWithHooks,
    DirectNoHooks,
}

impl Way {
    const ALL: [Way; 3] = [Way::Service, Way::DirectWithHooks, Way::DirectNoHooks];

    fn name(self) -> &'static str {
        match self {
            Way::Service => "service (socket hook)",
            Way::DirectWithHooks => "direct, hooks present",
            Way::DirectNoHooks => "direct, no hooks (reference)",
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("socket_lb bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "this bench loads BPF programs: run it as root"
    );
    let tb = Testbed::new(Cni::Routed, &["web"])?;
    let backend = tb.pod("web").ip;
    let listener = netns::run_in(&tb.pod("web").ns, listen)??;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });

    let mut ebpf = ebpf::load()?;
    ebpf::load_socket_programs(&mut ebpf)?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    let cookie = netns::run_in(&tb.node_ns, netns_cookie)??;
    maps.put_config(&DatapathConfig {
        flags: flags::SOCKET_LB_HOST,
        host_netns_cookie: cookie,
        ..DatapathConfig::default()
    })?;
    let name = ServicePortName {
        namespace: "bench".into(),
        name: "web".into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
    };
    let svc = DesiredService::cluster_ip(
        name.clone(),
        vec![IpAddr::V4(VIP)],
        80,
        vec![Endpoint::new(IpAddr::V4(backend), PORT)],
    );
    let state = DesiredState {
        services: [(name, svc)].into_iter().collect(),
        ..DesiredState::default()
    };
    Programmer::new().sync(&state, &mut maps)?;
    let cgroup = TestCgroup::new("bench")?;
    let hooks = SocketHooks::attach(&mut ebpf, &cgroup.path, None)?;

    let home = own_cgroup(&testbed::cgroup::cgroup2_root()?)?;
    let node_ns = tb.node_ns.clone();
    let cgroup_path = cgroup.path.clone();
    let mut rates: Vec<(Way, Vec<f64>)> = Way::ALL.iter().map(|w| (*w, Vec::new())).collect();
    let translated_before = counter(&stats, Counter::SockTranslated);
    // The kernel's own run-time accounting of the programs, while this fd lives.
    let _run_time = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    for round in 0..ROUNDS {
        for i in 0..Way::ALL.len() {
            let way = Way::ALL[(round + i) % Way::ALL.len()];
            let dst = match way {
                Way::Service => SocketAddr::from((VIP, 80)),
                _ => SocketAddr::from((backend, PORT)),
            };
            let into = if way == Way::DirectNoHooks {
                home.clone()
            } else {
                cgroup_path.clone()
            };
            let home = home.clone();
            let rate = netns::run_in(&node_ns, move || -> anyhow::Result<f64> {
                join_cgroup(&into)?;
                let started = Instant::now();
                let result = (0..PER_ROUND).try_for_each(|_| connect_and_reset(dst));
                let elapsed = started.elapsed();
                join_cgroup(&home)?;
                result?;
                Ok(PER_ROUND as f64 / elapsed.as_secs_f64())
            })??;
            rates
                .iter_mut()
                .find(|(w, _)| *w == way)
                .unwrap()
                .1
                .push(rate);
        }
    }
    let translated = counter(&stats, Counter::SockTranslated) - translated_before;
    ensure!(
        translated == (ROUNDS * PER_ROUND) as u64,
        "the hook translated {translated} connections, not the {} the service way made",
        ROUNDS * PER_ROUND
    );
    let connect_hook: &aya::programs::CgroupSockAddr = ebpf
        .program("sock_connect4")
        .context("sock_connect4")?
        .try_into()?;
    let info = connect_hook.info()?;
    let release_hook: &aya::programs::CgroupSock = ebpf
        .program("sock_release")
        .context("sock_release")?
        .try_into()?;
    let release = release_hook.info()?;
    drop(hooks);

    println!(
        "\nsocket_lb: new TCP connections per second from the node to a pod on a veth, {ROUNDS} rounds of {PER_ROUND}, median (min-max)"
    );
    let median = |v: &mut [f64]| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per_round = rates.clone();
    let mut medians = Vec::new();
    for (way, v) in &mut rates {
        let (min, max) = (
            v[0].min(v[v.len() - 1]),
            v.iter().copied().fold(0.0, f64::max),
        );
        let m = median(v);
        let min = v.iter().copied().fold(min, f64::min);
        println!("  {:<30} {:>9.0} /s   ({min:.0}-{max:.0})", way.name(), m);
        medians.push((*way, m));
    }
    let of = |w: Way| medians.iter().find(|(x, _)| *x == w).unwrap().1;
    // Each round's three ways ran back to back: their ratio is what the
    // machine's drift between rounds disturbs least.
    let rounds_of = |w: Way| &per_round.iter().find(|(x, _)| *x == w).unwrap().1;
    let mut paired: Vec<f64> = rounds_of(Way::Service)
        .iter()
        .zip(rounds_of(Way::DirectNoHooks))
        .map(|(s, d)| s / d)
        .collect();
    println!(
        "  service / direct (no hooks): {:.1}% of the medians, {:.1}% the median of the rounds' ratios; \
         service / direct (hooks present): {:.1}%; target >= 95%",
        of(Way::Service) / of(Way::DirectNoHooks) * 100.0,
        median(&mut paired) * 100.0,
        of(Way::Service) / of(Way::DirectWithHooks) * 100.0
    );
    let runs = info.run_count().max(1);
    let hook_ns = info.run_time().as_nanos() as f64 / runs as f64;
    let connection_ns = 1e9 / of(Way::DirectNoHooks);
    println!(
        "  sock_connect4 (the kernel's run-time stats): {hook_ns:.0} ns per connect over {runs} runs, \
         {:.2}% of a direct connection's {connection_ns:.0} ns",
        hook_ns / connection_ns * 100.0
    );
    let closes = release.run_count().max(1);
    let release_ns = release.run_time().as_nanos() as f64 / closes as f64;
    println!(
        "  sock_release (the same): {release_ns:.0} ns per close over {closes} runs, {:.2}% of a direct connection",
        release_ns / connection_ns * 100.0
    );
    Ok(())
}

/// One connection, closed with a RST so the client keeps no TIME_WAIT.
fn connect_and_reset(dst: SocketAddr) -> anyhow::Result<()> {
    let conn = TcpStream::connect(dst).with_context(|| format!("connecting to {dst}"))?;
    common::socket_linger_zero(&conn)?;
    drop(conn);
    Ok(())
}

fn counter(stats: &aya::maps::PerCpuArray<aya::maps::MapData, u64>, c: Counter) -> u64 {
    stats.get(&(c as u32), 0).map_or(0, |v| v.iter().sum())
}

/// The server's socket, with a backlog deep enough that a burst of
/// connections never finds the accept queue full (std's 128 can be, and a
/// SYN dropped for it costs the client a one-second retransmission).
fn listen() -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT))?;
    use std::os::fd::AsRawFd as _;
    // SAFETY: listen(2) again on our own bound socket only raises the backlog.
    if unsafe { libc::listen(listener.as_raw_fd(), 4096) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(listener)
}
