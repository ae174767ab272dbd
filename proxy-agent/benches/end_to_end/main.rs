//! The end-to-end benchmark users compare datapaths by (issue 14): traffic
//! through a service, per datapath, at several numbers of services, every
//! figure beside raw routing measured in the same round.
//!
//! Roles: a node (the agent), a ClusterIP client ("pod"), an external
//! client (NodePort) and three servers. Each role's workloads run in a
//! worker (this binary with `--worker`, [`worker`]) on the role's host, a
//! command prefix away ([`hosts`]): `ip netns exec` in a testbed, `ssh` on
//! real machines. By default every datapath gets a testbed of its own
//! (network namespaces on veths), all alive at once, so rounds interleave
//! with no restart; while one is measured, the others' agents are paused
//! (SIGSTOP: their datapaths stay, their control planes do not run). With `E2E_HOSTS=<file>` the roles are real machines
//! (bare metal, see docs/bench/README.md): one node serves every datapath in
//! turn, cleaned (`--cleanup`) and its agent restarted at each switch;
//! `E2E_HOSTS=testbed` rehearses that with one testbed.
//!
//! For each scale the agents run on the same generated manifests (N
//! services of one TCP port, `E2E_ENDPOINTS` endpoints each, as JSON lists;
//! the last on two servers, also a NodePort with a UDP port), then every round measures every datapath in a rotating
//! order. Datapaths: `raw` (no agent: the clients go to a server's address,
//! routed by the node), `raw-again` (raw once more, in a testbed of its own:
//! its ratio to raw is the run's noise), our `ebpf` mode (TC from pods; from
//! outside, native XDP where the node's driver has it, else TC: on the
//! testbed's veths, TC; socket hooks off), `ebpf-xdp-generic` (the same with
//! `--ebpf-xdp-mode=generic`: outside clients through generic XDP, then
//! TC), `ebpf-socket` (the same agent as `ebpf` with its socket hooks on
//! a cgroup of the bench's; the ClusterIP client is a hostNetwork process:
//! a worker on the node, in that cgroup, so connect() itself goes to a
//! backend and no packet is translated; outside clients as for `ebpf`), and the agent's `nftables`, `iptables-legacy` and
//! `iptables-nft` modes (upstream's rules; the iptables backend as kubelet's
//! hint chain picks it).
//!
//! Per round and datapath: short connections from the pod to the ClusterIP
//! (connect, a small HTTP request, the reply to EOF, close; rate, p50, p99)
//! and from outside to the NodePort, in passes interleaved with the other
//! datapaths' (`E2E_CONN_PASSES`); one bulk TCP stream from the pod;
//! small UDP datagrams from the pod (the rate the servers receive, and the
//! node's softirq CPU time per datagram over every CPU). Per scale: the time
//! from the agent's start to the service answering, its memory, and the
//! time from an endpoint change (the changed EndpointSlice moved into place
//! in the manifests by the node's worker: the manifests source reads a file
//! when it is moved into place, as an API event arrives) to the agent's
//! maps balancing to the new endpoint alone (eBPF modes, [`maps_watch`])
//! and to the first connection that reaches it. Written to
//! `docs/bench/e2e.md` with an SVG of every figure (plotters).
//!
//! `cargo xtask bench e2e`, or `cargo bench -p proxy-agent --bench end_to_end`
//! (root). `E2E_SCALES` (default 1,1000,10000,50000), `E2E_DATAPATHS`
//! (default raw,raw-again,ebpf,ebpf-xdp-generic,ebpf-socket,nftables,iptables-legacy), `E2E_RULES_MAX` (the most
//! services a rule mode is started with; default 50000), `E2E_ROUNDS` (9),
//! `E2E_CONNECTIONS` (6000 per round and client), `E2E_CONN_PASSES` (6: a
//! round's connections come in that many passes over the datapaths, so
//! each datapath's are taken moments from raw's; 1 on a shared node),
//! `E2E_STREAM_MS` (1000, the
//! bulk and UDP runs), `E2E_CHANGES` (20 per scale), `E2E_STARTS` (3 cold
//! starts of each agent per scale), `E2E_ENDPOINTS` (10
//! per service but the target), `E2E_REPORT` (the
//! report's path), `E2E_AGENT_LOG` (the agents' RUST_LOG, default warn),
//! `E2E_KEEP_WORK` (keep the agents' logs and the manifests), `E2E_AGENT_ARGS`
//! (more flags for every agent a testbed starts; on real machines the
//! hosts file's `agent_args`), `E2E_WORKER_CPU`
//! (the CPU a testbed's workers are pinned to, default the last; `none`), `E2E_HOSTS`,
//! `E2E_REHEARSAL_VIA` (with `E2E_HOSTS=testbed`: a command prefix before
//! each namespace's, e.g. an ssh to this machine).

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod cpu_taken;
mod hosts;
mod maps_watch;
mod report;
mod worker;
mod workloads;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use testbed::{Cni, NODE_EXTERNAL_IP, Testbed, cgroup::TestCgroup};

use agent::{Agent, METRICS_PORT, ManifestsDir, NODE_PORT, UDP_SERVICE_PORT};
use hosts::{Host, HostsFile, Node, Server};
use worker::Worker;
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
    /// More flags for the agent.
    agent_args: &'static [&'static str],
}

