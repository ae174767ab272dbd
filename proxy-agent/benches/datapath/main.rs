//! Per-packet cost of the real eBPF programs, as the kernel times them with
//! BPF_PROG_TEST_RUN, at 1, 1,000 and 100,000 services (issue 4, Performance).
//!
//! `cargo bench -p proxy-agent --bench datapath`: needs root and the real
//! object (do not set AYA_BUILD_SKIP). Runs in well under a minute.
//!
//! `tc_from_pod` sees TCP packets from a pod to cluster IPs, and
//! `xdp_from_netdev` sees TCP packets from outside to a NodePort
//! (externalTrafficPolicy Local, so no masquerade). The maps are programmed
//! by the agent's own [`Programmer`], with 3 backends per service. The bench
//! runs in a throwaway network namespace whose routes send backends and
//! service IPs to a permanent neighbour on the uplink, so a forwarded packet
//! takes the whole path: conntrack, DNAT, FIB lookup, MAC rewrite and
//! redirect (TC) or XDP_TX. BPF_PROG_TEST_RUN sends nothing anywhere.
//!
//! Every batch checks the datapath's counters, so a figure is printed only
//! for the path it claims to time. The tiers are measured side by side:
//! each round goes through every tier, in rotating order.
//!
//! How each figure is taken:
//! - **established (loop)**: BPF_PROG_TEST_RUN runs all `repeat` iterations
//!   on one skb, which the program rewrites in place. A repeated packet to a
//!   service would be an established flow once and a packet to the backend
//!   (not a service) after that. So the probe flow (client -> VIP, DNAT to
//!   backend B) is paired with a mirror flow (client -> B, DNAT back to the
//!   VIP, through a one-backend mirror service): every iteration is an
//!   established flow with the full rewrite. 200 iterations per call, since
//!   each one takes the TTL down by one.
//! - **new flow**: a new flow can be timed only once: 20,000 distinct tuples
//!   spread over the services, one run each (r=1); mean, p50 and p99.
//! - **new flow, one service**: as many more, all to the tier's first
//!   service: what the number of services programmed costs a new flow, apart
//!   from what spreading the traffic over them costs (cold entries, and a
//!   neighbour per backend for the FIB).
//! - **established (r=1)**: the same one-run timing for the probe flow, and
//!   for the 20,000 flows once they exist (many services: cache effects).
//! - **pass-through**: a packet to a non-service address. The program leaves
//!   it untouched, so it is timed both ways, with one run per call and in a
//!   loop. The difference is the kernel's per-call cost around a single run
//!   (clock reads, setup, caches the syscall path cooled). Subtract it from
//!   any r=1 figure.
//! - **NodePort (XDP)**: r=1 only, for the same reason as above; all flows go
//!   to the one NodePort frontend.
//! - **floor**: `bench_floor` (proxy-ebpf's `bench-floor` object), the least
//!   any service datapath does for a packet to a service: one hash lookup of
//!   the destination, the address/port rewrite with both checksums updated,
//!   the MAC addresses swapped, XDP_TX. Its map holds every tier's frontends,
//!   plus a mirror entry (backend -> VIP) for its loop; it is timed the same
//!   ways (r=1 and loop, hit and pass-through) in the same rounds, and every
//!   path of ours is reported as a ratio to it: a figure that holds across
//!   machines where nanoseconds do not.
//! - **aged tables** (`DATAPATH_AGE_FLOWS=n`): see [`Tier::age`]. A new
//!   table gives its entries out in memory order, which flatters new flows.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

mod katran;
mod profile;

use anyhow::{Context as _, bail, ensure};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
    programs::Xdp,
};
use proxy_agent::{
    cli::packet::{ETH_HLEN, Frame, IPV4_HLEN, fix_checksums, tcp_flags},
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::ebpf::{
        KernelMaps, MapSizes, NodeFacts, NodeProgrammer, Programmer, ServiceMaps, load_with,
        node::{NodeAddresses, SNAT_PORT_MAX, SNAT_PORT_MIN},
        test_run,
    },
    sources::host::HostNetwork,
};
use proxy_common::{
    Backend, Counter, CtKey, DatapathConfig, IfaceInfo, ServiceKey, ServiceValue, V4,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, XDP_PASS, XDP_TX},
    config,
};

/// The services of each tier; `DATAPATH_TIERS` (comma-separated) overrides them.
const TIERS: [usize; 3] = [1, 1_000, 100_000];
const BACKENDS_PER_SERVICE: usize = 3;
const ROUNDS: usize = 20;
/// repeat=1 calls per round for the pass-through packets and the probe flows.
const CALLS_PER_ROUND: usize = 5_000;
/// 20,000 distinct new flows per program and tier over the whole run.
const NEW_FLOWS_PER_ROUND: usize = 1_000;
/// Iterations per call of the established loop; the TTL (255) must stay above 1.
const LOOP_REPEAT: u32 = 200;
const LOOP_CALLS_PER_ROUND: usize = 100;
const PASS_LOOP_REPEAT: u32 = 100_000;
/// The same in every tier; the run uses about 120,000 entries of it.
const CONNTRACK_ENTRIES: u32 = 262_144;

/// The floor program's object, built beside the datapath's by build.rs.
static FLOOR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bench-floor"));
const FLOOR_PROGRAM: &str = "bench_floor";

/// Service ports the agent can number: ids are u32 and 0 is never used.
const MAX_SERVICE_PORTS: usize = u32::MAX as usize - 1;
// Stops compiling when the id type changes, so the constant above gets revisited.
const _: fn(ServiceValue) -> u32 = |v| v.service_id;
/// Service ports every tier has besides its services: the mirror and the NodePort.
const EXTRA_SERVICE_PORTS: usize = 2;

// Addresses, all in 198.18.0.0/15 (RFC 2544 benchmarking): cluster IPs in
// 198.19.0.0/16, backends in 198.18.0.0/17, this node's pods (the clients of
// cluster IPs) in 198.18.128.0/18, external clients in 198.18.192.0/18 below
// the node's own subnet, 198.18.255.0/24.
const VIP_BASE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const VIP_SPAN: usize = 65_000;
const BACKEND_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const BACKEND_SPAN: usize = 32_000;
/// clusterCIDR with detectLocalMode ClusterCIDR, kube-proxy's default mode.
const POD_CIDR: &str = "198.18.128.0/18";
const POD_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 1);
const EXTERNAL_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 192, 1);
const CLIENT_SPAN: usize = 16_000;
const PROBE_POD: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 191, 1), 33_333);
const PASS_POD: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 191, 2), 33_334);
const PROBE_EXTERNAL: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 254, 200), 33_333);
const PASS_EXTERNAL: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 254, 201), 33_334);
/// No service: pass-through traffic goes here.
const PASS_DST: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 18, 126, 1), 80);
const NODE_PORT_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const NODE_PORT_BACKENDS: Ipv4Addr = Ipv4Addr::new(198, 18, 127, 1);
const NODE_PORT: u16 = 30_080;
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 2);
const NODE_PORT_FRONTEND: (Ipv4Addr, u16) = (NODE_IP, NODE_PORT);
const NODE_PREFIX: u8 = 24;
const GATEWAY: &str = "198.18.255.1";
const GATEWAY_MAC: &str = "02:00:00:00:00:01";
const ROUTED: [&str; 2] = ["198.18.0.0/17", "198.19.0.0/16"];
const POD_IFACE: &str = "pod0";
const UPLINK_IFACE: &str = "eth0";

