//! The end-to-end benchmark users compare datapaths by (issue 14, first
//! step): short HTTP-style connections from a pod through a ClusterIP, per
//! datapath, at several numbers of services, every figure beside raw
//! routing measured in the same run.
//!
//! One testbed per datapath (a node namespace, a client pod, two server
//! pods), all alive at once, so rounds interleave: for each scale the
//! agents are started on the same generated manifests (N services of one
//! port, each on both server pods), then every round measures every
//! datapath in a rotating order. Datapaths: `raw` (the client connects to
//! a server pod's address, no agent), and the agent in `ebpf` (TC
//! programs; socket hooks off: they would attach to the root cgroup),
//! `nftables` and `iptables` mode. The client connects to the last
//! service generated (the worst case for rule lists walked in order).
//!
//! Figures: connections per second (one client thread: connect, send a
//! request, read the reply to EOF, close), latency p50/p99, time from the
//! agent's start to the service answering, the agent's resident memory;
//! each rate also as its ratio to raw in the same round. Written to
//! `docs/bench/e2e.md` with an SVG plot (plotters).
//!
//! `cargo xtask bench e2e`, or `cargo bench -p proxy-agent --bench end_to_end`
//! (root). `E2E_SCALES` (default 1,1000,10000), `E2E_DATAPATHS` (default
//! raw,ebpf,nftables,iptables), `E2E_ROUNDS` (3), `E2E_CONNECTIONS` (1000
//! per round), `E2E_REPORT` (the report's path).

mod common;

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use testbed::{Cni, Testbed, netns};

const SERVER_PORT: u16 = 8080;
const REQUEST: &[u8] = b"GET / HTTP/1.0\r\nHost: bench\r\n\r\n";
const REPLY: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The ClusterIP of service `i` (198.19.0.0/16 holds 65,536).
fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i as u32)
}

/// `n` services on the two server pods, and the node.
fn write_manifests(dir: &Path, n: usize, servers: &[Ipv4Addr]) -> anyhow::Result<()> {
    fs::create_dir_all(dir)?;
    let mut services = String::new();
    let mut slices = String::new();
    let endpoints: String = servers
        .iter()
        .map(|ip| {
            format!(
                "  - addresses: ['{ip}']\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
            )
        })
        .collect();
    for i in 0..n {
        let v = vip(i);
        let _ = write!(
            services,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec:\n  type: ClusterIP\n  clusterIP: {v}\n  clusterIPs: [{v}]\n  ports: [{{name: http, protocol: TCP, port: 80, targetPort: {SERVER_PORT}}}]\n"
        );
        let _ = write!(
            slices,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\nports: [{{name: http, protocol: TCP, port: {SERVER_PORT}}}]\nendpoints:\n{endpoints}"
        );
    }
    fs::write(dir.join("services.yaml"), services)?;
    fs::write(dir.join("slices.yaml"), slices)?;
    fs::write(
        dir.join("node.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec: {podCIDR: 198.18.1.0/24}\nstatus:\n  addresses: [{type: InternalIP, address: 198.18.100.1}]\n",
    )?;
    Ok(())
}

/// A server pod's listener: answers every connection with [`REPLY`].
fn serve(ns: &str, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let listener = netns::run_in(ns, || TcpListener::bind(("0.0.0.0", SERVER_PORT)))??;
    listener.set_nonblocking(false)?;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(mut c) = conn else { continue };
            let mut buf = [0u8; 256];
            let mut seen = 0;
            while !buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf[seen..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen = (seen + n).min(buf.len() - 1),
                }
            }
            let _ = c.write_all(REPLY);
        }
    });
    Ok(())
}

/// One short connection: its duration, or why it failed.
fn one_request(target: SocketAddr, timeout: Duration) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&target, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    s.write_all(REQUEST)?;
    let mut reply = Vec::with_capacity(64);
    s.read_to_end(&mut reply)?;
    if !reply.ends_with(b"ok") {
        bail!("unexpected reply {:?}", String::from_utf8_lossy(&reply));
    }
    // A RST instead of a FIN: no TIME_WAIT piles up over thousands of connections.
    let _ = common::socket_linger_zero(&s);
    Ok(t.elapsed())
}

/// `count` connections from the client pod to `target`: the latencies.
fn measure(
    client_ns: &str,
    target: SocketAddr,
    count: usize,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    netns::run_in(
        client_ns,
        move || -> anyhow::Result<(Duration, Vec<Duration>)> {
            let mut latencies = Vec::with_capacity(count);
            let start = Instant::now();
            for _ in 0..count {
                latencies.push(one_request(target, Duration::from_secs(2))?);
            }
            Ok((start.elapsed(), latencies))
        },
    )?
}

