//! The end-to-end benchmark users compare datapaths by (issue 14): traffic
//! through a service, per datapath, at several numbers of services, every
//! figure beside raw routing measured in the same round.
//!
//! One testbed per datapath (a node namespace, a client pod, three server
//! pods, an external client), all alive at once, so rounds interleave: for
//! each scale the agents are started on the same generated manifests (N
//! services of one TCP port on two server pods; the last is also a NodePort
//! and has a UDP port), then every round measures every datapath in a
//! rotating order. Datapaths: `raw` (no agent: the clients go to a server
//! pod's address, routed by the node), our `ebpf` mode (TC from pods, XDP
//! from outside; socket hooks off: they would attach to the root cgroup),
//! `ebpf-socket` (the same agent with its socket hooks on a cgroup the bench
//! creates; the "pod" client is a hostNetwork process: a thread in the node
//! namespace while the bench process is in that cgroup, so connect() itself
//! goes to a backend and no packet is translated; outside clients go through
//! XDP as for `ebpf`), and the agent's `nftables`, `iptables-legacy` and
//! `iptables-nft` modes (upstream's rules; the iptables backend as kubelet's
//! hint chain picks it).
//!
//! Per round and datapath: short connections from the pod to the ClusterIP
//! (connect, a small HTTP request, the reply to EOF, close; rate, p50, p99)
//! and from outside to the NodePort; one bulk TCP stream from the pod;
//! small UDP datagrams from the pod (the rate the servers receive, and the
//! softirq CPU time per datagram over every CPU). Per scale: the time from
//! the agent's start to the service answering, its memory, and the time from
//! an endpoint change written to the manifests to the first connection that
//! reaches the new endpoint (the manifests source reads a file when it is
//! moved into place, as an API event arrives). Written to `docs/bench/e2e.md`
//! with an SVG of every figure (plotters).
//!
//! `cargo xtask bench e2e`, or `cargo bench -p proxy-agent --bench end_to_end`
//! (root). `E2E_SCALES` (default 1,1000,10000,50000), `E2E_DATAPATHS`
//! (default raw,ebpf,ebpf-socket,nftables,iptables-legacy), `E2E_RULES_MAX` (the most
//! services a rule mode is started with; default 50000), `E2E_ROUNDS` (3),
//! `E2E_CONNECTIONS` (1000 per round and client), `E2E_STREAM_MS` (1000, the
//! bulk and UDP runs), `E2E_CHANGES` (10 per scale), `E2E_REPORT` (the
//! report's path), `E2E_AGENT_LOG` (the agents' RUST_LOG, default warn),
//! `E2E_KEEP_WORK` (keep the agents' logs and the manifests).

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod report;
mod workloads;

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use proxy_agent::modes::ebpf::sockets::{join_cgroup, own_cgroup};
use testbed::{Cni, NODE_EXTERNAL_IP, Testbed, cgroup::TestCgroup, netns};

use agent::{Agent, NODE_PORT, UDP_SERVICE_PORT};
use workloads::{TCP_PORT, UDP_PORT};

