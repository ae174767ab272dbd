//! The services the bench generates, and the agent that programs them on
//! the node.

use std::{
    io::BufRead as _,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Stdio},
};

use anyhow::Context as _;

use super::{
    hosts::{Host, Node},
    worker::die_with_this_process,
    workloads::{TCP_PORT, UDP_PORT},
};

pub const SERVICE_PORT: u16 = 80;
pub const UDP_SERVICE_PORT: u16 = 53;
pub const NODE_PORT: u16 = 30080;
/// The agents serve their metrics on the node's address at upstream's default port.
pub const METRICS_PORT: u16 = 10249;

/// The ClusterIP of service `i` (198.19.0.0/16 holds 65,536).
pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i as u32)
}

/// The service every workload goes to: the last of `n`, by number and by
/// name (rule lists walked in order put it last).
pub fn target(n: usize) -> SocketAddr {
    SocketAddr::from((vip(n - 1), SERVICE_PORT))
}

fn name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Endpoints of every service but the target (`E2E_ENDPOINTS`, default 10):
/// the serving servers, then addresses nobody answers on.
pub fn endpoints_per_service() -> usize {
    std::env::var("E2E_ENDPOINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(10)
}

/// The `j`th endpoint of service `i` beyond the serving servers: spread over
/// 198.18.128.0/17 (32,766 addresses, each shared by a few services, as pods
/// behind several services are).
fn filler(i: usize, j: usize) -> Ipv4Addr {
    let per = endpoints_per_service();
    let offset = ((i * per + j) % 32_766 + 1) as u32;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + offset)
}

/// Where the manifests go on the node, and what they say about it. They
/// are written as JSON lists, the form the API server lists objects in (the
/// agent reads JSON with serde_json, as its API source does).
pub struct ManifestsDir<'a> {
    pub node: &'a Node,
    pub dir: PathBuf,
}

impl ManifestsDir<'_> {
    fn write(&self, name: &str, content: &serde_json::Value) -> anyhow::Result<()> {
        self.node
            .host
            .write_file(&self.dir.join(name), content.to_string().as_bytes())
    }

    /// `n` services of one TCP port; the target (the last) on `servers`,
    /// the others on [`endpoints_per_service`] endpoints (`servers` first).
    /// The target is also a NodePort and has a UDP port, and its
    /// EndpointSlice has a file of its own ([`Self::write_target_slice`]) so
    /// that a change rewrites only it.
    pub fn write_all(&self, n: usize, servers: &[Ipv4Addr]) -> anyhow::Result<()> {
        let per = endpoints_per_service();
        let mut services = Vec::with_capacity(n);
        let mut slices = Vec::with_capacity(n);
        for i in 0..n {
            let (v, name) = (vip(i).to_string(), name(i));
            let last = i == n - 1;
            let mut ports = vec![serde_json::json!({"name": "http", "protocol": "TCP",
                "port": SERVICE_PORT, "targetPort": TCP_PORT})];
            if last {
                ports[0]["nodePort"] = NODE_PORT.into();
                ports.push(serde_json::json!({"name": "dns", "protocol": "UDP",
                    "port": UDP_SERVICE_PORT, "targetPort": UDP_PORT}));
            }
            services.push(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {"type": if last { "NodePort" } else { "ClusterIP" },
                    "clusterIP": v, "clusterIPs": [v], "ports": ports},
            }));
            if !last {
                let endpoints: Vec<Ipv4Addr> = servers
                    .iter()
                    .copied()
                    .chain((0..).map(|j| filler(i, j)))
                    .take(per.max(servers.len()))
                    .collect();
                slices.push(slice(&name, &endpoints, false));
            }
        }
        self.write_target_slice(n, servers)?;
        let node = self.node;
        self.write(
            "node.json",
            &serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-a"}, "spec": {"podCIDR": node.cluster_cidr},
                "status": {"addresses": [{"type": "InternalIP", "address": node.address.to_string()}]}}),
        )?;
        self.write("slices.json", &list(slices))?;
        self.write("services.json", &list(services))
    }

    /// The target service's EndpointSlice, with `servers` as its endpoints,
    /// written whole and moved into place (one event).
    pub fn write_target_slice(&self, n: usize, servers: &[Ipv4Addr]) -> anyhow::Result<()> {
        self.write(TARGET_SLICE, &slice(&name(n - 1), servers, true))
    }

    /// [`Self::write_target_slice`] written beside its place, under a name
    /// the agent does not read: (where it is, where it goes) on the node,
    /// for a worker there to move it at a moment the bench times.
    pub fn stage_target_slice(
        &self,
        n: usize,
        servers: &[Ipv4Addr],
    ) -> anyhow::Result<(String, String)> {
        let staged = format!("{TARGET_SLICE}.next");
        self.write(&staged, &slice(&name(n - 1), servers, true))?;
        let path = |name: &str| self.dir.join(name).to_string_lossy().into_owned();
        Ok((path(&staged), path(TARGET_SLICE)))
    }
}

const TARGET_SLICE: &str = "target-slice.json";

fn list(items: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

fn slice(name: &str, endpoints: &[Ipv4Addr], udp: bool) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|ip| {
            serde_json::json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                "nodeName": "node-a"})
        })
        .collect();
    let mut ports = vec![serde_json::json!({"name": "http", "protocol": "TCP", "port": TCP_PORT})];
    if udp {
        ports.push(serde_json::json!({"name": "dns", "protocol": "UDP", "port": UDP_PORT}));
    }
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
    })
}

/// The agent on a node, stopped on drop (its datapath stays, as a
/// kube-proxy's rules do).
pub struct Agent {
    child: Child,
    host: Host,
    pid: String,
    log: PathBuf,
}

