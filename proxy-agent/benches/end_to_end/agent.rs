//! The services the bench generates, and the agent that programs them in a
//! testbed's node namespace.

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::Context as _;

use super::workloads::{TCP_PORT, UDP_PORT};

pub const SERVICE_PORT: u16 = 80;
pub const UDP_SERVICE_PORT: u16 = 53;
pub const NODE_PORT: u16 = 30080;

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

/// `n` services of one TCP port on `servers`, in `dir`; the last one is also
/// a NodePort and has a UDP port, and its EndpointSlice has a file of its
/// own ([`write_target_slice`]) so that a change rewrites only it.
pub fn write_manifests(dir: &Path, n: usize, servers: &[Ipv4Addr]) -> anyhow::Result<()> {
    fs::create_dir_all(dir)?;
    let mut services = String::new();
    let mut slices = String::new();
    for i in 0..n {
        let (v, name) = (vip(i), name(i));
        let last = i == n - 1;
        let (kind, node_port, udp) = if last {
            (
                "NodePort",
                format!(", nodePort: {NODE_PORT}"),
                format!(
                    ", {{name: dns, protocol: UDP, port: {UDP_SERVICE_PORT}, targetPort: {UDP_PORT}}}"
                ),
            )
        } else {
            ("ClusterIP", String::new(), String::new())
        };
        let _ = write!(
            services,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench}}\nspec:\n  type: {kind}\n  clusterIP: {v}\n  clusterIPs: [{v}]\n  ports: [{{name: http, protocol: TCP, port: {SERVICE_PORT}, targetPort: {TCP_PORT}{node_port}}}{udp}]\n"
        );
        if !last {
            slices.push_str(&slice(&name, servers, false));
        }
    }
    fs::write(dir.join("services.yaml"), services)?;
    fs::write(dir.join("slices.yaml"), slices)?;
    write_target_slice(dir, n, servers)?;
    fs::write(
        dir.join("node.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec: {podCIDR: 198.18.1.0/24}\nstatus:\n  addresses: [{type: InternalIP, address: 198.18.100.1}]\n",
    )?;
    Ok(())
}

/// The target service's EndpointSlice, with `servers` as its endpoints,
/// written whole to a temporary file and moved into place (one event).
pub fn write_target_slice(dir: &Path, n: usize, servers: &[Ipv4Addr]) -> anyhow::Result<()> {
    let tmp = dir.join(".target-slice.tmp");
    fs::write(&tmp, slice(&name(n - 1), servers, true))?;
    fs::rename(&tmp, dir.join("target-slice.yaml"))?;
    Ok(())
}

fn slice(name: &str, servers: &[Ipv4Addr], udp: bool) -> String {
    let endpoints: String = servers
        .iter()
        .map(|ip| {
            format!(
                "  - addresses: ['{ip}']\n    conditions: {{ready: true}}\n    nodeName: node-a\n"
            )
        })
        .collect();
    let udp = if udp {
        format!(", {{name: dns, protocol: UDP, port: {UDP_PORT}}}")
    } else {
        String::new()
    };
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, protocol: TCP, port: {TCP_PORT}}}{udp}]\nendpoints:\n{endpoints}"
    )
}

/// The agent in a node namespace, killed (its rules stay with the namespace) on drop.
pub struct Agent {
    child: Child,
    pub log: PathBuf,
}

impl Agent {
    /// `mode` as our configuration names it (`ebpf`, `nftables`, `iptables`);
    /// the socket hooks attached to `socket_lb_cgroup` when given, else off.
    pub fn start(
        ns: &str,
        mode: &str,
        manifests: &Path,
        work: &Path,
        socket_lb_cgroup: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let log = work.join(format!("agent-{ns}.log"));
        // The mode goes in the file: with --config, upstream (and we) ignore
        // the flags the file could set, --proxy-mode among them.
        let config = work.join(format!("config-{ns}.yaml"));
        fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\nclusterCIDR: 198.18.1.0/24\n"
            ),
        )?;
        let mut socket_lb = vec![OsString::from("--ebpf-socket-lb=false")];
        if let Some(cgroup) = socket_lb_cgroup {
            socket_lb = vec![
                "--ebpf-socket-lb=true".into(),
                "--ebpf-socket-lb-cgroup-path".into(),
                cgroup.into(),
            ];
        }
        let child = Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_proxy-agent")])
            .args(["--hostname-override", "node-a", "--manifests"])
            .arg(manifests)
            .arg("--config")
            .arg(&config)
            .args(socket_lb)
            .arg(format!(
                "--ebpf-state-dir={}",
                work.join(format!("state-{ns}")).display()
            ))
            // At least warn: the check of the mode needs the flags-ignored warning.
            .env(
                "RUST_LOG",
                std::env::var("E2E_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .context("starting proxy-agent")?;
        Ok(Self { child, log })
    }

    /// Resident memory in MB (`ip netns exec` execs the agent: same pid).
    pub fn rss_mb(&self) -> Option<f64> {
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

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