const SERVERS: [&str; 3] = ["srv-a", "srv-b", "srv-c"];

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_num(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}: {v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// A datapath under test: how its node is set up.
#[derive(Clone, Debug)]
pub struct Datapath {
    pub name: String,
    /// The agent's mode; none for raw routing.
    mode: Option<&'static str>,
    /// The iptables backend kubelet's hint chain names, for iptables mode.
    iptables_hint: Option<&'static str>,
    /// The agent's socket hooks serve the client (a hostNetwork process).
    socket_lb: bool,
}

impl Datapath {
    fn parse(name: &str) -> anyhow::Result<Self> {
        let (mode, iptables_hint, socket_lb) = match name {
            "raw" => (None, None, false),
            "ebpf" => (Some("ebpf"), None, false),
            "ebpf-socket" => (Some("ebpf"), None, true),
            "nftables" => (Some("nftables"), None, false),
            "iptables-legacy" => (Some("iptables"), Some("iptables-legacy"), false),
            "iptables-nft" => (Some("iptables"), Some("iptables-nft"), false),
            other => bail!(
                "E2E_DATAPATHS: unknown datapath {other:?} (raw, ebpf, ebpf-socket, nftables, iptables-legacy, iptables-nft)"
            ),
        };
        Ok(Self {
            name: name.to_owned(),
            mode,
            iptables_hint,
            socket_lb,
        })
    }

    pub fn is_raw(&self) -> bool {
        self.mode.is_none()
    }

    fn is_rule_mode(&self) -> bool {
        matches!(self.mode, Some("nftables" | "iptables"))
    }
}

/// What one round measured on one datapath.
#[derive(Clone, Default)]
pub struct Sample {
    pub conn_rate: f64,
    pub conn_p50_us: f64,
    pub conn_p99_us: f64,
    pub node_port_rate: f64,
    pub node_port_p50_us: f64,
    pub node_port_p99_us: f64,
    pub bulk_bps: f64,
    pub udp_rate: f64,
    pub softirq_ns: f64,
}

/// One datapath at one scale.
#[derive(Default)]
pub struct Outcome {
    /// Why it was not measured at this scale.
    pub skipped: Option<String>,
    pub samples: Vec<Sample>,
    pub start_s: Option<f64>,
    pub rss_mb: Option<f64>,
    /// Endpoint change to packets following it, ms.
    pub change_ms: Vec<f64>,
}

/// One datapath's testbed.
struct Bed {
    dp: Datapath,
    tb: Testbed,
    agent: Option<Agent>,
    udp_received: Arc<AtomicU64>,
    /// Where the socket hooks attach, for a socket-level datapath.
    cgroup: Option<TestCgroup>,
}

impl Bed {
    /// The namespace of the client that goes to the ClusterIP: the client
    /// pod's, or the node's for a hostNetwork client.
    fn client_ns(&self) -> String {
        if self.cgroup.is_some() {
            self.tb.node_ns.clone()
        } else {
            self.tb.pod("client").ns.clone()
        }
    }

    /// Runs `work` as the ClusterIP client: for a socket-level datapath,
    /// with this whole process in the hooks' cgroup meanwhile (a cgroup
    /// holds processes, not threads; nothing else of the bench runs then).
    fn as_client<T>(&self, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        let Some(cgroup) = &self.cgroup else {
            return work();
        };
        let home = own_cgroup(&testbed::cgroup::cgroup2_root()?)?;
        join_cgroup(&cgroup.path)?;
        let result = work();
        join_cgroup(&home)?;
        result
    }

    fn server(&self) -> Ipv4Addr {
        self.tb.pod(SERVERS[0]).ip
    }

    /// Where the pod's clients connect (TCP).
    fn cluster_target(&self, n: usize) -> SocketAddr {
        if self.dp.is_raw() {
            SocketAddr::from((self.server(), TCP_PORT))
        } else {
            agent::target(n)
        }
    }

    fn node_port_target(&self) -> SocketAddr {
        if self.dp.is_raw() {
            SocketAddr::from((self.server(), TCP_PORT))
        } else {
            SocketAddr::from((NODE_EXTERNAL_IP, NODE_PORT))
        }
    }

    fn udp_target(&self, n: usize) -> SocketAddr {
        if self.dp.is_raw() {
            SocketAddr::from((self.server(), UDP_PORT))
        } else {
            SocketAddr::from((agent::vip(n - 1), UDP_SERVICE_PORT))
        }
    }
}

pub struct Settings {
    pub rounds: usize,
    pub connections: usize,
    pub stream: Duration,
    pub changes: usize,
}

fn main() {
    common::main("end_to_end", run);
}

fn run() -> anyhow::Result<()> {
    let scales: Vec<usize> = env_list("E2E_SCALES", "1,1000,10000,50000")
        .iter()
        .map(|s| s.parse().context("E2E_SCALES: numbers"))
        .collect::<anyhow::Result<_>>()?;
    if scales.iter().any(|n| !(1..=65_000).contains(n)) {
        bail!("E2E_SCALES: 1 to 65,000 services (one /16 of cluster IPs)");
    }
    let datapaths = env_list(
        "E2E_DATAPATHS",
        "raw,ebpf,ebpf-socket,nftables,iptables-legacy",
    )
    .iter()
    .map(|d| Datapath::parse(d))
    .collect::<anyhow::Result<Vec<_>>>()?;
    if !datapaths.iter().any(Datapath::is_raw) {
        bail!("E2E_DATAPATHS must hold raw: every figure is a ratio to it");
    }
    let rules_max = env_num("E2E_RULES_MAX", 50_000)?;
    let settings = Settings {
        rounds: env_num("E2E_ROUNDS", 3)?,
        connections: env_num("E2E_CONNECTIONS", 1000)?,
        stream: Duration::from_millis(env_num("E2E_STREAM_MS", 1000)? as u64),
        changes: env_num("E2E_CHANGES", 10)?,
    };
    let work = tempfile::tempdir()?;
    if std::env::var_os("E2E_KEEP_WORK").is_some() {
        eprintln!(
            "e2e: agent logs and manifests kept in {}",
            work.path().display()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));

    let mut beds = Vec::new();
    for dp in &datapaths {
        let mut names = vec!["client"];
        names.extend(SERVERS);
        let tb = Testbed::new(Cni::Routed, &names)
            .with_context(|| format!("the {} testbed", dp.name))?;
        let udp_received = Arc::new(AtomicU64::new(0));
        for s in SERVERS {
            workloads::serve(&tb.pod(s).ns, s, stop.clone(), udp_received.clone())?;
        }
        if let Some(binary) = dp.iptables_hint {
            // As kubelet does on a node of that backend.
            in_netns(
                &tb.node_ns,
                binary,
                &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
            )
            .with_context(|| format!("creating kubelet's hint chain with {binary}"))?;
        }
        let cgroup = match dp.socket_lb {
            true => Some(TestCgroup::new("e2e-socket-lb")?),
            false => None,
        };
        beds.push(Bed {
            dp: dp.clone(),
            tb,
            agent: None,
            udp_received,
            cgroup,
        });
    }
    let ips =
        |names: &[&str]| -> Vec<Ipv4Addr> { names.iter().map(|s| beds[0].tb.pod(s).ip).collect() };
    let (serving, with_new) = (ips(&SERVERS[..2]), ips(&SERVERS));
    for b in &beds[1..] {
        // The manifests are shared: every testbed numbers its pods alike.
        anyhow::ensure!(ips(&SERVERS) == SERVERS.map(|s| b.tb.pod(s).ip).to_vec());
    }

    // outcomes[scale][datapath]
    let mut outcomes: Vec<Vec<Outcome>> = Vec::new();
    for &n in &scales {
        let manifests = work.path().join(format!("manifests-{n}"));
        agent::write_manifests(&manifests, n, &serving)?;
        let mut row: Vec<Outcome> = beds.iter().map(|_| Outcome::default()).collect();
        for (bed, out) in beds.iter_mut().zip(&mut row) {
            bed.agent = None;
            if bed.dp.is_raw() {
                continue;
            }
            if bed.dp.is_rule_mode() && n > rules_max {
                out.skipped = Some(format!("above E2E_RULES_MAX ({rules_max})"));
                continue;
            }
            let (agent, start_s) = start_agent(bed, n, &manifests, work.path())?;
            out.start_s = Some(start_s);
            bed.agent = Some(agent);
            eprintln!(
                "e2e: {} programmed {n} services in {start_s:.2} s",
                bed.dp.name
            );
        }
        // A warm-up, unrecorded: the first connections of a testbed pay for
        // neighbour resolution and cold caches.
        for (bed, out) in beds.iter().zip(&row) {
            if out.skipped.is_none() {
                bed.as_client(|| {
                    workloads::connections(&bed.client_ns(), bed.cluster_target(n), 100)
                })?;
                workloads::connections(&bed.tb.external_ns, bed.node_port_target(), 100)?;
            }
        }
        for round in 0..settings.rounds {
            for k in 0..beds.len() {
                let i = (k + round) % beds.len();
                if row[i].skipped.is_some() {
                    continue;
                }
                let sample = measure(&beds[i], n, &settings)
                    .with_context(|| format!("{} at {n} services", beds[i].dp.name))?;
                row[i].samples.push(sample);
            }
        }
        // The agent's memory once it has served the rounds (right after the
        // first sync it may still hold the objects it read).
        for (bed, out) in beds.iter().zip(&mut row) {
            out.rss_mb = bed.agent.as_ref().and_then(Agent::rss_mb);
        }
        for (bed, out) in beds.iter().zip(&mut row) {
            if bed.agent.is_some() {
                out.change_ms =
                    change_latencies(bed, n, &manifests, &serving, &with_new, &settings)
                        .with_context(|| {
                            format!("endpoint changes on {} at {n} services", bed.dp.name)
                        })?;
                eprintln!(
                    "e2e: {} at {n} services followed {} endpoint changes",
                    bed.dp.name,
                    out.change_ms.len()
                );
            }
        }
        outcomes.push(row);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    let report = report::render(&scales, &datapaths, &outcomes, &settings);
    print!("{report}");
    let path = std::env::var("E2E_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/e2e.md"))
        });
    fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    report::plot(&path.with_extension("svg"), &scales, &datapaths, &outcomes)?;
    fs::write(&path, report)?;
    eprintln!("e2e: report written to {}", path.display());
    if std::env::var_os("E2E_KEEP_WORK").is_some() {
        let _ = work.keep();
    }
    Ok(())
}