fn main() {
    if let Err(e) = run() {
        eprintln!("datapath bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "this bench loads BPF programs and creates a network namespace: run it as root"
    );
    print_machine();
    let ifaces = enter_throwaway_netns()?;
    let (cpu, realtime) = pin_to_current_cpu()?;
    let policy = if realtime {
        "SCHED_FIFO"
    } else {
        "normal priority (SCHED_FIFO refused)"
    };
    println!("bench pinned to CPU {cpu} at {policy}, in a throwaway network namespace");
    println!(
        "new flows take their destination's cached next hop (proxy-ebpf's hops): {}\n",
        if shares_next_hops()? {
            "yes (the namespace routes by destination alone)"
        } else {
            "no, every new flow asks the FIB"
        }
    );

    // One map geometry for every tier, as in production where capacities are
    // configured, not derived from the services: only the contents differ.
    let tier_sizes: Vec<usize> = match std::env::var("DATAPATH_TIERS") {
        Ok(v) => v
            .split(',')
            .map(|n| n.trim().parse().context("DATAPATH_TIERS: numbers"))
            .collect::<anyhow::Result<_>>()?,
        Err(_) => TIERS.to_vec(),
    };
    let largest = *tier_sizes.iter().max().context("DATAPATH_TIERS is empty")?;
    let sizes = Layout::new(largest).map_sizes();
    println!(
        "map capacities in every tier: {} service entries, {} backend slots, {} backends, {} conntrack entries",
        group(sizes.services as usize),
        group(sizes.slots as usize),
        group(sizes.backends as usize),
        group(sizes.conntrack as usize)
    );
    let work = tempfile::tempdir()?;
    let katran_object = katran::from_env(work.path());
    if let Err(why) = &katran_object {
        println!("Katran: {why}");
    }
    let profiled = match std::env::var("DATAPATH_PROFILE") {
        Ok(name) => Some(profile::metric(&name)?),
        Err(_) => None,
    };
    let aged_by: usize = match std::env::var("DATAPATH_AGE_FLOWS") {
        Ok(v) => v.trim().parse().context("DATAPATH_AGE_FLOWS: a number")?,
        Err(_) => 0,
    };
    let mut tiers = Vec::new();
    for &n in &tier_sizes {
        let mut tier = Tier::new(n, sizes, ifaces, katran_object.as_ref().ok())?;
        if aged_by > 0 {
            tier.age(aged_by)?;
        }
        tiers.push(tier);
    }
    println!();
    if let Some(metric) = profiled {
        return profile::run(&tiers[0], metric);
    }
    let mut results: Vec<Results> = tiers.iter().map(|_| Results::default()).collect();
    for round in 0..ROUNDS {
        for i in 0..tiers.len() {
            let t = (round + i) % tiers.len();
            tiers[t].measure_round(round, &mut results[t])?;
        }
    }
    report(&tiers, &results);
    println!(
        "\ntotal bench time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Where the services live in the address plan.
///
/// The agent numbers service ports with a u16, so above 65,533 service ports
/// (two ids stay free for the extra services) each service port carries more
/// than one cluster IP. The datapath sees the same maps either way: one
/// frontend entry plus one slot per backend for each cluster IP.
struct Layout {
    frontends: usize,
    vips_per_port: usize,
}

impl Layout {
    fn new(frontends: usize) -> Self {
        Layout {
            frontends,
            vips_per_port: frontends.div_ceil(MAX_SERVICE_PORTS - EXTRA_SERVICE_PORTS),
        }
    }

    fn service_ports(&self) -> usize {
        self.frontends.div_ceil(self.vips_per_port)
    }

    /// Cluster IP and port of frontend `f`; the frontends of one service
    /// port share its port.
    fn frontend(&self, f: usize) -> (Ipv4Addr, u16) {
        let k = self.vips_per_port;
        let (port_index, vip_in_port) = (f / k, f % k);
        let per_port = VIP_SPAN / k;
        (
            offset(VIP_BASE, (port_index % per_port) * k + vip_in_port),
            80 + (port_index / per_port) as u16,
        )
    }

    fn backend(&self, port_index: usize, b: usize) -> (Ipv4Addr, u16) {
        let i = port_index * BACKENDS_PER_SERVICE + b;
        (
            offset(BACKEND_BASE, i % BACKEND_SPAN),
            8080 + (i / BACKEND_SPAN) as u16,
        )
    }

    /// The services, plus a NodePort service with externalTrafficPolicy
    /// Local whose endpoints all run on this node.
    fn state(&self) -> DesiredState {
        let mut services = BTreeMap::new();
        for s in 0..self.service_ports() {
            let first = s * self.vips_per_port;
            let last = (first + self.vips_per_port).min(self.frontends);
            let vips = (first..last)
                .map(|f| IpAddr::V4(self.frontend(f).0))
                .collect();
            let endpoints = (0..BACKENDS_PER_SERVICE)
                .map(|b| {
                    let (ip, port) = self.backend(s, b);
                    Endpoint::new(IpAddr::V4(ip), port)
                })
                .collect();
            let name = port_name(&format!("svc-{s}"));
            let svc =
                DesiredService::cluster_ip(name.clone(), vips, self.frontend(first).1, endpoints);
            services.insert(name, svc);
        }
        let local: Vec<Endpoint> = (0..BACKENDS_PER_SERVICE)
            .map(|b| Endpoint {
                is_local: true,
                ..Endpoint::new(IpAddr::V4(offset(NODE_PORT_BACKENDS, b)), 8080)
            })
            .collect();
        let name = port_name("node-port");
        let mut svc = DesiredService::cluster_ip(
            name.clone(),
            vec![IpAddr::V4(NODE_PORT_VIP)],
            80,
            local.clone(),
        );
        svc.node_port = Some(NODE_PORT);
        svc.external_policy_local = true;
        svc.local_endpoints = local;
        services.insert(name, svc);
        DesiredState {
            services,
            ..DesiredState::default()
        }
    }

    /// New flow `j` to a cluster IP: a distinct pod address and port, to a
    /// frontend picked by a stride that spreads consecutive flows over the services.
    fn new_flow(&self, j: usize) -> Vec<u8> {
        tcp(
            client(POD_BASE, j),
            self.frontend(j * 7_919 % self.frontends),
            tcp_flags::SYN,
        )
    }

    /// New flow `j` to the tier's first frontend, from clients of its own
    /// (source ports no [`Layout::new_flow`] uses).
    fn new_flow_one_service(&self, j: usize) -> Vec<u8> {
        let (addr, port) = client(POD_BASE, j);
        tcp((addr, port + 1_000), self.frontend(0), tcp_flags::SYN)
    }

    /// Map capacities for this many frontends, with room for a cluster-IP
    /// marker entry per VIP and for the extra services.
    fn map_sizes(&self) -> MapSizes {
        let slack = 1_024;
        MapSizes {
            services: (self.frontends * 2 + slack) as u32,
            backends: (self.service_ports() * BACKENDS_PER_SERVICE + slack) as u32,
            conntrack: CONNTRACK_ENTRIES,
            // Each frontend's slots take a range rounded up to 4.
            slots: (self.frontends * BACKENDS_PER_SERVICE.div_ceil(4) * 4 + slack) as u32,
            ..MapSizes::default()
        }
    }
}

/// The floor program, its map holding one entry per frontend (to the
/// frontend's first backend) and the mirror entry of its loop (frontend 0's
/// first backend back to frontend 0).
fn load_floor(layout: &Layout) -> anyhow::Result<Ebpf> {
    ensure!(
        !FLOOR_OBJECT.is_empty(),
        "the floor object is empty: this build skipped the eBPF programs (AYA_BUILD_SKIP)"
    );
    let mut ebpf = Ebpf::load(FLOOR_OBJECT).context("loading the floor object")?;
    let prog: &mut Xdp = ebpf
        .program_mut(FLOOR_PROGRAM)
        .context("floor program missing")?
        .try_into()?;
    prog.load().context("loading the floor program")?;
    let mut map: HashMap<_, ServiceKey, Backend> =
        HashMap::try_from(ebpf.map_mut("FLOOR").context("FLOOR map missing")?)?;
    let key = |(ip, port): (Ipv4Addr, u16)| ServiceKey {
        addr_be: u32::from(ip).to_be(),
        port_be: port.to_be(),
        slot: 0,
        proto: proxy_common::proto::TCP,
        scope: 0,
        _pad: [0; 2],
    };
    let to = |(ip, port): (Ipv4Addr, u16)| Backend {
        addr_be: u32::from(ip).to_be(),
        port_be: port.to_be(),
        proto: proxy_common::proto::TCP,
        flags: 0,
    };
    for f in 0..layout.frontends {
        let backend = layout.backend(f / layout.vips_per_port, 0);
        map.insert(key(layout.frontend(f)), to(backend), 0)?;
    }
    map.insert(key(layout.backend(0, 0)), to(layout.frontend(0)), 0)?;
    Ok(ebpf)
}

/// Distinct client `j`: 16,000 addresses from `base`, then the next source port.
fn client(base: Ipv4Addr, j: usize) -> (Ipv4Addr, u16) {
    (
        offset(base, j % CLIENT_SPAN),
        10_000 + (j / CLIENT_SPAN) as u16,
    )
}

/// New flow `j` from outside to the NodePort.
fn node_port_flow(j: usize) -> Vec<u8> {
    tcp(client(EXTERNAL_BASE, j), NODE_PORT_FRONTEND, tcp_flags::SYN)
}

/// Source ports from here on are the aging flows' alone.
const AGING_PORT_BASE: u16 = 50_000;

/// Aging flow `j`: from outside to the NodePort, on source ports no
/// measured flow uses.
fn aging_flow(j: usize) -> Vec<u8> {
    let (addr, port) = client(EXTERNAL_BASE, j);
    tcp(
        (addr, port - 10_000 + AGING_PORT_BASE),
        NODE_PORT_FRONTEND,
        tcp_flags::SYN,
    )
}

fn port_name(name: &str) -> ServicePortName {
    ServicePortName {
        namespace: "bench".into(),
        name: name.into(),
        port_name: "tcp".into(),
        protocol: Protocol::Tcp,
    }
}

fn offset(base: Ipv4Addr, n: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n as u32)
}

/// An Ethernet + IPv4 + TCP frame from `src` to `dst` (address, port) with
/// TTL 255 and the given TCP flags.
fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> Vec<u8> {
    let mut pkt = Frame::tcp(src.0, src.1, dst.0, dst.1).build(&[]);
    pkt[ETH_HLEN + 8] = 255;
    pkt[ETH_HLEN + IPV4_HLEN + 13] = flags;
    fix_checksums(&mut pkt);
    pkt
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// `tc_from_pod`, arriving on the pod interface.
    Tc,
    /// `xdp_from_netdev`, arriving on the uplink.
    Xdp,
    /// The floor program, arriving on the uplink.
    Floor,
    /// Katran's balancer, arriving on the uplink.
    Katran,
}

#[derive(Clone, Copy)]
struct Ifaces {
    pod: u32,
    uplink: u32,
}

/// The calls of one batch: each a packet and its repeat count.
type Calls = Vec<(Vec<u8>, u32)>;

/// One tier: its own loaded object and maps, programmed with `frontends` services.
struct Tier {
    layout: Layout,
    ebpf: Ebpf,
    stats: PerCpuArray<MapData, u64>,
    /// Written only during setup.
    maps: KernelMaps,
    ifaces: Ifaces,
    /// The probe flow's packet: an established flow to frontend 0.
    probe: Vec<u8>,
    /// An established flow from outside to the NodePort.
    node_port_probe: Vec<u8>,
    /// To a non-service address, from a pod and from outside.
    pass: Vec<u8>,
    pass_external: Vec<u8>,
    /// The floor program, its map holding this tier's frontends.
    floor: Ebpf,
    /// From outside to frontend 0, which the floor rewrites to its backend.
    floor_probe: Vec<u8>,
    /// Katran, its VIP the NodePort frontend and its reals the NodePort's
    /// endpoints, when it was built.
    katran: Option<katran::Katran>,
}

impl Tier {
    fn new(
        frontends: usize,
        sizes: MapSizes,
        ifaces: Ifaces,
        katran_object: Option<&std::path::PathBuf>,
    ) -> anyhow::Result<Self> {
        let layout = Layout::new(frontends);
        let mut ebpf = load_with(sizes)?;
        let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
        // As the agent starts: node facts first, then the services.
        let facts = node_facts(ifaces)?;
        NodeProgrammer::new().apply(&facts, &mut maps)?;
        let mut programmer = Programmer::new();
        programmer.set_node_addresses(
            &facts.addresses,
            &facts.addresses6,
            &DesiredState::default(),
            &mut maps,
        )?;
        let mut state = layout.state();
        let t0 = Instant::now();
        let sync = programmer
            .sync(&state, &mut maps)
            .with_context(|| format!("programming {frontends} services"))?;
        let programmed_in = t0.elapsed();
        let floor = load_floor(&layout)?;
        let mut tier = Tier {
            layout,
            ebpf,
            stats,
            maps,
            ifaces,
            probe: Vec::new(),
            node_port_probe: Vec::new(),
            pass: tcp(PASS_POD, PASS_DST, tcp_flags::ACK),
            pass_external: tcp(PASS_EXTERNAL, PASS_DST, tcp_flags::ACK),
            floor,
            floor_probe: Vec::new(),
            katran: None,
        };

        // The probe flow: its first packet picks a backend.
        let (vip, port) = tier.layout.frontend(0);
        let syn = tcp(PROBE_POD, (vip, port), tcp_flags::SYN);
        let before = tier.counters()?;
        let out = tier.run(Hook::Tc, &syn, 1)?;
        tier.expect("probe flow setup", before, 1, TC_NEW)?;
        let verdict = out.verdict;
        ensure!(verdict == TC_ACT_REDIRECT, "probe flow: verdict {verdict}");
        let backend = Frame::parse(&out.packet).context("probe flow: output is no TCP frame")?;
        let IpAddr::V4(backend_ip) = backend.dst else {
            bail!("probe flow: left as IPv6");
        };

        // The mirror service: the probe's backend address:port balanced back to the VIP.
        let mirror = port_name("mirror");
        state.services.insert(
            mirror.clone(),
            DesiredService::cluster_ip(
                mirror,
                vec![IpAddr::V4(backend_ip)],
                backend.dport,
                vec![Endpoint::new(IpAddr::V4(vip), port)],
            ),
        );
        programmer.sync(&state, &mut tier.maps)?;
        let to_backend = tcp(PROBE_POD, (backend_ip, backend.dport), tcp_flags::SYN);
        let before = tier.counters()?;
        tier.run(Hook::Tc, &to_backend, 1)?;
        tier.expect("mirror flow setup", before, 1, TC_NEW)?;
        tier.probe = tcp(PROBE_POD, (vip, port), tcp_flags::ACK);

        // The NodePort probe: an external client's flow, set up through XDP.
        let syn = tcp(PROBE_EXTERNAL, NODE_PORT_FRONTEND, tcp_flags::SYN);
        let before = tier.counters()?;
        tier.timed(Hook::Xdp, &syn, 1, XDP_TX)?;
        tier.expect("NodePort probe setup", before, 1, XDP_NEW)?;
        tier.node_port_probe = tcp(PROBE_EXTERNAL, NODE_PORT_FRONTEND, tcp_flags::ACK);

        // The floor's probe: rewritten to frontend 0's first backend.
        if let Some(object) = katran_object {
            let reals = std::array::from_fn(|b| offset(NODE_PORT_BACKENDS, b));
            tier.katran = Some(katran::Katran::load(
                object,
                NODE_PORT_FRONTEND,
                reals,
                [0x02, 0, 0, 0, 0, 1],
                CONNTRACK_ENTRIES / 2,
            )?);
            // Its first packet creates the LRU entry the established probe
            // hits, in this CPU's LRU (not the fallback).
            let out = tier.run(Hook::Katran, &tier.node_port_probe, 1)?;
            ensure!(out.verdict == XDP_TX, "Katran: verdict {}", out.verdict);
            katran::check_encapsulated(&out.packet, &reals)?;
            let katran = tier.katran.as_ref().context("Katran was just loaded")?;
            ensure!(
                katran.per_cpu_flows()? == 1,
                "Katran's per-CPU LRUs do not hold the probe's flow"
            );
        }

        tier.floor_probe = tcp(PROBE_EXTERNAL, (vip, port), tcp_flags::ACK);
        let out = tier.run(Hook::Floor, &tier.floor_probe, 1)?;
        let rewritten = Frame::parse(&out.packet).context("floor: output is no TCP frame")?;
        let (first, first_port) = tier.layout.backend(0, 0);
        ensure!(
            out.verdict == XDP_TX
                && rewritten.dst == IpAddr::V4(first)
                && rewritten.dport == first_port,
            "floor: verdict {} to {}:{}, expected XDP_TX to {first}:{first_port}",
            out.verdict,
            rewritten.dst,
            rewritten.dport
        );

        println!(
            "{:>7} services: {} service ports x {} cluster IP(s), {} backends each; \
             programmed in {:.2} s ({} map writes)",
            group(frontends),
            group(tier.layout.service_ports()),
            tier.layout.vips_per_port,
            BACKENDS_PER_SERVICE,
            programmed_in.as_secs_f64(),
            group(sync.writes),
        );
        Ok(tier)
    }

    /// Brings the flow tables to the state a node's reach after their first
    /// flows ended: `flows` NodePort flows opened (ours through XDP, Katran's
    /// through its LRU), then ours deleted as the agent's flush deletes them,
    /// so later inserts take memory in the order it was freed, not in the
    /// order a new table hands it out. Katran's LRU, smaller than `flows`,
    /// evicts; its probe flow is opened again.
    fn age(&mut self, flows: usize) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let before = self.counters()?;
        for j in 0..flows {
            let syn = aging_flow(j);
            self.timed(Hook::Xdp, &syn, 1, XDP_TX)?;
            if self.katran.is_some() {
                let out = self.run(Hook::Katran, &syn, 1)?;
                ensure!(
                    out.verdict == XDP_TX,
                    "Katran aging: verdict {}",
                    out.verdict
                );
            }
        }
        self.expect("aging flows", before, flows as u64, XDP_NEW)?;
        let aging = |port_be: u16| u16::from_be(port_be) >= AGING_PORT_BASE;
        let closed = ServiceMaps::<V4>::flush_flows(&mut self.maps, &|k: &CtKey, _| {
            aging(k.sport_be) || aging(k.dport_be)
        })?;
        ensure!(
            closed == 2 * flows,
            "aging: {closed} conntrack entries flushed, expected {}",
            2 * flows
        );
        if self.katran.is_some() {
            let out = self.run(Hook::Katran, &self.node_port_probe, 1)?;
            ensure!(
                out.verdict == XDP_TX,
                "Katran probe after aging: verdict {}",
                out.verdict
            );
        }
        println!(
            "{:>7} services: tables aged by {} flows opened and closed in {:.1} s",
            group(self.layout.frontends),
            group(flows),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn measure_round(&self, round: usize, out: &mut Results) -> anyhow::Result<()> {
        use Metric::*;
        let range = round * NEW_FLOWS_PER_ROUND..(round + 1) * NEW_FLOWS_PER_ROUND;
        let flows: Vec<Vec<u8>> = range.clone().map(|j| self.layout.new_flow(j)).collect();
        let one_service_flows: Vec<Vec<u8>> = (range.clone())
            .map(|j| self.layout.new_flow_one_service(j))
            .collect();
        let node_port_flows: Vec<Vec<u8>> = range.map(node_port_flow).collect();
        let each = |packets: &[Vec<u8>]| packets.iter().map(|p| (p.clone(), 1)).collect();
        let mut order = vec![
            PassOne,
            PassLoop,
            EstablishedOne,
            EstablishedLoop,
            NewFlow,
            EstablishedMany,
            NewFlowOneService,
            XdpPassOne,
            XdpPassLoop,
            XdpEstablishedOne,
            XdpNewFlow,
            FloorOne,
            FloorLoop,
            FloorPassOne,
            FloorPassLoop,
        ];
        if self.katran.is_some() {
            // Katran's new flows are ours from outside to the NodePort, in
            // its own LRU.
            order.extend([
                KatranEstablished,
                KatranNewFlow,
                KatranPassOne,
                KatranPassLoop,
            ]);
        }
        let batches = order.into_iter().map(|metric| {
            let packets: Calls = match (metric, self.repeated(metric)) {
                (_, Some((p, repeat))) => {
                    let n = match repeat {
                        1 => CALLS_PER_ROUND,
                        PASS_LOOP_REPEAT => 1,
                        _ => LOOP_CALLS_PER_ROUND,
                    };
                    vec![(p.to_vec(), repeat); n]
                }
                (NewFlow | EstablishedMany, None) => each(&flows),
                (NewFlowOneService, None) => each(&one_service_flows),
                (_, None) => each(&node_port_flows),
            };
            (metric, packets)
        });
        for (metric, packets) in batches {
            let (hook, verdict, path) = metric.path();
            let before = self.counters()?;
            let runs: u64 = packets.iter().map(|(_, r)| u64::from(*r)).sum();
            for (pkt, repeat) in &packets {
                out.sample(metric, self.timed(hook, pkt, *repeat, verdict)?);
            }
            self.expect(metric.label(), before, runs, path)?;
        }
        out.end_round();
        Ok(())
    }

    /// The packet a metric sends again and again, and its repeat count;
    /// `None` for the new-flow metrics (and the established flows they
    /// open), whose every call is a flow of its own.
    fn repeated(&self, metric: Metric) -> Option<(&[u8], u32)> {
        use Metric::*;
        Some(match metric {
            PassOne => (&self.pass, 1),
            PassLoop => (&self.pass, PASS_LOOP_REPEAT),
            EstablishedOne => (&self.probe, 1),
            EstablishedLoop => (&self.probe, LOOP_REPEAT),
            XdpPassOne | FloorPassOne | KatranPassOne => (&self.pass_external, 1),
            XdpPassLoop | FloorPassLoop | KatranPassLoop => (&self.pass_external, PASS_LOOP_REPEAT),
            XdpEstablishedOne | KatranEstablished => (&self.node_port_probe, 1),
            FloorOne => (&self.floor_probe, 1),
            FloorLoop => (&self.floor_probe, LOOP_REPEAT),
            NewFlow | NewFlowOneService | EstablishedMany | XdpNewFlow | KatranNewFlow => {
                return None;
            }
        })
    }

    /// The kernel's mean time per run in ns, after checking the verdict.
    fn timed(&self, hook: Hook, packet: &[u8], repeat: u32, verdict: i32) -> anyhow::Result<u64> {
        let out = self.run(hook, packet, repeat)?;
        let got = out.verdict;
        ensure!(got == verdict, "verdict {got}, expected {verdict}");
        Ok(out.duration.as_nanos() as u64)
    }

    /// Runs `packet` `repeat` times on one buffer through the program of
    /// `hook`, as arriving on its interface.
    fn run(&self, hook: Hook, packet: &[u8], repeat: u32) -> anyhow::Result<test_run::Outcome> {
        let (hook, ifindex) = match hook {
            Hook::Tc => (test_run::Hook::FromPod, self.ifaces.pod),
            Hook::Xdp => (test_run::Hook::Xdp, self.ifaces.uplink),
            Hook::Floor => {
                let prog: &Xdp = self
                    .floor
                    .program(FLOOR_PROGRAM)
                    .context("floor program missing")?
                    .try_into()?;
                return test_run::xdp(prog, packet, self.ifaces.uplink, repeat);
            }
            Hook::Katran => {
                let katran = self.katran.as_ref().context("Katran was not built")?;
                return test_run::xdp(katran.program()?, packet, self.ifaces.uplink, repeat);
            }
        };
        test_run::run(&self.ebpf, hook, packet, ifindex, repeat)
    }

    fn counters(&self) -> anyhow::Result<Vec<u64>> {
        Counter::ALL
            .iter()
            .map(|c| Ok(self.stats.get(&(*c as u32), 0)?.iter().sum()))
            .collect()
    }

    /// Checks that `runs` packets took exactly the path `counted` names:
    /// each of those counters grew by `runs`, every other one by 0.
    fn expect(
        &self,
        what: &str,
        before: Vec<u64>,
        runs: u64,
        counted: &[Counter],
    ) -> anyhow::Result<()> {
        let after = self.counters()?;
        let mut wrong = Vec::new();
        for (i, c) in Counter::ALL.iter().enumerate() {
            let want = if counted.contains(c) { runs } else { 0 };
            let got = after[i] - before[i];
            // An established packet uses its flow's cached next hop unless
            // the cache is due its refresh (once a second) or empty; a new
            // flow its destination's, when an earlier flow to it left one.
            let sometimes = *c == Counter::NextHopCached
                && (counted.contains(&Counter::Established) || counted.contains(&Counter::NewFlow));
            if sometimes {
                if got > runs {
                    wrong.push(format!("{} +{got} (expected at most +{runs})", c.name()));
                }
                continue;
            }
            if got != want {
                wrong.push(format!("{} +{got} (expected +{want})", c.name()));
            }
        }
        if !wrong.is_empty() {
            bail!(
                "{what} at {} services did not take the path it times: {}",
                self.layout.frontends,
                wrong.join(", ")
            );
        }
        Ok(())
    }
}

/// The counters a forwarded packet moves, once per run.
const TC_NEW: &[Counter] = &[Counter::Packets, Counter::NewFlow, Counter::FibRedirect];
const TC_ESTABLISHED: &[Counter] = &[Counter::Packets, Counter::Established, Counter::FibRedirect];
const XDP_NEW: &[Counter] = &[Counter::Packets, Counter::NewFlow, Counter::XdpTx];
const XDP_ESTABLISHED: &[Counter] = &[Counter::Packets, Counter::Established, Counter::XdpTx];

/// Declares `Metric` and `Metric::ALL`, every metric in order, from one list.
macro_rules! metrics {
    ($($metric:ident),* $(,)?) => {
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum Metric {
            $($metric),*
        }

        impl Metric {
            const ALL: &'static [Metric] = &[$(Metric::$metric),*];
        }
    };
}

metrics!(
    EstablishedLoop,
    EstablishedOne,
    EstablishedMany,
    NewFlow,
    NewFlowOneService,
    PassOne,
    PassLoop,
    XdpEstablishedOne,
    XdpNewFlow,
    XdpPassOne,
    XdpPassLoop,
    FloorOne,
    FloorLoop,
    FloorPassOne,
    FloorPassLoop,
    KatranEstablished,
    KatranNewFlow,
    KatranPassOne,
    KatranPassLoop,
);

const METRICS: usize = Metric::ALL.len();

impl Metric {
    /// The program, the verdict and the counters (each moved once per run,
    /// every other one left alone) of the path this metric times.
    fn path(self) -> (Hook, i32, &'static [Counter]) {
        use Metric::*;
        match self {
            PassOne | PassLoop => (Hook::Tc, TC_ACT_OK, &[Counter::Packets]),
            EstablishedOne | EstablishedLoop | EstablishedMany => {
                (Hook::Tc, TC_ACT_REDIRECT, TC_ESTABLISHED)
            }
            NewFlow | NewFlowOneService => (Hook::Tc, TC_ACT_REDIRECT, TC_NEW),
            XdpPassOne | XdpPassLoop => (Hook::Xdp, XDP_PASS, &[]),
            XdpEstablishedOne => (Hook::Xdp, XDP_TX, XDP_ESTABLISHED),
            XdpNewFlow => (Hook::Xdp, XDP_TX, XDP_NEW),
            // The floor moves none of the datapath's counters.
            FloorOne | FloorLoop => (Hook::Floor, XDP_TX, &[]),
            FloorPassOne | FloorPassLoop => (Hook::Floor, XDP_PASS, &[]),
            KatranEstablished | KatranNewFlow => (Hook::Katran, XDP_TX, &[]),
            KatranPassOne | KatranPassLoop => (Hook::Katran, XDP_PASS, &[]),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Metric::EstablishedLoop => "established loop",
            Metric::EstablishedOne => "established flow",
            Metric::EstablishedMany => "established flows",
            Metric::NewFlow => "new flows",
            Metric::NewFlowOneService => "new flows to one service",
            Metric::PassOne => "pass-through",
            Metric::PassLoop => "pass-through loop",
            Metric::XdpEstablishedOne => "XDP established flow",
            Metric::XdpNewFlow => "XDP new flows",
            Metric::XdpPassOne => "XDP pass-through",
            Metric::XdpPassLoop => "XDP pass-through loop",
            Metric::FloorOne => "floor",
            Metric::FloorLoop => "floor loop",
            Metric::FloorPassOne => "floor pass-through",
            Metric::FloorPassLoop => "floor pass-through loop",
            Metric::KatranEstablished => "Katran established flow",
            Metric::KatranNewFlow => "Katran new flows",
            Metric::KatranPassOne => "Katran pass-through",
            Metric::KatranPassLoop => "Katran pass-through loop",
        }
    }
}

/// Kernel-reported ns per run, one sample per call, and per-round means.
#[derive(Default)]
struct Results {
    samples: [Vec<u64>; METRICS],
    round_start: [usize; METRICS],
    round_means: Vec<[f64; METRICS]>,
}

impl Results {
    fn sample(&mut self, m: Metric, ns: u64) {
        self.samples[m as usize].push(ns);
    }

    fn end_round(&mut self) {
        let means = std::array::from_fn(|i| mean(&self.samples[i][self.round_start[i]..]));
        self.round_means.push(means);
        self.round_start = std::array::from_fn(|i| self.samples[i].len());
    }

    fn mean(&self, m: Metric) -> f64 {
        mean(&self.samples[m as usize])
    }

    fn percentile(&self, m: Metric, p: f64) -> u64 {
        let mut v = self.samples[m as usize].clone();
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p).round() as usize]
    }

    /// The per-call cost of an r=1 run, estimated from a pass-through packet.
    fn overhead(&self, hook: Hook) -> f64 {
        match hook {
            Hook::Tc => self.mean(Metric::PassOne) - self.mean(Metric::PassLoop),
            Hook::Xdp => self.mean(Metric::XdpPassOne) - self.mean(Metric::XdpPassLoop),
            Hook::Floor => self.mean(Metric::FloorPassOne) - self.mean(Metric::FloorPassLoop),
            Hook::Katran => self.mean(Metric::KatranPassOne) - self.mean(Metric::KatranPassLoop),
        }
    }

    /// Largest distance of a round's mean from the overall mean, relative to it.
    fn spread(&self, m: Metric) -> f64 {
        let all = self.mean(m);
        self.round_means
            .iter()
            .map(|r| (r[m as usize] - all).abs() / all)
            .fold(0.0, f64::max)
    }
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
}

/// A table column: two header lines and the cell of one tier's results.
struct Column {
    title: &'static str,
    detail: &'static str,
    cell: Box<dyn Fn(&Results) -> f64>,
    /// The metric whose round-to-round spread the column shows.
    spread: Option<Metric>,
}

fn mean_of(title: &'static str, detail: &'static str, m: Metric) -> Column {
    Column {
        title,
        detail,
        cell: Box::new(move |r| r.mean(m)),
        spread: Some(m),
    }
}

fn median_of(title: &'static str, detail: &'static str, m: Metric) -> Column {
    Column {
        title,
        detail,
        cell: Box::new(move |r| r.percentile(m, 0.5) as f64),
        spread: None,
    }
}

fn overhead_of(hook: Hook) -> Column {
    Column {
        title: "r=1 overhead",
        detail: "estimate",
        cell: Box::new(move |r| r.overhead(hook)),
        spread: None,
    }
}

fn table(tiers: &[Tier], results: &[Results], columns: &[Column]) {
    const W: usize = 13;
    let mut lines = [format!("{:>9}", "services"), format!("{:>9}", "")];
    for c in columns {
        lines[0] += &format!(" | {:>W$}", c.title);
        lines[1] += &format!(" | {:>W$}", c.detail);
    }
    let rule = "-".repeat(lines[0].len());
    println!("{}\n{}\n{rule}", lines[0], lines[1]);
    for (tier, r) in tiers.iter().zip(results) {
        let mut line = format!("{:>9}", group(tier.layout.frontends));
        for c in columns {
            line += &format!(" | {:>W$.1}", (c.cell)(r));
        }
        println!("{line}");
    }
    let (first, last) = (&results[0], &results[results.len() - 1]);
    let label = format!(
        "{}/{}",
        short(tiers[tiers.len() - 1].layout.frontends),
        short(tiers[0].layout.frontends)
    );
    let mut line = format!("{label:>9}");
    for c in columns {
        line += &format!(" | {:>W$}", ratio((c.cell)(last), (c.cell)(first)));
    }
    println!("{line}");
    let mut line = format!("{:>9}", "spread");
    for c in columns {
        let cell = c.spread.map_or(String::new(), |m| {
            let worst = results.iter().map(|r| r.spread(m)).fold(0.0, f64::max);
            format!("{:.1}%", worst * 100.0)
        });
        line += &format!(" | {cell:>W$}");
    }
    println!("{line}");
}

/// p99 of the r=1 metrics, per tier.
fn tails(tiers: &[Tier], results: &[Results], metrics: &[(&str, Metric)]) {
    for (tier, r) in tiers.iter().zip(results) {
        let cells: Vec<String> = metrics
            .iter()
            .map(|(name, m)| format!("{name} {}", r.percentile(*m, 0.99)))
            .collect();
        println!(
            "{:>9} services: {}",
            group(tier.layout.frontends),
            cells.join(", ")
        );
    }
}

fn report(tiers: &[Tier], results: &[Results]) {
    use Metric::*;
    println!(
        "tc_from_pod: TCP from a pod to a cluster IP. Kernel-reported ns per packet, \
         over {ROUNDS} interleaved rounds.\n"
    );
    table(
        tiers,
        results,
        &[
            mean_of("established", "loop", EstablishedLoop),
            mean_of("new flow", "r=1 mean", NewFlow),
            median_of("new flow", "r=1 p50", NewFlow),
            median_of("new, 1 svc", "r=1 p50", NewFlowOneService),
            mean_of("established", "r=1 1 flow", EstablishedOne),
            mean_of("established", "r=1 20k mean", EstablishedMany),
            median_of("established", "r=1 20k p50", EstablishedMany),
            mean_of("pass-through", "r=1", PassOne),
            mean_of("pass-through", "loop", PassLoop),
            overhead_of(Hook::Tc),
        ],
    );
    println!("\np99 (ns):");
    tails(
        tiers,
        results,
        &[
            ("new flow", NewFlow),
            ("new flow to one service", NewFlowOneService),
            ("established 1 flow", EstablishedOne),
            ("established 20k flows", EstablishedMany),
            ("pass-through", PassOne),
        ],
    );

    println!(
        "\nxdp_from_netdev: TCP from outside to a NodePort (externalTrafficPolicy Local, \
         endpoints on this node), XDP_TX. Kernel-reported ns per packet.\n"
    );
    table(
        tiers,
        results,
        &[
            mean_of("established", "r=1 mean", XdpEstablishedOne),
            median_of("established", "r=1 p50", XdpEstablishedOne),
            mean_of("new flow", "r=1 mean", XdpNewFlow),
            median_of("new flow", "r=1 p50", XdpNewFlow),
            mean_of("pass-through", "r=1", XdpPassOne),
            mean_of("pass-through", "loop", XdpPassLoop),
            overhead_of(Hook::Xdp),
        ],
    );
    println!("\np99 (ns):");
    tails(
        tiers,
        results,
        &[
            ("new flow", XdpNewFlow),
            ("established", XdpEstablishedOne),
            ("pass-through", XdpPassOne),
        ],
    );

    println!(
        "\nbench_floor: the per-packet floor (one hash lookup, DNAT with both checksums, \
         MAC swap, XDP_TX), from outside to a cluster IP. Kernel-reported ns per packet.\n"
    );
    table(
        tiers,
        results,
        &[
            median_of("floor", "r=1 p50", FloorOne),
            mean_of("floor", "loop", FloorLoop),
            median_of("pass-through", "r=1 p50", FloorPassOne),
            mean_of("pass-through", "loop", FloorPassLoop),
            overhead_of(Hook::Floor),
        ],
    );
    println!(
        "\nRatios to the floor (same tier, same rounds). net: the r=1 p50s less each \
         program's r=1 overhead estimate. Issue 14's targets: established <= 1.5, new flow \
         <= 3, new-flow p99 <= 3x its p50.\n"
    );
    fn p50(r: &Results, m: Metric) -> f64 {
        r.percentile(m, 0.5) as f64
    }
    fn p99(r: &Results, m: Metric) -> f64 {
        r.percentile(m, 0.99) as f64
    }
    /// An r=1 p50 less the program's per-call overhead estimate.
    fn net(r: &Results, m: Metric, hook: Hook) -> f64 {
        (p50(r, m) - r.overhead(hook)).max(0.0)
    }
    fn floor_net(r: &Results) -> f64 {
        net(r, Metric::FloorOne, Hook::Floor)
    }
    let rows: [Row; 12] = [
        ("XDP established p50 / floor p50", |r| {
            p50(r, XdpEstablishedOne) / p50(r, FloorOne)
        }),
        ("XDP established net / floor net", |r| {
            net(r, XdpEstablishedOne, Hook::Xdp) / floor_net(r)
        }),
        ("XDP new flow p50 / floor p50", |r| {
            p50(r, XdpNewFlow) / p50(r, FloorOne)
        }),
        ("XDP new flow net / floor net", |r| {
            net(r, XdpNewFlow, Hook::Xdp) / floor_net(r)
        }),
        ("XDP pass-through p50 / floor's", |r| {
            p50(r, XdpPassOne) / p50(r, FloorPassOne)
        }),
        ("XDP pass-through loop / floor's", |r| {
            r.mean(XdpPassLoop) / r.mean(FloorPassLoop)
        }),
        ("TC established loop / floor loop", |r| {
            r.mean(EstablishedLoop) / r.mean(FloorLoop)
        }),
        ("TC new flow net / floor net", |r| {
            net(r, NewFlow, Hook::Tc) / floor_net(r)
        }),
        ("TC new flow, 1 svc, net / floor net", |r| {
            net(r, NewFlowOneService, Hook::Tc) / floor_net(r)
        }),
        ("TC pass-through loop / floor's", |r| {
            r.mean(PassLoop) / r.mean(FloorPassLoop)
        }),
        ("XDP new flow p99 / p50", |r| {
            p99(r, XdpNewFlow) / p50(r, XdpNewFlow)
        }),
        ("TC new flow p99 / p50", |r| {
            p99(r, NewFlow) / p50(r, NewFlow)
        }),
    ];
    ratio_table(tiers, results, &rows);

    if tiers.iter().all(|t| t.katran.is_some()) {
        println!(
            "\nKatran (balancer_ingress, built from KATRAN_SRC): the same packets as our XDP \
             NodePort path, its VIP the NodePort frontend (one VIP in every tier: its map holds \
             512), IPIP to one of three reals, XDP_TX; its flows in per-CPU LRUs as KatranLb \
             sets them up, {} flows (ours) over {} CPUs. Kernel-reported ns per packet.\n",
            group(CONNTRACK_ENTRIES as usize / 2),
            katran::online_cpus()
        );
        table(
            tiers,
            results,
            &[
                median_of("established", "r=1 p50", KatranEstablished),
                median_of("new flow", "r=1 p50", KatranNewFlow),
                median_of("pass-through", "r=1 p50", KatranPassOne),
                mean_of("pass-through", "loop", KatranPassLoop),
                overhead_of(Hook::Katran),
            ],
        );
        println!(
            "\nOurs (XDP, NodePort) and the floor against Katran, same tier and rounds \
             (targets: established and new flow below Katran's, pass-through no dearer):\n"
        );
        let rows: [Row; 7] = [
            ("XDP established p50 / Katran's", |r| {
                p50(r, XdpEstablishedOne) / p50(r, KatranEstablished)
            }),
            ("XDP new flow p50 / Katran's", |r| {
                p50(r, XdpNewFlow) / p50(r, KatranNewFlow)
            }),
            ("XDP pass-through p50 / Katran's", |r| {
                p50(r, XdpPassOne) / p50(r, KatranPassOne)
            }),
            ("XDP pass-through loop / Katran's", |r| {
                r.mean(XdpPassLoop) / r.mean(KatranPassLoop)
            }),
            ("Katran new flow p99 / p50", |r| {
                p99(r, KatranNewFlow) / p50(r, KatranNewFlow)
            }),
            ("floor p50 / Katran established p50", |r| {
                p50(r, FloorOne) / p50(r, KatranEstablished)
            }),
            ("floor pass loop / Katran's", |r| {
                r.mean(FloorPassLoop) / r.mean(KatranPassLoop)
            }),
        ];
        ratio_table(tiers, results, &rows);
    }

    let extra = if tiers.iter().any(|t| t.layout.vips_per_port > 1) {
        "\nAbove the agent's service-port limit each service port carries several cluster IPs. \
         The maps hold one frontend per cluster IP either way."
    } else {
        ""
    };
    println!(
        "\nloop: {LOOP_REPEAT} (established) or {PASS_LOOP_REPEAT} (pass-through) runs per call, \
         the kernel's mean per call in whole ns; mean over the calls.\n\
         r=1: one run per call. Includes the kernel's per-call timing cost, estimated in the \
         last column as pass-through r=1 minus pass-through loop: subtract it to compare with \
         loop figures.\n\
         mean / p50: over every packet; a rare interruption (interrupt, hypervisor) lands in the \
         mean, not in the p50.\n\
         Cluster-IP new flows go to services spread over the tier (\"new, 1 svc\": all to the \
         tier's first service, from clients of their own); the NodePort figures always \
         use the same NodePort frontend.\n\
         spread: the largest deviation of one round's mean from the overall mean, in any tier.\n\
         Every tier also programs a mirror service (the established loop needs it) and the \
         NodePort service.{extra}\n\
         Targets in issue 4, for reference: established < 100 ns, new flow < 250 ns, \
         < 10% growth from 1 to 100,000 services."
    );
}

/// A named ratio, one cell per tier.
type Row = (&'static str, fn(&Results) -> f64);

/// One line per row, one column per tier.
fn ratio_table(tiers: &[Tier], results: &[Results], rows: &[Row]) {
    let header: Vec<String> = tiers
        .iter()
        .map(|t| format!("{:>9}", group(t.layout.frontends)))
        .collect();
    println!("{:<34} | {}", "services", header.join(" | "));
    for (name, cell) in rows {
        let cells: Vec<String> = results
            .iter()
            .map(|r| format!("{:>9.2}", cell(r)))
            .collect();
        println!("{name:<34} | {}", cells.join(" | "));
    }
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}x ({:+.0}%)", a / b, (a / b - 1.0) * 100.0)
}

fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn short(n: usize) -> String {
    if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

fn print_machine() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']))
        })
        .unwrap_or("unknown");
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let virt = if cpuinfo.contains(" hypervisor") {
        ", virtualised"
    } else {
        ""
    };
    let jit = std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    println!("cpu: {model} ({cpus} CPUs{virt})");
    println!("kernel: {} (bpf_jit_enable={jit})", uname());
}