/// The agent in a node namespace, killed (its rules stay with the namespace) on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(ns: &str, mode: &str, manifests: &Path, work: &Path) -> anyhow::Result<Self> {
        let log = work.join(format!("agent-{mode}.log"));
        // The mode goes in the file: with --config, upstream (and we) ignore
        // the flags the file could set, --proxy-mode among them.
        let config = work.join(format!("config-{mode}.yaml"));
        fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\nclusterCIDR: 198.18.1.0/24\n"
            ),
        )?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_proxy-agent")])
            .args(["--hostname-override", "node-a", "--manifests"])
            .arg(manifests)
            .arg("--config")
            .arg(&config)
            .arg("--ebpf-socket-lb=false")
            .arg(format!(
                "--ebpf-state-dir={}",
                work.join(format!("state-{mode}")).display()
            ))
            // warn: the check of the mode needs the flags-ignored warning.
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .context("starting proxy-agent")?;
        Ok(Self { child, log })
    }

    /// Resident memory in MB (`ip netns exec` execs the agent: same pid).
    fn rss_mb(&self) -> Option<f64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One datapath's testbed.
struct Bed {
    datapath: String,
    tb: Testbed,
    agent: Option<Agent>,
    /// At the current scale: cold start to answering (s), the agent's memory.
    started_s: f64,
    rss_mb: Option<f64>,
}

impl Bed {
    fn client_ns(&self) -> String {
        self.tb.pod("client").ns.clone()
    }

    fn target(&self, n: usize) -> SocketAddr {
        if self.datapath == "raw" {
            SocketAddr::from((self.tb.pod("srv-a").ip, SERVER_PORT))
        } else {
            SocketAddr::from((vip(n - 1), 80))
        }
    }
}

#[derive(Clone, Default)]
struct Sample {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() {
    common::main("end_to_end", run);
}

fn run() -> anyhow::Result<()> {
    let scales: Vec<usize> = env_list("E2E_SCALES", "1,1000,10000")
        .iter()
        .map(|s| s.parse().context("E2E_SCALES: numbers"))
        .collect::<anyhow::Result<_>>()?;
    let datapaths = env_list("E2E_DATAPATHS", "raw,ebpf,nftables,iptables");
    if !datapaths.iter().any(|d| d == "raw") {
        bail!("E2E_DATAPATHS must hold raw: every figure is a ratio to it");
    }
    let rounds = env_num("E2E_ROUNDS", 3);
    let connections = env_num("E2E_CONNECTIONS", 1000);
    let work = tempfile::tempdir()?;
    let stop = Arc::new(AtomicBool::new(false));

    let mut beds = Vec::new();
    for d in &datapaths {
        let tb = Testbed::new(Cni::Routed, &["client", "srv-a", "srv-b"])
            .with_context(|| format!("the {d} testbed"))?;
        for s in ["srv-a", "srv-b"] {
            serve(&tb.pod(s).ns, stop.clone())?;
        }
        beds.push(Bed {
            datapath: d.clone(),
            tb,
            agent: None,
            started_s: 0.0,
            rss_mb: None,
        });
    }
    let servers: Vec<Ipv4Addr> = ["srv-a", "srv-b"]
        .iter()
        .map(|s| beds[0].tb.pod(s).ip)
        .collect();

    // results[scale][datapath] = samples per round; starts[scale][datapath].
    let mut results: Vec<Vec<Vec<Sample>>> = Vec::new();
    let mut starts: Vec<Vec<(f64, Option<f64>)>> = Vec::new();
    for &n in &scales {
        let manifests = work.path().join(format!("manifests-{n}"));
        write_manifests(&manifests, n, &servers)?;
        for bed in &mut beds {
            bed.agent = None;
            if bed.datapath == "raw" {
                continue;
            }
            // A new agent per scale, in a namespace it may share with the
            // previous one's rules: as on a node, the new one replaces them.
            let t = Instant::now();
            let mut agent = Agent::start(&bed.tb.node_ns, &bed.datapath, &manifests, work.path())?;
            let target = bed.target(n);
            let client = bed.client_ns();
            loop {
                if !agent.alive() {
                    bail!(
                        "the {} agent exited:\n{}",
                        bed.datapath,
                        fs::read_to_string(&agent.log).unwrap_or_default()
                    );
                }
                let ok = netns::run_in(&client, move || {
                    one_request(target, Duration::from_millis(50)).is_ok()
                })?;
                if ok {
                    break;
                }
                if t.elapsed() > Duration::from_secs(900) {
                    bail!(
                        "the {} agent did not program {n} services in 15 minutes",
                        bed.datapath
                    );
                }
                // A SYN the node drops costs the whole connect timeout: with
                // these two the start time is known to about 60 ms.
                std::thread::sleep(Duration::from_millis(10));
            }
            bed.started_s = t.elapsed().as_secs_f64();
            let log = fs::read_to_string(&agent.log).unwrap_or_default();
            if log.contains("are ignored") {
                bail!("the {} agent ignored its mode:\n{log}", bed.datapath);
            }
            bed.rss_mb = agent.rss_mb();
            bed.agent = Some(agent);
            eprintln!(
                "e2e: {} programmed {n} services in {:.2} s",
                bed.datapath, bed.started_s
            );
        }
        starts.push(beds.iter().map(|b| (b.started_s, b.rss_mb)).collect());
        let mut per_dp = vec![Vec::new(); beds.len()];
        for round in 0..rounds {
            for k in 0..beds.len() {
                let i = (k + round) % beds.len();
                let bed = &beds[i];
                let (elapsed, mut lat) = measure(&bed.client_ns(), bed.target(n), connections)
                    .with_context(|| format!("{} at {n} services", bed.datapath))?;
                lat.sort();
                per_dp[i].push(Sample {
                    rate: connections as f64 / elapsed.as_secs_f64(),
                    p50_us: percentile(&lat, 0.5),
                    p99_us: percentile(&lat, 0.99),
                });
            }
        }
        results.push(per_dp);
    }
    stop.store(true, Ordering::Relaxed);

    let report = render(&scales, &beds, &results, &starts, rounds, connections)?;
    print!("{report}");
    let path = std::env::var("E2E_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/e2e.md"))
        });
    fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    plot(&path.with_extension("svg"), &scales, &beds, &results)?;
    fs::write(&path, report)?;
    eprintln!("e2e: report written to {}", path.display());
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The ratios of datapath `i` to raw, one per round.
fn ratios(samples: &[Vec<Sample>], raw: usize, i: usize) -> Vec<f64> {
    samples[i]
        .iter()
        .zip(&samples[raw])
        .map(|(s, r)| s.rate / r.rate)
        .collect()
}

