//! The demo: a node with three `whoami` pods and a client pod, the agent
//! running on the example Service, connections balanced, a backend removed,
//! everything cleaned up.

use std::{
    collections::BTreeMap,
    fs,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use testbed::{Cni, Testbed, netns, servers};

const VIP: &str = "198.19.0.10:80";
const BACKENDS: [&str; 3] = ["whoami-0", "whoami-1", "whoami-2"];
const REQUESTS: usize = 60;

/// The agent's process; SIGTERMed and reaped on `stop` or drop.
struct AgentProcess(Option<Child>);

impl AgentProcess {
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.0.take()?;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().ok()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn run(agent: &Path, example: &Path) -> anyhow::Result<()> {
    println!(
        "\n== building the testbed: node namespace, pods {BACKENDS:?} + client on routed veths"
    );
    let mut pods = BACKENDS.to_vec();
    pods.push("client");
    let tb = Testbed::new(Cni::Routed, &pods)?;
    let _servers = BACKENDS
        .iter()
        .map(|b| servers::IdentityServer::start(&tb.pod(b).ns, b, 8080))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for p in &tb.pods {
        println!("   pod {:<9} {:<13} netns {}", p.name, p.ip, p.ns);
    }

    // The agent watches a copy, so the demo can edit it without touching the repo.
    let dir = std::env::temp_dir().join(format!("{}-manifests", tb.id));
    fs::create_dir_all(&dir)?;
    for f in ["service.yaml", "endpointslice.yaml", "node.yaml"] {
        fs::copy(example.join(f), dir.join(f)).with_context(|| format!("copying {f}"))?;
    }
    println!(
        "\n== starting proxy-agent in {} on {}",
        tb.node_ns,
        example.display()
    );
    // The socket hooks go on a cgroup of the demo's own, never the host's root.
    let cgroup = testbed::cgroup::TestCgroup::new("demo")?;
    // Its names for `inspect` go to a directory of the demo's own, not the host's /run.
    let state = std::env::temp_dir().join(format!("{}-state", tb.id));
    let child = Command::new("ip")
        .args(["netns", "exec", &tb.node_ns])
        .arg(agent)
        .arg(format!("--ebpf-state-dir={}", state.display()))
        .arg(format!(
            "--ebpf-socket-lb-cgroup-path={}",
            cgroup.seen_from_other_mount_namespaces().display()
        ))
        // The demo's datapath goes with it (a node's outlives the agent).
        .args([
            "--ebpf-detach-on-exit",
            "--hostname-override",
            "node-a",
            "--manifests",
        ])
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .context("starting proxy-agent")?;
    let mut agent = AgentProcess(Some(child));

    let client = tb.pod("client").ns.clone();
    wait_until_serving(&client)?;

    println!(
        "\n== {REQUESTS} TCP connections and {REQUESTS} UDP requests from the client pod to {VIP}"
    );
    show(&client)?;

    println!("\n== removing whoami-2 from the EndpointSlice");
    let slice = fs::read_to_string(dir.join("endpointslice.yaml"))?;
    let cut = slice
        .find("  - addresses: [198.18.1.12]")
        .context("example slice changed shape")?;
    fs::write(dir.join("endpointslice.yaml"), &slice[..cut])?;
    std::thread::sleep(Duration::from_secs(1));
    show(&client)?;

    println!("\n== stopping the agent (SIGTERM): programs detach, the testbed is removed");
    let status = agent.stop();
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_dir_all(&state);
    match status {
        Some(s) if s.success() => Ok(()),
        other => bail!("the agent exited badly: {other:?}"),
    }
}

fn wait_until_serving(client: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = netns::run_in(client, || {
            servers::tcp_identity(target(), Duration::from_millis(300)).is_ok()
        })?;
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the ClusterIP did not answer within 20s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn target() -> SocketAddr {
    VIP.parse().expect("valid address")
}

fn show(client: &str) -> anyhow::Result<()> {
    let (tcp, udp) = netns::run_in(client, || -> anyhow::Result<_> {
        let mut tcp: BTreeMap<String, usize> = BTreeMap::new();
        let mut udp: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..REQUESTS {
            *tcp.entry(servers::tcp_identity(target(), Duration::from_secs(2))?)
                .or_default() += 1;
            let (id, from) = servers::udp_identity(target(), Duration::from_secs(2))?;
            anyhow::ensure!(from == target(), "UDP reply came from {from}, not the VIP");
            *udp.entry(id).or_default() += 1;
        }
        Ok((tcp, udp))
    })??;
    println!("   {:<10} {:>5} {:>5}", "backend", "TCP", "UDP");
    for b in BACKENDS {
        let (t, u) = (
            tcp.get(b).copied().unwrap_or(0),
            udp.get(b).copied().unwrap_or(0),
        );
        println!("   {b:<10} {t:>5} {u:>5}  {}", "#".repeat((t + u) / 4));
    }
    println!("   every reply came from {VIP}");
    Ok(())
}