/// Starts the bed's agent on `manifests` and waits until both the ClusterIP
/// (from the pod) and the NodePort (from outside) answer: the agent and the
/// seconds that took.
fn start_agent(bed: &Bed, n: usize, manifests: &Path, work: &Path) -> anyhow::Result<(Agent, f64)> {
    let mode = bed.dp.mode.expect("not raw");
    let t = Instant::now();
    // A new agent per scale, in a namespace it may share with the previous
    // one's rules: as on a node, the new one replaces them.
    let cgroup = bed
        .cgroup
        .as_ref()
        .map(TestCgroup::seen_from_other_mount_namespaces);
    let mut agent = Agent::start(&bed.tb.node_ns, mode, manifests, work, cgroup.as_deref())?;
    let probes = [
        (bed.client_ns(), bed.cluster_target(n), true),
        (bed.tb.external_ns.clone(), bed.node_port_target(), false),
    ];
    for (ns, target, from_client) in probes {
        loop {
            if !agent.alive() {
                bail!("the {} agent exited:\n{}", bed.dp.name, agent.log_text());
            }
            let probe = || {
                netns::run_in(&ns, move || {
                    workloads::one_request(target, Duration::from_millis(50)).is_ok()
                })
            };
            let ok = match from_client {
                true => bed.as_client(probe)?,
                false => probe()?,
            };
            if ok {
                break;
            }
            if t.elapsed() > Duration::from_secs(1800) {
                bail!(
                    "the {} agent did not program {n} services in 30 minutes",
                    bed.dp.name
                );
            }
            // A SYN the node drops costs the whole connect timeout: with
            // these two the start time is known to about 60 ms.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let started = t.elapsed().as_secs_f64();
    let log = agent.log_text();
    if log.contains("are ignored") {
        bail!("the {} agent ignored its mode:\n{log}", bed.dp.name);
    }
    if let Some(hint) = bed.dp.iptables_hint {
        let listed = in_netns(&bed.tb.node_ns, &format!("{hint}-save"), &["-t", "nat"])?;
        if !listed.contains("KUBE-SERVICES") {
            bail!(
                "{}: the agent did not write its rules through {hint}:\n{log}",
                bed.dp.name
            );
        }
    }
    Ok((agent, started))
}

/// Runs `program` in namespace `ns`: its standard output.
fn in_netns(ns: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// One round of every workload on one datapath.
fn measure(bed: &Bed, n: usize, s: &Settings) -> anyhow::Result<Sample> {
    let client = bed.client_ns();
    let rate_and_tail = |ns: &str, target| -> anyhow::Result<(f64, f64, f64)> {
        let (elapsed, mut lat) = workloads::connections(ns, target, s.connections)?;
        lat.sort();
        Ok((
            s.connections as f64 / elapsed.as_secs_f64(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
        ))
    };
    let (conn_rate, conn_p50_us, conn_p99_us) = bed
        .as_client(|| rate_and_tail(&client, bed.cluster_target(n)))
        .context("connections from the pod")?;
    let (node_port_rate, node_port_p50_us, node_port_p99_us) =
        rate_and_tail(&bed.tb.external_ns, bed.node_port_target())
            .context("connections from outside")?;
    let bulk_bps = bed
        .as_client(|| workloads::bulk(&client, bed.cluster_target(n), s.stream))
        .context("bulk TCP")?;
    let udp = bed
        .as_client(|| workloads::udp(&client, bed.udp_target(n), s.stream, &bed.udp_received))
        .context("UDP")?;
    Ok(Sample {
        conn_rate,
        conn_p50_us,
        conn_p99_us,
        node_port_rate,
        node_port_p50_us,
        node_port_p99_us,
        bulk_bps,
        udp_rate: udp.rate,
        softirq_ns: udp.softirq_ns,
    })
}

/// `settings.changes` times: a third endpoint added to the target service
/// (its slice rewritten), timed until a connection from the pod reaches it;
/// then taken away again, and waited out until 40 connections in a row do
/// not reach it, and 1.5 s after that (upstream's default minSyncPeriod is
/// 1 s, counted by our runner from the end of a sync), so each change is a
/// lone one.
fn change_latencies(
    bed: &Bed,
    n: usize,
    manifests: &Path,
    serving: &[Ipv4Addr],
    with_new: &[Ipv4Addr],
    settings: &Settings,
) -> anyhow::Result<Vec<f64>> {
    let target = bed.cluster_target(n);
    let (dir, serving, with_new) = (manifests.to_owned(), serving.to_vec(), with_new.to_vec());
    let changes = settings.changes;
    let keep = std::env::var_os("E2E_KEEP_WORK").is_some();
    let new = SERVERS[2];
    let client = bed.client_ns();
    bed.as_client(|| {
        netns::run_in(&client, move || -> anyhow::Result<Vec<f64>> {
            let ask = || workloads::one_request(target, Duration::from_millis(500)).map(|(_, s)| s);
            let mut latencies = Vec::new();
            for _ in 0..changes {
                agent::write_target_slice(&dir, n, &with_new)?;
                let t = Instant::now();
                if keep {
                    eprintln!("e2e: endpoint added at {}", jiff::Timestamp::now());
                }
                while !ask().is_ok_and(|s| s == new) {
                    // Paced: a tight loop of connections (and the servers and
                    // softirq it keeps busy) took both CPUs of these VMs from
                    // the agent, and the figure measured that (76 ms p50 at
                    // 50,000 services unpaced, 5 ms paced).
                    std::thread::sleep(Duration::from_millis(1));
                    if t.elapsed() > Duration::from_secs(120) {
                        bail!("no connection reached the new endpoint within 120 s");
                    }
                }
                latencies.push(t.elapsed().as_secs_f64() * 1e3);
                agent::write_target_slice(&dir, n, &serving)?;
                let t = Instant::now();
                let mut streak = 0;
                while streak < 40 {
                    streak = if ask().is_ok_and(|s| s != new) {
                        streak + 1
                    } else {
                        0
                    };
                    if t.elapsed() > Duration::from_secs(120) {
                        bail!("the removed endpoint was still reached after 120 s");
                    }
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
            Ok(latencies)
        })
    })?
}