fn uname() -> String {
    // SAFETY: utsname is plain data; all zeroes is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!(
        "{} {} {} {}",
        field(&u.sysname),
        field(&u.release),
        field(&u.version),
        field(&u.machine)
    )
}

/// Whether the agent would let new flows share their destination's next
/// hop here (the host source's reading of this namespace's routing), unless
/// `DATAPATH_HOP_CACHE=off` asks to measure without it.
fn shares_next_hops() -> anyhow::Result<bool> {
    if std::env::var("DATAPATH_HOP_CACHE").is_ok_and(|v| v == "off") {
        return Ok(false);
    }
    Ok(HostNetwork::read()
        .context("reading the bench namespace's routing")?
        .destination_routing
        .ipv4)
}

/// What the agent would compute for this node: detectLocalMode ClusterCIDR,
/// masquerade to the node address, NodePorts on it, the uplink external,
/// and new flows sharing their destination's next hop as far as this
/// namespace's routing rules and routes allow it (the host source's reading).
fn node_facts(ifaces: Ifaces) -> anyhow::Result<NodeFacts> {
    let by_destination = if shares_next_hops()? {
        config::flags::ROUTES_BY_DESTINATION
    } else {
        0
    };
    let addresses = NodeAddresses {
        primary: Some(NODE_IP),
        node_ports: vec![NODE_IP],
        ..NodeAddresses::default()
    };
    Ok(NodeFacts {
        config: DatapathConfig {
            masquerade_addr_be: u32::from(NODE_IP).to_be(),
            flags: config::flags::DETECT_LOCAL_BY_CIDR | by_destination,
            snat_port_min: SNAT_PORT_MIN,
            snat_port_max: SNAT_PORT_MAX,
            ..DatapathConfig::default()
        },
        config6: Default::default(),
        local_pod_cidrs: [POD_CIDR.parse::<ipnet::IpNet>().context("pod CIDR")?].into(),
        service_cidrs: Default::default(),
        ifaces: [(
            ifaces.uplink,
            IfaceInfo {
                flags: config::iface::EXTERNAL,
            },
        )]
        .into(),
        addresses,
        addresses6: Default::default(),
        external_interfaces: [(UPLINK_IFACE.to_owned(), ifaces.uplink)].into(),
    })
}

