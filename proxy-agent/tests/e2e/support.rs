#![allow(dead_code)] // the e2e modules use different parts
//! Shared by the end-to-end tests: running the real agent binary inside a
//! testbed's node namespace.

pub use testbed::cgroup::TestCgroup;

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// The agent process, started with `--manifests DIR` in namespace `ns`;
/// SIGTERMed (then killed) on drop so no test leaves it running. Its socket
/// hooks attach to a cgroup of its own, never the root, unless the test
/// names one or turns them off; its names file goes beside its log.
pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
    pub cgroup: Option<TestCgroup>,
}

impl Agent {
    pub fn start(ns: &str, manifests: &Path, log: PathBuf) -> Self {
        Self::start_as(ns, "node-a", manifests, log, &[])
    }

    /// Runs the agent as node `node` with `extra` flags appended.
    pub fn start_as(ns: &str, node: &str, manifests: &Path, log: PathBuf, extra: &[&str]) -> Self {
        Self::start_with_env(ns, node, manifests, log, extra, &[])
    }

    /// Like [`Agent::start_as`], with extra environment variables.
    pub fn start_with_env(
        ns: &str,
        node: &str,
        manifests: &Path,
        log: PathBuf,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        let log_file = fs::File::create(&log).unwrap();
        let chosen = |a: &&&str| {
            a.starts_with("--ebpf-socket-lb-cgroup-path") || a.starts_with("--ebpf-socket-lb=")
        };
        let cgroup = (!extra.iter().any(|a| chosen(&a)))
            .then(|| TestCgroup::new("agent").expect("a cgroup for the agent's socket hooks"));
        // The names file goes beside the log, never to the host's /run.
        let state_flag = (!extra.iter().any(|a| a.starts_with("--ebpf-state-dir")))
            .then(|| format!("--ebpf-state-dir={}", log.with_extension("state").display()));
        let cgroup_flag = cgroup.as_ref().map(|c| {
            format!(
                "--ebpf-socket-lb-cgroup-path={}",
                c.seen_from_other_mount_namespaces().display()
            )
        });
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                env!("CARGO_BIN_EXE_proxy-agent"),
                "--hostname-override",
                node,
                "--manifests",
            ])
            .arg(manifests)
            .args(extra)
            .args(cgroup_flag)
            .args(state_flag)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("starting proxy-agent");
        Self {
            child: Some(child),
            log,
            cgroup,
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the ebpf agent's first sync to report its packet programs
    /// verified and attached (traffic through one interface can pass
    /// before the attachments to the others are logged).
    pub fn wait_programs_attached(&self) {
        wait_for(
            Duration::from_secs(30),
            "the packet programs attached",
            || {
                self.log_text()
                    .contains("packet programs verified and attached")
                    .then_some(())
            },
        );
        // The first sync reports done only once they are attached.
        let log = self.log_text();
        let attached = log.find("attached tc_from").expect("an attachment logged");
        let synced = log.find("datapath synced").expect("a sync logged");
        assert!(
            attached < synced,
            "the first sync reported done before the programs were attached\n{log}"
        );
    }

    /// The exit status once the agent has exited on its own.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("agent running");
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("agent ignored SIGTERM for 10s; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Agent {
    /// `kill -9`: the agent gets no chance to clean anything up.
    pub fn kill(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("agent running");
        let _ = child.kill();
        child.wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Node A of the explain/inspect/monitor scene (`explain_common::write_manifests`:
/// web-a and client-a on node A, web-b on node B, identity servers on the
/// backends, the client's second address 198.18.0.101), its agent's maps pinned
/// on a bpffs of the test's own and its names published in `state_dir`.
/// Returns once a NodePort answers the second address (the client's main
/// address is left to the test) and the names are published.
pub struct PinnedScene {
    // Dropped in this order: the agent before its pins, the namespaces last.
    pub agent: Agent,
    _servers: [testbed::servers::IdentityServer; 2],
    _bpffs: crate::cleanup_common::BpfFs,
    pub dir: tempfile::TempDir,
    pub pin_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Node A's namespace, where the agent and the subcommands run.
    pub ns: String,
    pub client_ns: String,
    pub client_a: testbed::Pod,
    pub cluster: testbed::cluster::Cluster,
}

impl PinnedScene {
    pub fn start() -> Self {
        use crate::explain_common::*;
        use testbed::cluster::{Cluster, NodeId};
        let mut cluster = Cluster::new().unwrap();
        let web_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
        let client_a = cluster.add_pod(NodeId::A, "client-a").unwrap();
        let web_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
        assert_eq!((web_a.ip, client_a.ip, web_b.ip), (WEB_A, POD_A, WEB_B));
        cluster.client_add_address("198.18.0.101/24").unwrap();
        let servers = [
            testbed::servers::IdentityServer::start(&web_a.ns, "web-a", BACKEND_PORT).unwrap(),
            testbed::servers::IdentityServer::start(&web_b.ns, "web-b", BACKEND_PORT).unwrap(),
        ];
        let ns = cluster.node(NodeId::A).ns.clone();
        let client_ns = cluster.client().ns.clone();
        let dir = tempfile::tempdir().unwrap();
        write_manifests(dir.path());
        let state_dir = dir.path().join("state");
        let bpffs = crate::cleanup_common::BpfFs::new();
        let root = bpffs.dir.join("kube-ebpf-proxy");
        let pin_dir = root.join(format!("v{}/maps", proxy_common::ABI_VERSION));
        let agent = Agent::start_as(
            &ns,
            "node-a",
            dir.path(),
            dir.path().join("agent.log"),
            &[
                "--detect-local-mode",
                "NodeCIDR",
                "--ebpf-pin-root",
                root.to_str().unwrap(),
                "--ebpf-state-dir",
                state_dir.to_str().unwrap(),
                "--ebpf-detach-on-exit",
                // `auto` leaves a veth to TC: the scene's outside traffic
                // is to go through xdp_from_netdev.
                "--ebpf-xdp-mode",
                "generic",
            ],
        );
        let probe = std::net::Ipv4Addr::new(198, 18, 0, 101);
        wait_for(Duration::from_secs(30), "the NodePort to answer", || {
            let target = std::net::SocketAddrV4::new(NODE_A, REMOTE_NODEPORT);
            testbed::clients::tcp_connect_outcome(
                &client_ns,
                Some(probe),
                target,
                Duration::from_millis(800),
            )
            .identity()
            .map(|_| ())
        });
        agent.wait_programs_attached();
        // Published right after the sync that programmed the maps.
        wait_for(Duration::from_secs(5), "the names to be published", || {
            state_dir
                .join("datapath-names.json")
                .is_file()
                .then_some(())
        });
        PinnedScene {
            agent,
            _servers: servers,
            _bpffs: bpffs,
            dir,
            pin_dir,
            state_dir,
            ns,
            client_ns,
            client_a,
            cluster,
        }
    }
}