impl Datapath {
    fn parse(name: &str) -> anyhow::Result<Self> {
        let mut agent_args: &'static [&'static str] = &[];
        let (mode, iptables_hint, socket_lb) = match name {
            // The same as raw, in a testbed of its own: its ratio to raw is
            // the run's noise (an A/A comparison).
            "raw" | "raw-again" => (None, None, false),
            "ebpf" => (Some("ebpf"), None, false),
            "ebpf-xdp-generic" => {
                agent_args = &["--ebpf-xdp-mode=generic"];
                (Some("ebpf"), None, false)
            }
            "ebpf-socket" => (Some("ebpf"), None, true),
            "nftables" => (Some("nftables"), None, false),
            "iptables-legacy" => (Some("iptables"), Some("iptables-legacy"), false),
            "iptables-nft" => (Some("iptables"), Some("iptables-nft"), false),
            other => bail!(
                "E2E_DATAPATHS: unknown datapath {other:?} (raw, raw-again, ebpf, ebpf-xdp-generic, ebpf-socket, nftables, iptables-legacy, iptables-nft)"
            ),
        };
        Ok(Self {
            name: name.to_owned(),
            mode,
            iptables_hint,
            socket_lb,
            agent_args,
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
    /// Agent start to answering, s: once per scale on a testbed of its
    /// own, at every switch to it on a shared node.
    pub start_s: Vec<f64>,
    pub rss_mb: Option<f64>,
    /// Endpoint change to packets, ms.
    pub change_ms: Vec<f64>,
    /// Endpoint change to the agent's maps holding it, ms (eBPF modes).
    pub change_maps_ms: Vec<f64>,
    /// By change (as `change_maps_ms`, when measured): CPU time other tasks
    /// ran on the agent's CPUs until the maps held it, and the time the
    /// agent's threads waited for a CPU meanwhile, ms.
    pub change_cpu_taken_ms: Vec<(f64, f64)>,
}

/// The machines (or namespaces) of one bed's roles.
struct Site {
    node: Node,
    client: Host,
    external: Host,
    /// The CPU every worker of the site is pinned to ([`worker_cpu`]).
    worker_cpu: Option<usize>,
    servers: Vec<Server>,
}

impl Site {
    fn of_testbed(tb: &Testbed, work: &Path, via: &[String]) -> Self {
        let netns = |ns: &str| Host::netns(via, ns);
        Site {
            node: Node {
                host: netns(&tb.node_ns),
                agent: env!("CARGO_BIN_EXE_proxy-agent").into(),
                work: work.join(&tb.id).to_string_lossy().into_owned(),
                address: NODE_EXTERNAL_IP,
                cluster_cidr: "198.18.1.0/24".into(),
                pod_interfaces: Vec::new(),
                external_interfaces: Vec::new(),
                agent_args: std::env::var("E2E_AGENT_ARGS")
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
                socket_lb_cgroup: None,
            },
            client: netns(&tb.pod("client").ns),
            external: netns(&tb.external_ns),
            worker_cpu: worker_cpu(),
            servers: SERVERS
                .iter()
                .map(|s| Server {
                    host: netns(&tb.pod(s).ns),
                    ip: tb.pod(s).ip,
                })
                .collect(),
        }
    }
}

/// In a testbed, the CPU every worker (clients, servers, the node's) is
/// pinned to: `E2E_WORKER_CPU` (`none`: unpinned), by default the last.
/// A packet between namespaces is handled by the CPU that sends it, so
/// every datapath's work lands beside its workloads on one CPU and a figure
/// is their CPU cost; unpinned, whether a client and its server shared a
/// CPU moved raw's own A/A ratio (`raw-again`) by up to 20%, more than the
/// datapaths differ (docs/bench/README.md). The agents stay unpinned.
fn worker_cpu() -> Option<usize> {
    match std::env::var("E2E_WORKER_CPU").ok().as_deref() {
        Some("none") => None,
        Some(n) => Some(n.parse().expect("E2E_WORKER_CPU: a CPU number or none")),
        None => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cpus > 1).then_some(cpus - 1)
        }
    }
}

/// A site's workers, one per role (two clients on the node's side for a
/// socket-level datapath).
struct Workers {
    client: Worker,
    /// The hostNetwork client in the socket hooks' cgroup.
    socket_client: Option<Worker>,
    external: Worker,
    servers: Vec<Worker>,
    node: Worker,
}

/// Where datapaths are measured: a site, its workers and the agent running.
/// Fields drop in order: the agent and workers before the namespaces.
struct Bed {
    name: String,
    site: Site,
    agent: Option<RunningAgent>,
    workers: Workers,
    /// Datapaths take turns on this node: each switch cleans it up.
    shared: bool,
    /// The socket hooks' cgroup, as the agent and the worker name it.
    socket_lb_cgroup: Option<String>,
    _cgroup: Option<TestCgroup>,
    _testbed: Option<Testbed>,
}

struct RunningAgent {
    datapath: String,
    scale: usize,
    agent: Agent,
}

