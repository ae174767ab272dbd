//! Where the bench's roles run: a host is a command prefix (`ssh root@node`
//! on real machines, `ip netns exec <ns>` in a testbed) and the path of this
//! bench's binary there, which serves as the workloads' worker. Bare-metal
//! runs read the hosts and interfaces from a YAML file (`E2E_HOSTS`).

use std::{
    io::Write as _,
    net::Ipv4Addr,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail, ensure};
use serde::Deserialize;

/// A machine (or namespace) the bench runs commands on.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// The command prefix that runs a program there.
    pub run: Vec<String>,
    /// This bench's binary there; by default the path it has here.
    #[serde(default)]
    pub bench: Option<String>,
}

impl Host {
    /// Namespace `ns` of this machine, reached through the `via` prefix
    /// (none, or an ssh to this machine to rehearse a remote run).
    pub fn netns(via: &[String], ns: &str) -> Self {
        let mut run = via.to_vec();
        run.extend(["ip", "netns", "exec", ns].map(String::from));
        Self { run, bench: None }
    }

    /// `program args…` run there. ssh hands its remote command to a shell,
    /// so through it every word is quoted for one.
    pub fn command<S: AsRef<str>>(&self, program: &str, args: &[S]) -> Command {
        let mut c = Command::new(&self.run[0]);
        c.args(&self.run[1..]);
        let words = std::iter::once(program).chain(args.iter().map(AsRef::as_ref));
        if self.through_a_shell() {
            c.args(words.map(shell_quote));
        } else {
            c.args(words);
        }
        c
    }

    fn through_a_shell(&self) -> bool {
        self.run
            .iter()
            .any(|w| Path::new(w).file_name().is_some_and(|n| n == "ssh"))
    }

    pub fn describe(&self) -> String {
        self.run.join(" ")
    }

    /// Runs `program args…` there: its standard output.
    pub fn output(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(program, args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} {program}", self.describe()))?;
        if !out.status.success() {
            bail!(
                "{} {program} {}: {}",
                self.describe(),
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes `content` to `path` there, whole: a temporary file moved into
    /// place, so a reader watching the directory sees one change.
    pub fn write_file(&self, path: &Path, content: &[u8]) -> anyhow::Result<()> {
        let mut child = self
            .command(
                "sh",
                &[
                    "-c",
                    r#"mkdir -p "$(dirname "$1")" && cat > "$1.tmp" && mv "$1.tmp" "$1""#,
                    "sh",
                    &path.to_string_lossy(),
                ],
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("writing {} on {}", path.display(), self.describe()))?;
        child.stdin.take().expect("piped").write_all(content)?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "writing {} on {}: {}",
            path.display(),
            self.describe(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    pub fn bench_binary(&self) -> anyhow::Result<String> {
        match &self.bench {
            Some(b) => Ok(b.clone()),
            None => Ok(std::env::current_exe()
                .context("this bench's path")?
                .to_string_lossy()
                .into_owned()),
        }
    }
}

/// `word` as one word for a POSIX shell.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A server: where it runs and the address clients reach it at.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "ServerFields")]
pub struct Server {
    pub host: Host,
    pub ip: Ipv4Addr,
}

// serde's `flatten` would accept unknown fields: the fields spelled out.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFields {
    run: Vec<String>,
    #[serde(default)]
    bench: Option<String>,
    ip: Ipv4Addr,
}

impl From<ServerFields> for Server {
    fn from(f: ServerFields) -> Self {
        Self {
            host: Host {
                run: f.run,
                bench: f.bench,
            },
            ip: f.ip,
        }
    }
}

/// The node: where the agent runs, and what it is told about the machine.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "NodeFields")]
pub struct Node {
    pub host: Host,
    /// The agent's binary there.
    pub agent: String,
    /// A directory there for the manifests, the configuration and the log.
    pub work: String,
    /// The node's address the outside client goes to for the NodePort.
    pub address: Ipv4Addr,
    /// The pods' (here: the ClusterIP client's and the servers') range.
    pub cluster_cidr: String,
    /// Interfaces the ClusterIP client's traffic arrives on (the ebpf
    /// mode's pod-side programs attach there).
    pub pod_interfaces: Vec<String>,
    /// Interfaces outside traffic arrives on (XDP and the external programs).
    pub external_interfaces: Vec<String>,
    /// More flags for every agent started there.
    pub agent_args: Vec<String>,
    /// The cgroup v2 directory there the socket hooks attach to for the
    /// `ebpf-socket` datapath (its client runs on the node, in it).
    pub socket_lb_cgroup: Option<String>,
}

/// [`Node`] as the file spells it (see [`ServerFields`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFields {
    run: Vec<String>,
    #[serde(default)]
    bench: Option<String>,
    agent: String,
    work: String,
    address: Ipv4Addr,
    cluster_cidr: String,
    #[serde(default)]
    pod_interfaces: Vec<String>,
    #[serde(default)]
    external_interfaces: Vec<String>,
    #[serde(default)]
    agent_args: Vec<String>,
    #[serde(default)]
    socket_lb_cgroup: Option<String>,
}

impl From<NodeFields> for Node {
    fn from(f: NodeFields) -> Self {
        Self {
            host: Host {
                run: f.run,
                bench: f.bench,
            },
            agent: f.agent,
            work: f.work,
            address: f.address,
            cluster_cidr: f.cluster_cidr,
            pod_interfaces: f.pod_interfaces,
            external_interfaces: f.external_interfaces,
            agent_args: f.agent_args,
            socket_lb_cgroup: f.socket_lb_cgroup,
        }
    }
}

/// A bare-metal run's machines (`E2E_HOSTS`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    pub node: Node,
    /// The ClusterIP client ("pod"): routes the service range
    /// (198.19.0.0/16) and the servers through the node.
    pub client: Host,
    /// The NodePort client.
    pub external: Host,
    /// Three servers: the first two serve every service, the third is the
    /// endpoint the changes add.
    pub servers: Vec<Server>,
}

impl HostsFile {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("E2E_HOSTS: reading {}", path.display()))?;
        let de = serde_yaml::Deserializer::from_str(&text);
        let hosts: Self = serde_path_to_error::deserialize(de)
            .map_err(|e| anyhow::anyhow!("E2E_HOSTS {}: {e}", path.display()))?;
        hosts
            .check()
            .with_context(|| format!("E2E_HOSTS {}", path.display()))?;
        Ok(hosts)
    }

    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.servers.len() == 3,
            "servers: three are needed (two serve, the endpoint changes add the third), {} given",
            self.servers.len()
        );
        let hosts = [
            ("node", &self.node.host),
            ("client", &self.client),
            ("external", &self.external),
        ]
        .into_iter()
        .chain(self.servers.iter().map(|s| ("servers", &s.host)));
        for (role, host) in hosts {
            ensure!(
                !host.run.is_empty(),
                "{role}.run: a command prefix is needed (e.g. [ssh, root@host])"
            );
        }
        self.node
            .cluster_cidr
            .parse::<ipnet::Ipv4Net>()
            .with_context(|| format!("node.cluster_cidr: {:?}", self.node.cluster_cidr))?;
        Ok(())
    }
}