impl Agent {
    /// `mode` as our configuration names it (`ebpf`, `nftables`, `iptables`);
    /// the socket hooks attached to `socket_lb_cgroup` (a path on the
    /// node) when given, else off; `datapath_args` are the datapath's own
    /// flags (the node's arguments win a flag both give).
    pub fn start(
        node: &Node,
        mode: &str,
        manifests: &Path,
        socket_lb_cgroup: Option<&str>,
        datapath_args: &[&str],
        services: usize,
    ) -> anyhow::Result<Self> {
        let work = Path::new(&node.work);
        // One log per scale: the last start of each is the one measured.
        let log = work.join(format!("agent-{mode}-{services}.log"));
        // The mode goes in the file: with --config, upstream (and we) ignore
        // the flags the file could set, --proxy-mode among them.
        let config = work.join(format!("config-{mode}.yaml"));
        node.host.write_file(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\nclusterCIDR: {}\nmetricsBindAddress: {}:{METRICS_PORT}\n",
                node.cluster_cidr, node.address
            )
            .as_bytes(),
        )?;
        // At least warn: the check of the mode needs the flags-ignored warning.
        let rust_log = std::env::var("E2E_AGENT_LOG").unwrap_or_else(|_| "warn".into());
        let mut args: Vec<String> = vec![
            "-c".into(),
            r#"log=$1; shift; echo $$; exec "$@" 2>"$log""#.into(),
            "sh".into(),
            log.to_string_lossy().into_owned(),
            "env".into(),
            format!("RUST_LOG={rust_log}"),
            node.agent.clone(),
            "--hostname-override=node-a".into(),
            format!("--manifests={}", manifests.display()),
            format!("--config={}", config.display()),
            format!("--ebpf-state-dir={}", work.join("state").display()),
        ];
        match socket_lb_cgroup {
            Some(cgroup) => args.extend([
                "--ebpf-socket-lb=true".into(),
                format!("--ebpf-socket-lb-cgroup-path={cgroup}"),
            ]),
            None => args.push("--ebpf-socket-lb=false".into()),
        }
        args.extend(interface_flags(node));
        // The defaults hold 50,000 services of 10 endpoints (a frontend and
        // a marker each in SERVICES, 12 slots each in SLOTS); larger runs
        // get larger maps unless the node's arguments size them.
        let wanted = [
            ("--ebpf-map-size-services", services * 2, 262_144),
            (
                "--ebpf-map-size-backend-slots",
                services * endpoints_per_service().div_ceil(4) * 4,
                1_048_576,
            ),
        ];
        for (flag, needed, default) in wanted {
            if mode == "ebpf"
                && needed > default
                && !node.agent_args.iter().any(|a| a.starts_with(flag))
            {
                args.push(format!("{flag}={}", needed.next_power_of_two()));
            }
        }
        let flag_of = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
        args.extend(
            datapath_args
                .iter()
                .filter(|a| !node.agent_args.iter().any(|n| flag_of(n) == flag_of(a)))
                .map(|a| a.to_string()),
        );
        args.extend(node.agent_args.iter().cloned());
        let mut command = node.host.command("sh", &args);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_this_process(&mut command);
        let mut child = command.spawn().context("starting proxy-agent")?;
        let mut pid = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut pid)?;
        let pid = pid.trim().to_owned();
        anyhow::ensure!(
            pid.parse::<u32>().is_ok(),
            "starting proxy-agent on {}: no pid ({pid:?})",
            node.host.describe()
        );
        Ok(Self {
            child,
            host: node.host.clone(),
            pid,
            log,
        })
    }

    /// The agent's process id on its node.
    pub fn pid(&self) -> &str {
        &self.pid
    }

    /// The local end (the agent itself, or the ssh that runs it) is alive.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the agent's process (SIGSTOP) until the guard is dropped
    /// (SIGCONT): its datapath goes on working, its control plane (a rule
    /// mode's periodic resync takes seconds of CPU at 10,000 services)
    /// does not run while another datapath is measured.
    pub fn pause(&self) -> anyhow::Result<Paused> {
        self.host
            .output("kill", &["-STOP", &self.pid])
            .context("pausing an agent")?;
        Ok(Paused {
            host: self.host.clone(),
            pid: self.pid.clone(),
        })
    }

    pub fn log_text(&self) -> String {
        self.host
            .output("cat", &[&self.log.to_string_lossy()])
            .unwrap_or_default()
    }
}

/// The flags that name the node's interfaces, as its description gives them.
fn interface_flags(node: &Node) -> Vec<String> {
    let mut flags = Vec::new();
    if !node.pod_interfaces.is_empty() {
        flags.push(format!(
            "--ebpf-pod-interface-prefixes={}",
            node.pod_interfaces.join(",")
        ));
    }
    if !node.external_interfaces.is_empty() {
        flags.push(format!(
            "--ebpf-external-interfaces={}",
            node.external_interfaces.join(",")
        ));
    }
    flags
}

/// Everything any mode left on the node removed (`--cleanup`), so that the
/// next datapath starts on a bare node.
pub fn cleanup(node: &Node) -> anyhow::Result<()> {
    let state = format!(
        "--ebpf-state-dir={}",
        Path::new(&node.work).join("state").display()
    );
    node.host
        .output(&node.agent, &["--cleanup", &state])
        .map(drop)
        .context("proxy-agent --cleanup")
}

/// A paused agent, resumed on drop.
pub struct Paused {
    host: Host,
    pid: String,
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.host.output("kill", &["-CONT", &self.pid]);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.host.output("kill", &[&self.pid]);
        // A paused agent acts on the signal only once it runs again.
        let _ = self.host.output("kill", &["-CONT", &self.pid]);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