impl Bed {
    fn start(
        name: String,
        site: Site,
        shared: bool,
        socket_lb_cgroup: Option<String>,
    ) -> anyhow::Result<Self> {
        let start = |host: &Host, cgroup| {
            Worker::start(host, cgroup, site.worker_cpu).with_context(|| format!("the {name} bed"))
        };
        let mut servers = Vec::new();
        for (s, name) in site.servers.iter().zip(SERVERS) {
            let mut w = start(&s.host, None)?;
            w.ask(&format!("serve {name}"))?;
            servers.push(w);
        }
        let workers = Workers {
            client: start(&site.client, None)?,
            socket_client: match &socket_lb_cgroup {
                Some(c) => Some(start(&site.node.host, Some(c.as_str()))?),
                None => None,
            },
            external: start(&site.external, None)?,
            servers,
            node: start(&site.node.host, None)?,
        };
        Ok(Bed {
            name,
            site,
            agent: None,
            workers,
            shared,
            socket_lb_cgroup,
            _cgroup: None,
            _testbed: None,
        })
    }

    /// A testbed of its own (one datapath's, or shared in a rehearsal).
    fn testbed(
        name: &str,
        work: &Path,
        socket_lb: bool,
        shared: bool,
        via: &[String],
    ) -> anyhow::Result<Self> {
        let mut names = vec!["client"];
        names.extend(SERVERS);
        let tb =
            Testbed::new(Cni::Routed, &names).with_context(|| format!("the {name} testbed"))?;
        let cgroup = match socket_lb {
            true => Some(TestCgroup::new("e2e-socket-lb")?),
            false => None,
        };
        let seen = cgroup.as_ref().map(|c| {
            c.seen_from_other_mount_namespaces()
                .to_string_lossy()
                .into_owned()
        });
        let mut bed = Self::start(
            name.to_owned(),
            Site::of_testbed(&tb, work, via),
            shared,
            seen,
        )?;
        bed._cgroup = cgroup;
        bed._testbed = Some(tb);
        Ok(bed)
    }

    /// The worker of the client that goes to the ClusterIP.
    fn client(&mut self, dp: &Datapath) -> &mut Worker {
        match (&mut self.workers.socket_client, dp.socket_lb) {
            (Some(w), true) => w,
            _ => &mut self.workers.client,
        }
    }

    fn server(&self) -> Ipv4Addr {
        self.site.servers[0].ip
    }

    /// Where the pod's clients connect (TCP).
    fn cluster_target(&self, dp: &Datapath, n: usize) -> SocketAddr {
        if dp.is_raw() {
            SocketAddr::from((self.server(), TCP_PORT))
        } else {
            agent::target(n)
        }
    }

    fn node_port_target(&self, dp: &Datapath) -> SocketAddr {
        if dp.is_raw() {
            SocketAddr::from((self.server(), TCP_PORT))
        } else {
            SocketAddr::from((self.site.node.address, NODE_PORT))
        }
    }

    fn udp_target(&self, dp: &Datapath, n: usize) -> SocketAddr {
        if dp.is_raw() {
            SocketAddr::from((self.server(), UDP_PORT))
        } else {
            SocketAddr::from((agent::vip(n - 1), UDP_SERVICE_PORT))
        }
    }