/// Moves this (single-threaded) process into a new network namespace, which
/// disappears when it exits, and gives the FIB something to answer: a pod
/// interface and an uplink holding the node address, with a permanent next
/// hop for backends and service IPs.
fn enter_throwaway_netns() -> anyhow::Result<Ifaces> {
    // SAFETY: unshare has no memory-safety preconditions; the process has one thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
    }
    let ip = |args: &[&str]| testbed::netns::ip(None, args);
    ip(&["link", "set", "lo", "up"])?;
    // veth pairs (not dummy interfaces: not every kernel has that module).
    for iface in [POD_IFACE, UPLINK_IFACE] {
        let peer = format!("{iface}-peer");
        ip(&["link", "add", iface, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "up"])?;
        ip(&["link", "set", iface, "up"])?;
    }
    let node = format!("{NODE_IP}/{NODE_PREFIX}");
    ip(&["addr", "add", &node, "dev", UPLINK_IFACE])?;
    ip(&[
        "neigh",
        "replace",
        GATEWAY,
        "lladdr",
        GATEWAY_MAC,
        "nud",
        "permanent",
        "dev",
        UPLINK_IFACE,
    ])?;
    for net in ROUTED {
        ip(&["route", "add", net, "via", GATEWAY, "dev", UPLINK_IFACE])?;
    }
    // bpf_fib_lookup answers only when the arrival interface forwards.
    std::fs::write("/proc/sys/net/ipv4/conf/all/forwarding", "1")
        .context("enabling forwarding in the bench namespace")?;
    Ok(Ifaces {
        pod: ifindex(POD_IFACE)?,
        uplink: ifindex(UPLINK_IFACE)?,
    })
}

/// Not from /sys/class/net: sysfs shows the namespace it was mounted in.
fn ifindex(name: &str) -> anyhow::Result<u32> {
    let c = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    ensure!(index != 0, "{name} has no ifindex");
    Ok(index)
}

/// Keeps the bench on one CPU, and lets no ordinary process preempt it there
/// in the middle of a timed run (a test run can be preempted, and the
/// kernel's clock keeps running): SCHED_FIFO at the lowest real-time
/// priority, which the kernel's real-time throttling still caps at 95% of the CPU.
fn pin_to_current_cpu() -> anyhow::Result<(usize, bool)> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    ensure!(cpu >= 0, "sched_getcpu failed");
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (the kernel returned it).
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
    }
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param.
    let realtime = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
    Ok((cpu as usize, realtime))
}
