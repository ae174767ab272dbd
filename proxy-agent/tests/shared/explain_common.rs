//! Shared by the explain tests of the kernel tier (offline: `proxy-agent
//! explain --manifests`) and of the e2e tier (`--online`, against a running
//! agent in a testbed node): the cluster's manifests, the probe flags and the
//! checks on explain's output.
//!
//! Addresses match the two-node testbed (`testbed::cluster`): node A
//! 198.18.0.1 with pods in 198.18.1.0/24, node B 198.18.0.2 with pods in
//! 198.18.2.0/24, the external client 198.18.0.100.
#![allow(dead_code)] // each tier uses its own subset

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::{Command, Output},
};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");
pub const BACKEND_PORT: u16 = 8080;

pub const NODE_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const NODE_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
pub const DENIED: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
/// A pod on node A that is no endpoint of anything.
pub const POD_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);
pub const WEB_A: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
pub const WEB_B: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
pub const TRIO: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 1, 21),
    Ipv4Addr::new(198, 18, 2, 21),
    Ipv4Addr::new(198, 18, 2, 22),
];

pub const REMOTE_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
pub const REMOTE_NODEPORT: u16 = 30080;
pub const REMOTE_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 20);
pub const REMOTE_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 30);
pub const LOCAL_NODEPORT: u16 = 30081;
pub const LOCAL_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 21);
pub const LOCAL_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 31);
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 12);
pub const EMPTY_NODEPORT: u16 = 30082;
pub const EMPTY_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 22);
pub const EMPTY_EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 32);
pub const RANGED_NODEPORT: u16 = 30083;
pub const RANGED_LB: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 23);
pub const HERE_NODEPORT: u16 = 30085;
pub const TRIO_VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 20);

fn node_yaml(name: &str, ip: Ipv4Addr, pod_cidr: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec: {{podCIDR: {pod_cidr}, podCIDRs: [{pod_cidr}]}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {ip}}}\n    - {{type: Hostname, address: {name}}}\n"
    )
}

struct Svc<'a> {
    name: &'a str,
    cluster_ip: Ipv4Addr,
    node_port: Option<u16>,
    local: bool,
    lb: Option<Ipv4Addr>,
    external_ip: Option<Ipv4Addr>,
    ranges: &'a [&'a str],
    endpoints: &'a [(Ipv4Addr, &'a str)],
}

impl Svc<'_> {
    fn yaml(&self) -> String {
        let kind = match (self.lb, self.node_port) {
            (Some(_), _) => "LoadBalancer",
            (None, Some(_)) => "NodePort",
            (None, None) => "ClusterIP",
        };
        let ip = self.cluster_ip;
        let mut s = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: e2e}}\nspec:\n  type: {kind}\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n",
            self.name
        );
        if kind != "ClusterIP" {
            let policy = if self.local { "Local" } else { "Cluster" };
            s.push_str(&format!("  externalTrafficPolicy: {policy}\n"));
        }
        let np = self
            .node_port
            .map(|p| format!(", nodePort: {p}"))
            .unwrap_or_default();
        s.push_str(&format!(
            "  ports:\n    - {{name: tcp, protocol: TCP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n    - {{name: udp, protocol: UDP, port: 80, targetPort: {BACKEND_PORT}{np}}}\n"
        ));
        if let Some(ip) = self.external_ip {
            s.push_str(&format!("  externalIPs: [{ip}]\n"));
        }
        if !self.ranges.is_empty() {
            s.push_str(&format!(
                "  loadBalancerSourceRanges: [{}]\n",
                self.ranges.join(", ")
            ));
        }
        if let Some(ip) = self.lb {
            s.push_str(&format!(
                "status:\n  loadBalancer:\n    ingress: [{{ip: {ip}}}]\n"
            ));
        }
        s
    }

    fn slice_yaml(&self) -> String {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {0}-1\n  namespace: e2e\n  labels: {{kubernetes.io/service-name: {0}}}\naddressType: IPv4\nports:\n  - {{name: tcp, protocol: TCP, port: {BACKEND_PORT}}}\n  - {{name: udp, protocol: UDP, port: {BACKEND_PORT}}}\n",
            self.name
        );
        if self.endpoints.is_empty() {
            s.push_str("endpoints: []\n");
        } else {
            s.push_str("endpoints:\n");
        }
        for (ip, node) in self.endpoints {
            s.push_str(&format!(
                "  - addresses: [{ip}]\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
            ));
        }
        s
    }
}

pub const CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: NodeCIDR\n";