    fn manifests(&self, n: usize) -> ManifestsDir<'_> {
        ManifestsDir {
            node: &self.site.node,
            dir: Path::new(&self.site.node.work).join(format!("manifests-{n}")),
        }
    }

    fn udp_received(&mut self) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for w in &mut self.workers.servers {
            sum += w.ask_num("udp-received")?;
        }
        Ok(sum)
    }

    /// Puts the node in `dp`'s state for `n` services: its agent running
    /// on those manifests (none for raw). The seconds an agent it started
    /// took to answer.
    fn switch_to(&mut self, dp: &Datapath, n: usize) -> anyhow::Result<Option<f64>> {
        let current = self.agent.as_ref().map(|a| (a.datapath.as_str(), a.scale));
        let running = dp.mode.map(|_| (dp.name.as_str(), n));
        if current == running && !(self.shared && current.is_none()) {
            return Ok(None);
        }
        // Stopped, not killed: its datapath stays, as upstream's rules do;
        // cleaned up, so that the next agent starts from cold.
        let stopped = self.agent.take().is_some();
        if self.shared || stopped {
            agent::cleanup(&self.site.node)
                .with_context(|| format!("cleaning the {} node up", self.name))?;
        }
        if dp.is_raw() {
            return Ok(None);
        }
        set_iptables_hint(&self.site.node.host, dp.iptables_hint)?;
        let started = self.start_agent(dp, n)?;
        Ok(Some(started))
    }

    /// Stops the running agent, cleans the node up and starts `dp`'s again:
    /// one more start from cold, the seconds it took.
    fn restart_cold(&mut self, dp: &Datapath, n: usize) -> anyhow::Result<f64> {
        self.agent = None;
        agent::cleanup(&self.site.node)
            .with_context(|| format!("cleaning the {} node up", self.name))?;
        self.start_agent(dp, n)
    }

    /// Starts `dp`'s agent and waits until both the ClusterIP (from the
    /// pod) and the NodePort (from outside) answer: the seconds that took.
    fn start_agent(&mut self, dp: &Datapath, n: usize) -> anyhow::Result<f64> {
        let mode = dp.mode.expect("not raw");
        let cgroup = self.socket_lb_cgroup.clone().filter(|_| dp.socket_lb);
        let manifests = self.manifests(n).dir;
        let mut agent = Agent::start(
            &self.site.node,
            mode,
            &manifests,
            cgroup.as_deref(),
            dp.agent_args,
            n,
        )?;
        // From the agent's pid, printed just before it execs: writing its
        // configuration and (on real machines) ssh's set-up are not its start.
        // Through ssh the line arrives half a round trip late, well under a
        // millisecond on a LAN.
        let t = Instant::now();
        let t_wall = SystemTime::now();
        // Both frontends answering, and the first sync (every service, not
        // just the target, which may be written early) reported done: its
        // time is the one the agent's metrics give (its clock; this one's on
        // the testbed, NTP's on real machines), so the metrics are asked
        // only every 100 ms (a scrape is work the starting agent does too).
        let metrics = SocketAddr::from((self.site.node.address, METRICS_PORT));
        let probes = [
            (
                true,
                format!("request {} 50", self.cluster_target(dp, n)),
                10,
            ),
            (
                false,
                format!("request {} 50", self.node_port_target(dp)),
                10,
            ),
            (false, format!("synced {metrics} 50"), 100),
        ];
        let (mut synced_at, mut answered) = (None, 0.0);
        for (from_client, probe, pause_ms) in probes {
            loop {
                if !agent.alive() {
                    bail!("the {} agent exited:\n{}", dp.name, agent.log_text());
                }
                let worker = match from_client {
                    true => self.client(dp),
                    false => &mut self.workers.external,
                };
                if let Ok(answer) = worker.ask(&probe) {
                    if probe.starts_with("synced") {
                        synced_at = Some(answer.parse::<f64>().context("the sync time")?);
                    } else {
                        answered = t.elapsed().as_secs_f64();
                    }
                    break;
                }
                if t.elapsed() > Duration::from_secs(1800) {
                    bail!(
                        "the {} agent did not program {n} services in 30 minutes",
                        dp.name
                    );
                }
                // A SYN the node drops costs the whole connect timeout: with
                // these two the answering time is known to about 60 ms.
                std::thread::sleep(Duration::from_millis(pause_ms));
            }
        }
        let since_epoch = t_wall.duration_since(SystemTime::UNIX_EPOCH)?.as_secs_f64();
        let synced = synced_at.map_or(0.0, |at| at - since_epoch);
        let started = answered.max(synced);
        let log = agent.log_text();
        if log.contains("are ignored") {
            bail!("the {} agent ignored its mode:\n{log}", dp.name);
        }
        if let Some(hint) = dp.iptables_hint {
            let listed = self
                .site
                .node
                .host
                .output(&format!("{hint}-save"), &["-t", "nat"])?;
            if !listed.contains("KUBE-SERVICES") {
                bail!(
                    "{}: the agent did not write its rules through {hint}:\n{log}",
                    dp.name
                );
            }
        }
        self.agent = Some(RunningAgent {
            datapath: dp.name.clone(),
            scale: n,
            agent,
        });
        Ok(started)
    }

    /// The running agent's resident memory, MB.
    fn agent_rss_mb(&mut self) -> Option<f64> {
        let pid = self.agent.as_ref()?.agent.pid().to_owned();
        let kb = self.workers.node.ask_num(&format!("rss {pid}")).ok()?;
        Some(kb / 1024.0)
    }
}