/// The median over rounds of the ratio of datapath `i` to raw.
fn ratio(samples: &[Vec<Sample>], raw: usize, i: usize) -> f64 {
    median(ratios(samples, raw, i))
}

fn machine() -> String {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({cpu}), Linux {}", kernel.trim())
}

fn render(
    scales: &[usize],
    beds: &[Bed],
    results: &[Vec<Vec<Sample>>],
    starts: &[Vec<(f64, Option<f64>)>],
    rounds: usize,
    connections: usize,
) -> anyhow::Result<String> {
    let raw = beds
        .iter()
        .position(|b| b.datapath == "raw")
        .expect("checked");
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# End-to-end benchmark: short connections through a ClusterIP\n"
    );
    let _ = writeln!(
        s,
        "`cargo xtask bench e2e`, run on {} ({}). One client pod opens {connections} \
         connections per round (connect, a small HTTP request, the reply to EOF, close), one at \
         a time, to the last of N ClusterIP services (two server pods behind each); {rounds} \
         rounds, the datapaths measured in a rotating order within each round. `raw`: the client \
         connects to a server pod directly through the same node, no agent. Ratios are to raw in \
         the same round (median over rounds, and their range: the run's noise); rates and \
         latencies are medians over rounds.\n",
        machine(),
        jiff_now()
    );
    for (k, &n) in scales.iter().enumerate() {
        let _ = writeln!(s, "## {n} service{}\n", if n == 1 { "" } else { "s" });
        let _ = writeln!(
            s,
            "| datapath | connections/s | ratio to raw | ratio range over rounds | p50 µs | p99 µs | agent start to answering | agent RSS |\n|---|---|---|---|---|---|---|---|"
        );
        for (i, bed) in beds.iter().enumerate() {
            let samples = &results[k][i];
            let rate = median(samples.iter().map(|x| x.rate).collect());
            let p50 = median(samples.iter().map(|x| x.p50_us).collect());
            let p99 = median(samples.iter().map(|x| x.p99_us).collect());
            let (start, rss) = if bed.datapath == "raw" {
                ("—".to_owned(), "—".to_owned())
            } else {
                let (started, rss) = starts[k][i];
                (
                    format!("{started:.2} s"),
                    rss.map_or("?".into(), |m| format!("{m:.0} MB")),
                )
            };
            let r = ratios(&results[k], raw, i);
            let (lo, hi) = r
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
            let _ = writeln!(
                s,
                "| {} | {rate:.0} | {:.3} | {lo:.3}–{hi:.3} | {p50:.0} | {p99:.0} | {start} | {rss} |",
                bed.datapath,
                ratio(&results[k], raw, i)
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "![connections per second, ratio to raw](e2e.svg)");
    Ok(s)
}

fn jiff_now() -> String {
    jiff::Zoned::now().strftime("%Y-%m-%d %H:%M %Z").to_string()
}

fn plot(
    path: &Path,
    scales: &[usize],
    beds: &[Bed],
    results: &[Vec<Vec<Sample>>],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let raw = beds
        .iter()
        .position(|b| b.datapath == "raw")
        .expect("checked");
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_n = *scales.iter().max().unwrap_or(&1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "New connections per second through a ClusterIP, ratio to raw routing",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d((1f64..max_n.max(10.0) * 1.5).log_scale(), 0f64..1.2f64)?;
    chart
        .configure_mesh()
        .x_desc("services")
        .y_desc("connections/s ÷ raw")
        .draw()?;
    let colors = [BLACK, RED, BLUE, GREEN, MAGENTA, CYAN];
    for (i, bed) in beds.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64)> = scales
            .iter()
            .enumerate()
            .map(|(k, &n)| (n as f64, ratio(&results[k], raw, i)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(bed.datapath.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