/// Writes the cluster's Nodes, Services and EndpointSlices into `dir`.
pub fn write_manifests(dir: &Path) {
    let write = |file: &str, text: String| fs::write(dir.join(file), text).unwrap();
    write(
        "nodes.yaml",
        format!(
            "{}---\n{}",
            node_yaml("node-a", NODE_A, "198.18.1.0/24"),
            node_yaml("node-b", NODE_B, "198.18.2.0/24")
        ),
    );
    let on_b: &[(Ipv4Addr, &str)] = &[(WEB_B, "node-b")];
    let trio: Vec<(Ipv4Addr, &str)> = vec![
        (TRIO[0], "node-a"),
        (TRIO[1], "node-b"),
        (TRIO[2], "node-b"),
    ];
    let base = Svc {
        name: "",
        cluster_ip: Ipv4Addr::UNSPECIFIED,
        node_port: None,
        local: false,
        lb: None,
        external_ip: None,
        ranges: &[],
        endpoints: &[],
    };
    let services = [
        Svc {
            name: "remote",
            cluster_ip: REMOTE_VIP,
            node_port: Some(REMOTE_NODEPORT),
            lb: Some(REMOTE_LB),
            external_ip: Some(REMOTE_EXTERNAL_IP),
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "local",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 11),
            node_port: Some(LOCAL_NODEPORT),
            local: true,
            lb: Some(LOCAL_LB),
            external_ip: Some(LOCAL_EXTERNAL_IP),
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "empty",
            cluster_ip: EMPTY_VIP,
            node_port: Some(EMPTY_NODEPORT),
            lb: Some(EMPTY_LB),
            external_ip: Some(EMPTY_EXTERNAL_IP),
            ..base
        },
        Svc {
            name: "ranged",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 13),
            node_port: Some(RANGED_NODEPORT),
            lb: Some(RANGED_LB),
            ranges: &["198.18.0.100/32"],
            endpoints: on_b,
            ..base
        },
        Svc {
            name: "here",
            cluster_ip: Ipv4Addr::new(198, 19, 0, 15),
            node_port: Some(HERE_NODEPORT),
            local: true,
            endpoints: &[(WEB_A, "node-a"), (WEB_B, "node-b")],
            ..base
        },
        Svc {
            name: "trio",
            cluster_ip: TRIO_VIP,
            endpoints: &trio,
            ..base
        },
    ];
    for svc in &services {
        write(&format!("{}-svc.yaml", svc.name), svc.yaml());
        write(&format!("{}-slice.yaml", svc.name), svc.slice_yaml());
    }
}

/// The packet flags for `proto src:40000 -> dst:dport` from `from`.
pub fn packet(proto: &str, src: Ipv4Addr, dst: Ipv4Addr, dport: u16, from: &str) -> Vec<String> {
    [
        "--proto",
        proto,
        "--src",
        &src.to_string(),
        "--dst",
        &dst.to_string(),
        "--dport",
        &dport.to_string(),
        "--from",
        from,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

pub fn endpoint(ip: Ipv4Addr) -> String {
    SocketAddrV4::new(ip, BACKEND_PORT).to_string()
}

pub fn source_of(v: &Value) -> SocketAddrV4 {
    v["source"].as_str().unwrap().parse().unwrap()
}

#[track_caller]
pub fn assert_forwarded(v: &Value, to: Ipv4Addr, masqueraded: bool) {
    assert_eq!(v["verdict"], "forwarded", "{v:#}");
    assert_eq!(v["endpoint"], endpoint(to).as_str(), "{v:#}");
    assert_eq!(v["masqueraded"], masqueraded, "{v:#}");
    assert_eq!(v["flow"], "new", "{v:#}");
}

#[track_caller]
pub fn assert_one_line_error(out: &Output, starts: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(&format!("error: {starts}")),
        "expected `error: {starts}...`, got {stderr}"
    );
}

/// A manifests directory and a KubeProxyConfiguration, and `proxy-agent
/// explain` offline against them as node A.
pub struct Offline {
    pub dir: tempfile::TempDir,
}

impl Offline {
    /// The cluster of [`write_manifests`] with [`CONFIG`].
    pub fn new() -> Self {
        Self::with(write_manifests, CONFIG)
    }

    /// Manifests written by `write` into the directory, and `config`.
    pub fn with(write: impl FnOnce(&Path), config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path());
        fs::write(dir.path().join("config.cfg"), config).unwrap();
        Offline { dir }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("explain")
            .arg("--manifests")
            .arg(self.dir.path())
            .arg("--config")
            .arg(self.dir.path().join("config.cfg"))
            .args(["--hostname-override", "node-a"])
            .args(args)
            .output()
            .expect("running proxy-agent explain")
    }

    pub fn text(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "explain {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let text = self.text(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}

/// Whether `port` is a source port the node's masqueraded flows take: the
/// runs the agent derives from this machine's ephemeral port range.
pub fn is_masquerade_port(port: u16) -> bool {
    use proxy_agent::modes::ebpf::node;
    let ephemeral = node::read_ephemeral_range().expect("read net.ipv4.ip_local_port_range");
    node::masquerade_port_ranges(ephemeral)
        .iter()
        .any(|&(low, high)| low != 0 && (low..=high).contains(&port))
}