/// Kubelet's hint chain (`KUBE-IPTABLES-HINT` in mangle) in `binary`'s
/// backend only, as on a node of that backend; none for other modes.
fn set_iptables_hint(node: &Host, binary: Option<&str>) -> anyhow::Result<()> {
    for other in ["iptables-legacy", "iptables-nft"] {
        if Some(other) != binary {
            // Absent (or the tool missing) is the state wanted.
            let _ = node.output(other, &["-t", "mangle", "-X", "KUBE-IPTABLES-HINT"]);
        }
    }
    if let Some(binary) = binary {
        let listed = node.output(binary, &["-t", "mangle", "-S"])?;
        if !listed.contains("-N KUBE-IPTABLES-HINT") {
            node.output(binary, &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
                .with_context(|| format!("creating kubelet's hint chain with {binary}"))?;
        }
    }
    Ok(())
}

pub struct Settings {
    pub rounds: usize,
    pub connections: usize,
    /// A round's connections per datapath come in this many passes over
    /// the datapaths (1 when they share a node: a switch restarts agents).
    pub conn_passes: usize,
    pub stream: Duration,
    pub changes: usize,
    /// Cold starts of each agent per scale.
    pub starts: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        if let Err(e) = worker::main(&args[1..]) {
            eprintln!("end_to_end worker: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    common::main("end_to_end", run);
}

/// The beds, and the bed each datapath is measured on.
fn beds(datapaths: &[Datapath], work: &Path) -> anyhow::Result<(Vec<Bed>, Vec<usize>, String)> {
    let socket_lb = datapaths.iter().any(|d| d.socket_lb);
    let shared_setup = |how: &str| {
        format!(
            "{how}: one node serves every datapath in turn; at each switch its agent is \
             stopped, `proxy-agent --cleanup` removes what any mode left, and the next one \
             starts (raw: none), so a datapath's start time is measured at every switch."
        )
    };
    match std::env::var("E2E_HOSTS").ok().as_deref() {
        None | Some("") => {
            let mut beds = Vec::new();
            for dp in datapaths {
                beds.push(Bed::testbed(&dp.name, work, dp.socket_lb, false, &[])?);
            }
            let pinned = match worker_cpu() {
                Some(cpu) => format!(
                    " Every workload (clients, servers) runs on CPU {cpu} (E2E_WORKER_CPU), \
                     and a packet between namespaces is handled by the CPU that sends it: a \
                     figure is the CPU cost of a datapath, not where the scheduler happened to \
                     place a client and its server. The agents are not pinned, but while \
                     endpoint changes are timed their threads are kept off that CPU: woken \
                     there by the worker that moved the file, an agent otherwise often waited \
                     behind the workloads (a 2-CPU machine has no other CPU for them)."
                ),
                None => " The workloads are not pinned to a CPU (E2E_WORKER_CPU=none).".into(),
            };
            let setup = format!(
                "One testbed (node, client pod, server pods, external client; network \
                 namespaces on veths) per datapath, all alive at once; while one datapath \
                 is measured, the other testbeds' agents are paused (SIGSTOP), so one \
                 agent's periodic work does not land in another's figures.{pinned}"
            );
            Ok((beds, (0..datapaths.len()).collect(), setup))
        }
        Some("testbed") => {
            // E2E_REHEARSAL_VIA: a prefix to each namespace's, e.g. an ssh to
            // this machine, so that the rehearsal goes through ssh as well.
            let via: Vec<String> = std::env::var("E2E_REHEARSAL_VIA")
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect();
            let bed = Bed::testbed("shared", work, socket_lb, true, &via)?;
            let through = match via.is_empty() {
                true => String::new(),
                false => format!(", reached through `{}`", via.join(" ")),
            };
            let setup = shared_setup(&format!(
                "A rehearsal of the bare-metal run in one testbed (E2E_HOSTS=testbed: network \
                 namespaces on veths as the machines{through})"
            ));
            Ok((vec![bed], vec![0; datapaths.len()], setup))
        }
        Some(file) => {
            let hosts = HostsFile::read(Path::new(file))?;
            if socket_lb && hosts.node.socket_lb_cgroup.is_none() {
                bail!(
                    "E2E_HOSTS {file}: node.socket_lb_cgroup: needed for the ebpf-socket datapath"
                );
            }
            let cgroup = hosts.node.socket_lb_cgroup.clone().filter(|_| socket_lb);
            let site = Site {
                node: hosts.node,
                client: hosts.client,
                external: hosts.external,
                worker_cpu: None,
                servers: hosts.servers,
            };
            let setup = shared_setup(&format!(
                "Bare metal (E2E_HOSTS={file}): the node reached by `{}`, the pod-side client by \
                 `{}`, the external client by `{}`",
                site.node.host.describe(),
                site.client.describe(),
                site.external.describe()
            ));
            let bed = Bed::start("bare-metal".into(), site, true, cgroup)?;
            Ok((vec![bed], vec![0; datapaths.len()], setup))
        }
    }
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
        "raw,raw-again,ebpf,ebpf-xdp-generic,ebpf-socket,nftables,iptables-legacy",
    )
    .iter()
    .map(|d| Datapath::parse(d))
    .collect::<anyhow::Result<Vec<_>>>()?;
    if !datapaths.iter().any(|d| d.name == "raw") {
        bail!("E2E_DATAPATHS must hold raw: every figure is a ratio to it");
    }
    let rules_max = env_num("E2E_RULES_MAX", 50_000)?;
    let mut settings = Settings {
        rounds: env_num("E2E_ROUNDS", 9)?,
        connections: env_num("E2E_CONNECTIONS", 6000)?,
        conn_passes: env_num("E2E_CONN_PASSES", 6)?.max(1),
        stream: Duration::from_millis(env_num("E2E_STREAM_MS", 1000)? as u64),
        changes: env_num("E2E_CHANGES", 20)?,
        starts: env_num("E2E_STARTS", 3)?.max(1),
    };
    let work = tempfile::tempdir()?;
    let keep = std::env::var_os("E2E_KEEP_WORK").is_some();
    if keep {
        eprintln!(
            "e2e: agent logs and manifests kept in {} (bare metal: node.work)",
            work.path().display()
        );
    }
    let (mut beds, bed_of, setup) = beds(&datapaths, work.path())?;
    if beds.iter().any(|b| b.shared) {
        settings.conn_passes = 1;
    }
    let machine = beds[0].workers.node.ask("machine")?;

    // outcomes[scale][datapath]
    let mut outcomes: Vec<Vec<Outcome>> = Vec::new();
    for &n in &scales {
        for bed in &beds {
            let serving: Vec<Ipv4Addr> = bed.site.servers[..2].iter().map(|s| s.ip).collect();
            bed.manifests(n).write_all(n, &serving)?;
        }
        let mut row: Vec<Outcome> = datapaths.iter().map(|_| Outcome::default()).collect();
        for (dp, out) in datapaths.iter().zip(&mut row) {
            if dp.is_rule_mode() && n > rules_max {
                out.skipped = Some(format!("above E2E_RULES_MAX ({rules_max})"));
            }
        }
        let measured: Vec<usize> = (0..datapaths.len())
            .filter(|&i| row[i].skipped.is_none())
            .collect();
        // A testbed none of whose datapaths runs at this scale (a rule mode
        // above E2E_RULES_MAX) has its agent stopped: paused or not, an agent
        // left from the last scale is no part of this one's figures.
        for (b, bed) in beds.iter_mut().enumerate() {
            let used = measured.iter().any(|&i| bed_of[i] == b);
            if !used && bed.agent.is_some() {
                bed.agent = None;
                agent::cleanup(&bed.site.node)
                    .with_context(|| format!("cleaning the {} node up", bed.name))?;
            }
        }
        // A warm-up, unrecorded: the first connections of a testbed pay for
        // neighbour resolution and cold caches.
        for &i in &measured {
            // A start is timed with the other agents paused, as every other
            // figure is: at 10,000 services a rule mode's periodic resync
            // takes seconds of CPU, which a 2-CPU machine would give to it.
            let _others = pause_others(&beds, bed_of[i])?;
            let (dp, bed) = (&datapaths[i], &mut beds[bed_of[i]]);
            if let Some(s) = bed.switch_to(dp, n)? {
                row[i].start_s.push(s);
                eprintln!("e2e: {} programmed {n} services in {s:.2} s", dp.name);
                // One start is one sample of a figure that varies by tens of
                // percent on a busy machine.
                for _ in 1..settings.starts {
                    let s = bed.restart_cold(dp, n)?;
                    row[i].start_s.push(s);
                    eprintln!("e2e: {} programmed {n} services in {s:.2} s", dp.name);
                }
            }
            let target = bed.cluster_target(dp, n);
            bed.client(dp).ask(&format!("connections {target} 100"))?;
            let target = bed.node_port_target(dp);
            bed.workers
                .external
                .ask(&format!("connections {target} 100"))?;
        }
        for round in 0..settings.rounds {
            // Connections first, in passes over the datapaths: each
            // datapath's share of a pass lasts a fraction of a second, so
            // its figures and raw's are taken moments apart (this machine's
            // speed drifts by tens of percent over seconds).
            let mut tallies: Vec<ConnTallies> = row.iter().map(|_| Default::default()).collect();
            let per_pass = settings.connections.div_ceil(settings.conn_passes);
            for pass in 0..settings.conn_passes {
                for k in 0..measured.len() {
                    let i = measured[(k + round + pass) % measured.len()];
                    let dp = &datapaths[i];
                    let _others = take_turn(&mut beds, bed_of[i], dp, n, &mut row[i])?;
                    let bed = &mut beds[bed_of[i]];
                    connection_pass(bed, dp, n, per_pass, &mut tallies[i])
                        .with_context(|| format!("{} at {n} services", dp.name))?;
                }
            }
            for k in 0..measured.len() {
                let i = measured[(k + round) % measured.len()];
                let dp = &datapaths[i];
                let _others = take_turn(&mut beds, bed_of[i], dp, n, &mut row[i])?;
                let bed = &mut beds[bed_of[i]];
                let sample = measure(bed, dp, n, &settings, &tallies[i])
                    .with_context(|| format!("{} at {n} services", dp.name))?;
                row[i].samples.push(sample);
                if round + 1 == settings.rounds {
                    // Once it has served the rounds: right after its first
                    // sync it may still hold what it read.
                    row[i].rss_mb = bed.agent_rss_mb();
                }
            }
        }
        for &i in &measured {
            let dp = &datapaths[i];
            if dp.is_raw() {
                continue;
            }
            let _others = take_turn(&mut beds, bed_of[i], dp, n, &mut row[i])?;
            let bed = &mut beds[bed_of[i]];
            let times = change_latencies(bed, dp, n, &settings)
                .with_context(|| format!("endpoint changes on {} at {n} services", dp.name))?;
            row[i].change_ms = times.packets;
            row[i].change_maps_ms = times.maps;
            row[i].change_cpu_taken_ms = times.cpu_taken;
            eprintln!(
                "e2e: {} at {n} services followed {} endpoint changes",
                dp.name,
                row[i].change_ms.len()
            );
        }
        outcomes.push(row);
    }
    for bed in &mut beds {
        bed.agent = None;
        if bed.shared && bed._testbed.is_none() {
            agent::cleanup(&bed.site.node)?;
        }
    }

    let report = report::render(&scales, &datapaths, &outcomes, &settings, &setup, &machine);
    print!("{report}");
    let path = std::env::var("E2E_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/e2e.md"))
        });
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    report::plot(&path.with_extension("svg"), &scales, &datapaths, &outcomes)?;
    std::fs::write(&path, report)?;
    eprintln!("e2e: report written to {}", path.display());
    if keep {
        let _ = work.keep();
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Short connections of one client to one target over a round's passes.
#[derive(Default)]
struct ConnTally {
    elapsed_ns: f64,
    latencies_us: Vec<f64>,
}

impl ConnTally {
    /// `connections ADDR COUNT` on `worker`, added to the tally.
    fn add(&mut self, worker: &mut Worker, target: SocketAddr, count: usize) -> anyhow::Result<()> {
        let reply = worker.ask(&format!("connections {target} {count}"))?;
        let mut ns = reply.split_whitespace().map(|v| v.parse::<f64>());
        self.elapsed_ns += ns.next().context("connections: no reply")??;
        let before = self.latencies_us.len();
        for v in ns {
            self.latencies_us.push(v? / 1e3);
        }
        let got = self.latencies_us.len() - before;
        anyhow::ensure!(got == count, "connections: {got} latencies of {count}");
        Ok(())
    }

    /// The rate, p50 and p99 in µs.
    fn figures(&self) -> anyhow::Result<(f64, f64, f64)> {
        anyhow::ensure!(!self.latencies_us.is_empty(), "no connection measured");
        let mut lat = self.latencies_us.clone();
        lat.sort_by(f64::total_cmp);
        Ok((
            lat.len() as f64 / (self.elapsed_ns / 1e9),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
        ))
    }
}

/// A round's connections on one datapath: from the pod, from outside.
#[derive(Default)]
struct ConnTallies {
    pod: ConnTally,
    outside: ConnTally,
}

/// One pass of `count` connections from the pod to the ClusterIP and as
/// many from outside to the NodePort.
fn connection_pass(
    bed: &mut Bed,
    dp: &Datapath,
    n: usize,
    count: usize,
    tallies: &mut ConnTallies,
) -> anyhow::Result<()> {
    let target = bed.cluster_target(dp, n);
    tallies
        .pod
        .add(bed.client(dp), target, count)
        .context("connections from the pod")?;
    let target = bed.node_port_target(dp);
    tallies
        .outside
        .add(&mut bed.workers.external, target, count)
        .context("connections from outside")
}

/// One round of the streams on one datapath, with the round's connections.
fn measure(
    bed: &mut Bed,
    dp: &Datapath,
    n: usize,
    s: &Settings,
    conns: &ConnTallies,
) -> anyhow::Result<Sample> {
    let ms = s.stream.as_millis();
    let (conn_rate, conn_p50_us, conn_p99_us) = conns.pod.figures()?;
    let (node_port_rate, node_port_p50_us, node_port_p99_us) = conns.outside.figures()?;
    let target = bed.cluster_target(dp, n);
    let bulk_bps = bed
        .client(dp)
        .ask_num(&format!("bulk {target} {ms}"))
        .context("bulk TCP")?;
    let target = bed.udp_target(dp, n);
    let received = bed.udp_received()?;
    let softirq = bed.workers.node.ask_num("softirq")?;
    let sent_ns = bed
        .client(dp)
        .ask_num(&format!("udp {target} {ms}"))
        .context("UDP")?;
    // What is still in flight lands within a moment.
    std::thread::sleep(Duration::from_millis(50));
    let got = bed.udp_received()? - received;
    let softirq = bed.workers.node.ask_num("softirq")? - softirq;
    if got == 0.0 {
        bail!("UDP: no datagram reached a server");
    }
    Ok(Sample {
        conn_rate,
        conn_p50_us,
        conn_p99_us,
        node_port_rate,
        node_port_p50_us,
        node_port_p99_us,
        bulk_bps,
        udp_rate: got / (sent_ns / 1e9),
        softirq_ns: softirq / got,
    })
}

/// Puts bed `b` in `dp`'s state (a start it took counts in `outcome`) and
/// pauses every other bed's agent until the guards drop.
fn take_turn(
    beds: &mut [Bed],
    b: usize,
    dp: &Datapath,
    n: usize,
    outcome: &mut Outcome,
) -> anyhow::Result<Vec<agent::Paused>> {
    if let Some(s) = beds[b].switch_to(dp, n)? {
        outcome.start_s.push(s);
    }
    pause_others(beds, b)
}

/// Every testbed's agent but `measured`'s, paused until the guards drop: on
/// a shared machine one agent's periodic work (a rule mode's resync takes
/// seconds of CPU at 10,000 services) would land in another's figures.
fn pause_others(beds: &[Bed], measured: usize) -> anyhow::Result<Vec<agent::Paused>> {
    beds.iter()
        .enumerate()
        .filter(|(b, _)| *b != measured)
        .filter_map(|(_, bed)| bed.agent.as_ref())
        .map(|running| running.agent.pause())
        .collect()
}

/// Until the agent's last sync is older than its minSyncPeriod (upstream's
/// default, 1 s, counted from a sync's end) with room to spare, so that the
/// next change is synced at once: a change is timed through the agent, not
/// through its rate limit. Without this, the first change of one set (20
/// at 1,000 services) took 550 ms: most likely it came right after a sync
/// the agent ran for itself (its periodic one, due at once when the bench
/// resumed it from a pause) and waited for the limit.
fn wait_sync_idle(bed: &mut Bed, metrics: SocketAddr) -> anyhow::Result<()> {
    const IDLE: f64 = 1.2;
    // A rule mode at 10,000 services syncs for seconds and may not answer
    // its metrics meanwhile: asked again until this limit.
    const LIMIT: Duration = Duration::from_secs(180);
    let started = Instant::now();
    loop {
        let age = bed
            .workers
            .node
            .ask(&format!("sync-age {metrics} 2000"))
            .and_then(|answer| {
                answer
                    .parse::<f64>()
                    .with_context(|| format!("sync-age: not a number: {answer:?}"))
            });
        let wait = match age {
            Ok(age) if age >= IDLE => return Ok(()),
            Ok(age) => IDLE - age.max(0.0) + 0.01,
            Err(e) if started.elapsed() > LIMIT => {
                return Err(e.context(format!("the agent's last sync, for {LIMIT:?}")));
            }
            Err(_) => 0.1,
        };
        if started.elapsed() > LIMIT {
            bail!("the agent synced again and again for {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
}

/// Endpoint changes, timed from the moment the changed EndpointSlice is
/// moved into place, ms.
#[derive(Default)]
struct ChangeTimes {
    /// To the first connection that reaches the new endpoint.
    packets: Vec<f64>,
    /// To the agent's maps balancing to it (eBPF modes).
    maps: Vec<f64>,
    /// CPU time other tasks ran on the agent's CPUs meanwhile, and the time
    /// the agent's threads waited for a CPU ([`cpu_taken`]), ms, by change,
    /// when the worker watching the maps was not on them.
    cpu_taken: Vec<(f64, f64)>,
}

/// `settings.changes` times: the target service's endpoints replaced by a
/// third server. Its slice is written on the node beside its place, and the
/// node's worker moves it into place and (eBPF modes) watches the agent's
/// maps until the target balances to the third server; then the pod's
/// worker tries one connection a millisecond until one reaches it (the
/// first after the maps change does: no sampling among old and new
/// endpoints in the figure). Both are timed from the move (the packets
/// figure from just before the node's worker is asked to make it).
/// Then the two servers are given back, and waited out until 40 connections
/// in a row do not reach the third. Each change is a lone one, made once
/// the agent is idle ([`wait_sync_idle`]).
fn change_latencies(
    bed: &mut Bed,
    dp: &Datapath,
    n: usize,
    settings: &Settings,
) -> anyhow::Result<ChangeTimes> {
    let target = bed.cluster_target(dp, n);
    let serving: Vec<Ipv4Addr> = bed.site.servers[..2].iter().map(|s| s.ip).collect();
    let new = SERVERS[2];
    let with_new: Vec<Ipv4Addr> = bed.site.servers[2..3].iter().map(|s| s.ip).collect();
    let new_backend = SocketAddr::from((with_new[0], TCP_PORT));
    let pid = bed
        .agent
        .as_ref()
        .context("no agent runs")?
        .agent
        .pid()
        .to_owned();
    let watch_maps = dp.mode == Some("ebpf");
    let mut times = ChangeTimes::default();
    // The agent off the CPU the workloads are pinned to while changes are
    // timed: woken by the worker's move there, it otherwise often ran on
    // that CPU, behind the client's connection attempts (at 1,000 services,
    // 6 changes of 80 took 2.4-3.5 ms to the maps, 1.0 ms p50; kept off
    // it, 1 of 63 took 3.05 ms and the rest at most 1.29 ms).
    bed.workers.node.ask(&format!("keep-off {pid}"))?;
    let metrics = SocketAddr::from((bed.site.node.address, METRICS_PORT));
    for _ in 0..settings.changes {
        wait_sync_idle(bed, metrics)?;
        let (staged, place) = bed.manifests(n).stage_target_slice(n, &with_new)?;
        let mut change = format!("change {staged} {place}");
        if watch_maps {
            change.push_str(&format!(" {pid} {target} {new_backend} 120000"));
        }
        let (t, mut moved_at) = (Instant::now(), std::time::SystemTime::now());
        let answer = bed.workers.node.ask(&change)?;
        bed.client(dp)
            .ask(&format!("reach {target} {new} 120000"))?;
        let mut to_packets = t.elapsed().as_secs_f64() * 1e3;
        if watch_maps {
            let numbers: Vec<&str> = answer.split_whitespace().collect();
            let [to_maps, taken, waited, counting_before, counting_after] = numbers[..] else {
                bail!("{change}: five figures expected, got {answer:?}");
            };
            let ms = |s: &str| {
                s.parse::<f64>()
                    .map(|ns| ns / 1e6)
                    .with_context(|| format!("{change}: not a number: {answer:?}"))
            };
            times.maps.push(ms(to_maps)?);
            if taken != "-" {
                times.cpu_taken.push((ms(taken)?, ms(waited)?));
            }
            let before = ms(counting_before)?;
            to_packets -= before + ms(counting_after)?;
            moved_at += Duration::from_secs_f64(before / 1e3);
        }
        times.packets.push(to_packets);
        // Each change on its own line, stamped as the agents' logs are, so
        // a slow one can be found in them (E2E_AGENT_LOG, E2E_KEEP_WORK).
        let last = |v: &Vec<f64>| v.last().map_or("-".into(), |ms| format!("{ms:.2}"));
        let (taken, waited) = times
            .cpu_taken
            .last()
            .map_or(("-".into(), "-".into()), |(t, w)| {
                (format!("{t:.2}"), format!("{w:.2}"))
            });
        eprintln!(
            "e2e: {} at {n} services: change at {} to maps {} ms, to packets {:.2} ms, \
             other tasks on the agent's CPUs {taken} ms, the agent waiting for a CPU {waited} ms",
            dp.name,
            humantime::format_rfc3339_micros(moved_at),
            last(&times.maps),
            times.packets.last().copied().unwrap_or_default(),
        );
        bed.manifests(n).write_target_slice(n, &serving)?;
        bed.client(dp)
            .ask(&format!("avoid {target} {new} 40 120000"))?;
    }
    bed.workers.node.ask(&format!("release {pid}"))?;
    Ok(times)
}
