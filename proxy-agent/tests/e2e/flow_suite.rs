//! One flow suite for every mode: a table of packet flows, each a service
//! set-up, a connection and the expected outcome (forwarded to one of the
//! endpoints with or without masquerade, dropped, rejected, or untouched),
//! run against the ebpf mode through the real programs (`explain`'s
//! offline form: BPF_PROG_TEST_RUN and the socket hook), against the
//! nftables and iptables modes through real TCP connections across
//! namespaces whose node the agent's own proxier programmed from the same
//! manifests and configuration, and against the ipvs mode (no IPVS in these
//! kernels) through what its proxier would write: the virtual servers and
//! ipsets, read the way its iptables rules and IPVS read them. Where upstream's own modes differ, the row
//! records which mode expects what (the closing note of issue 13 lists them).
//!
//! The topology (addresses from 198.18.0.0/15): a node (198.18.0.2 toward
//! outside, 198.18.10.1 toward its pods, 198.18.180.254 toward the endpoint
//! hosts, a default route to a catch-all namespace); a pod (198.18.10.2);
//! two outside clients (198.18.0.100, 198.18.0.101); the endpoints
//! 198.18.180.1-3 listening on 8080; the catch-all, which holds every
//! service address (and 198.18.60.0/24) as its own and so shows traffic
//! the node left untouched.
//! Needs root.

use std::{
    collections::BTreeSet,
    fs,
    io::ErrorKind,
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use proxy_agent::{
    cli::{
        emit::{self, EmitArgs, EmitMode},
        explain::{
            args::{Args, Offline, Output, Source},
            probe::{Origin, Probe, Proto},
        },
    },
    modes::{
        iptables::proxier::IptablesProxier,
        nftables::proxier::{NftSettings, NftablesProxier},
    },
    sync::{Proxier, SyncChanges},
};
use serde_json::Value;
use testbed::{cleanup, netns};

const NODE: &str = "198.18.0.2";
const POD: &str = "198.18.10.2";
const CLIENT: &str = "198.18.0.100";
const DENIED: &str = "198.18.0.101";
const VIP: &str = "198.19.0.41";
const LB_IP: &str = "198.18.50.1";
const EMPTY_VIP: &str = "198.19.0.42";
const LOCAL_VIP: &str = "198.19.0.43";
const ENDPOINTS: [&str; 3] = ["198.18.180.1", "198.18.180.2", "198.18.180.3"];
const NODE_PORT: u16 = 3001;
const LOCAL_NODE_PORT: u16 = 3002;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ebpf,
    Nftables,
    Iptables,
    Ipvs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum From {
    Pod,
    Outside,
    Denied,
    Node,
}

/// What a flow comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Reached one of these endpoints; `masq`: with another source address.
    Forwarded {
        endpoints: BTreeSet<String>,
        masq: bool,
    },
    Dropped,
    Rejected,
    /// Reached its original destination, untranslated.
    Untouched,
}

fn forwarded(endpoints: &[&str], masq: bool) -> Outcome {
    Outcome::Forwarded {
        endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
        masq,
    }
}

struct Flow {
    name: &'static str,
    from: From,
    dst: &'static str,
    dport: u16,
    expect: Outcome,
    /// Modes where upstream itself expects otherwise, and what.
    differs: Vec<(Mode, Outcome)>,
}

fn flows() -> Vec<Flow> {
    let all = &ENDPOINTS[..2];
    vec![
        Flow {
            name: "pod to cluster IP",
            from: From::Pod,
            dst: VIP,
            dport: 80,
            expect: forwarded(all, false),
            differs: vec![],
        },
        Flow {
            name: "outside to cluster IP",
            from: From::Outside,
            dst: VIP,
            dport: 80,
            expect: forwarded(all, true),
            differs: vec![],
        },
        Flow {
            name: "node to cluster IP",
            from: From::Node,
            dst: VIP,
            dport: 80,
            // Masqueraded to the node's address toward the endpoint, as upstream.
            expect: forwarded(all, true),
            // The socket hook connects the node's socket to the endpoint
            // itself: it leaves from that same address, untranslated.
            differs: vec![(Mode::Ebpf, forwarded(all, false))],
        },
        Flow {
            name: "outside to NodePort",
            from: From::Outside,
            dst: NODE,
            dport: NODE_PORT,
            expect: forwarded(all, true),
            differs: vec![],
        },
        Flow {
            name: "pod to NodePort",
            from: From::Pod,
            dst: NODE,
            dport: NODE_PORT,
            expect: forwarded(all, true),
            differs: vec![],
        },
        Flow {
            name: "outside to LB IP, source allowed",
            from: From::Outside,
            dst: LB_IP,
            dport: 80,
            expect: forwarded(all, true),
            differs: vec![],
        },
        Flow {
            name: "outside to LB IP, source not allowed",
            from: From::Denied,
            dst: LB_IP,
            dport: 80,
            expect: Outcome::Dropped,
            differs: vec![],
        },
        Flow {
            name: "pod to another port of a cluster IP",
            from: From::Pod,
            dst: VIP,
            dport: 81,
            expect: Outcome::Rejected,
            // upstream's iptables mode has no rule for it: routed on, untouched.
            differs: vec![(Mode::Iptables, Outcome::Untouched)],
        },
        Flow {
            name: "pod to a service without endpoints",
            from: From::Pod,
            dst: EMPTY_VIP,
            dport: 80,
            expect: Outcome::Rejected,
            differs: vec![],
        },
        Flow {
            name: "outside to eTP Local NodePort with a local endpoint",
            from: From::Outside,
            dst: NODE,
            dport: LOCAL_NODE_PORT,
            expect: forwarded(&ENDPOINTS[2..], false),
            differs: vec![],
        },
        Flow {
            name: "pod to eTP Local cluster IP",
            from: From::Pod,
            dst: LOCAL_VIP,
            dport: 80,
            expect: forwarded(&ENDPOINTS[1..], false),
            differs: vec![],
        },
        Flow {
            name: "outside to an address no service holds",
            from: From::Outside,
            dst: "198.18.60.1",
            dport: 80,
            expect: Outcome::Untouched,
            differs: vec![],
        },
    ]
}

/// The cluster: `ns1/svc1` (cluster IP, NodePort, an LB IP with source
/// ranges) on endpoints 1 and 2; `ns1/empty` without endpoints; `ns1/local`
/// (eTP Local NodePort) on endpoint 2 (another node) and 3 (this node).
fn write_manifests(dir: &Path) {
    let w = |f: &str, t: String| fs::write(dir.join(f), t).unwrap();
    w(
        "node.yaml",
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: test-node}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: '{NODE}'}}\n"
        ),
    );
    w("config.yaml", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 198.18.10.0/24\n".into());
    let svc = |name: &str, vip: &str, kind: &str, extra: &str, np: Option<u16>| {
        let np = np.map(|p| format!(", nodePort: {p}")).unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns1}}\nspec:\n  type: {kind}\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n{extra}  ports:\n    - {{name: p80, protocol: TCP, port: 80, targetPort: 8080{np}}}\n"
        )
    };
    let slice = |name: &str, eps: &[(&str, &str)]| {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: ns1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n  - {{name: p80, protocol: TCP, port: 8080}}\nendpoints:\n"
        );
        if eps.is_empty() {
            s = s.replace("endpoints:\n", "endpoints: []\n");
        }
        for (ip, node) in eps {
            s.push_str(&format!(
                "  - addresses: ['{ip}']\n    conditions: {{ready: true}}\n    nodeName: {node}\n"
            ));
        }
        s
    };
    w(
        "svc1.yaml",
        svc(
            "svc1",
            VIP,
            "LoadBalancer",
            &format!("  loadBalancerSourceRanges: [{CLIENT}/32]\n"),
            Some(NODE_PORT),
        ) + &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {LB_IP}}}]\n---\n")
            + &slice(
                "svc1",
                &[(ENDPOINTS[0], "node-b"), (ENDPOINTS[1], "node-b")],
            ),
    );
    w(
        "empty.yaml",
        svc("empty", EMPTY_VIP, "ClusterIP", "", None) + "---\n" + &slice("empty", &[]),
    );
    w(
        "local.yaml",
        svc(
            "local",
            LOCAL_VIP,
            "NodePort",
            "  externalTrafficPolicy: Local\n  internalTrafficPolicy: Cluster\n",
            Some(LOCAL_NODE_PORT),
        ) + "---\n"
            + &slice(
                "local",
                &[(ENDPOINTS[1], "node-b"), (ENDPOINTS[2], "test-node")],
            ),
    );
}

/// A connection a listener accepted: its local and peer addresses, and
/// which listener (`endpoint` or `untouched`).
type Accepted = (SocketAddr, SocketAddr, &'static str);

/// The namespaces of one run, removed on drop (and on panic or signal).
struct Topology {
    id: String,
    seen: Arc<Mutex<Vec<Accepted>>>,
    stop: Arc<AtomicBool>,
}

impl Topology {
    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.id)
    }

    fn new() -> Self {
        let id = cleanup::unique_id();
        let t = Topology {
            id,
            seen: Arc::default(),
            stop: Arc::default(),
        };
        for role in ["node", "pod", "out", "ep", "any"] {
            let ns = t.ns(role);
            cleanup::register(&ns);
            netns::add(&ns).unwrap();
        }
        let (node, pod, out, ep, any) = (
            t.ns("node"),
            t.ns("pod"),
            t.ns("out"),
            t.ns("ep"),
            t.ns("any"),
        );
        let ip = |ns: &str, args: &str| {
            netns::ip(Some(ns), &args.split(' ').collect::<Vec<_>>()).unwrap()
        };
        for (name, peer, peer_ns) in [
            ("pod0", "eth0", &pod),
            ("ext0", "eth0", &out),
            ("ep0", "eth0", &ep),
            ("up0", "eth0", &any),
        ] {
            ip(
                &node,
                &format!("link add {name} type veth peer name {peer} netns {peer_ns}"),
            );
            ip(&node, &format!("link set {name} up"));
            ip(peer_ns, &format!("link set {peer} up"));
        }
        ip(&node, "addr add 198.18.10.1/24 dev pod0");
        ip(&node, &format!("addr add {NODE}/24 dev ext0"));
        ip(&node, "addr add 198.18.180.254/24 dev ep0");
        ip(&node, "addr add 198.18.250.1/24 dev up0");
        ip(&node, "route add default via 198.18.250.2");
        ip(&node, &format!("route add {LB_IP}/32 dev lo"));
        netns::sysctl(&node, "net/ipv4/ip_forward", "1").unwrap();
        ip(&pod, &format!("addr add {POD}/24 dev eth0"));
        ip(&pod, "route add default via 198.18.10.1");
        ip(&out, &format!("addr add {CLIENT}/24 dev eth0"));
        ip(&out, &format!("addr add {DENIED}/24 dev eth0"));
        ip(&out, &format!("route add default via {NODE}"));
        for e in ENDPOINTS {
            ip(&ep, &format!("addr add {e}/24 dev eth0"));
        }
        ip(&ep, "route add default via 198.18.180.254");
        ip(&any, "addr add 198.18.250.2/24 dev eth0");
        ip(&any, "route add default via 198.18.250.1");
        // Any address is this namespace's own: it answers whatever reaches it.
        for range in ["198.19.0.0/16", "198.18.60.0/24"] {
            ip(&any, &format!("route add local {range} dev lo table local"));
        }
        for (ns, port, what) in [
            (ep.clone(), 8080, "endpoint"),
            (any.clone(), 80, "untouched"),
            (any.clone(), 81, "untouched"),
        ] {
            let listener = netns::run_in(&ns, move || TcpListener::bind(("0.0.0.0", port)))
                .unwrap()
                .unwrap();
            listener.set_nonblocking(true).unwrap();
            let (seen, stop) = (t.seen.clone(), t.stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, peer)) => {
                            let local = conn.local_addr().unwrap();
                            seen.lock().unwrap().push((local, peer, what));
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => return,
                    }
                }
            });
        }
        t
    }

    /// A TCP connection from `from` to `dst:dport`, from source port `sport`: what came of it.
    fn connect(&self, from: From, dst: &str, dport: u16, sport: u16) -> Outcome {
        let (ns, src) = match from {
            From::Pod => (self.ns("pod"), POD),
            From::Outside => (self.ns("out"), CLIENT),
            From::Denied => (self.ns("out"), DENIED),
            From::Node => (self.ns("node"), NODE),
        };
        let target = SocketAddr::new(dst.parse().unwrap(), dport);
        let bind = SocketAddr::new(src.parse().unwrap(), sport);
        let result = netns::run_in(&ns, move || {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            sock.set_reuse_address(true)?;
            sock.bind(&bind.into())?;
            sock.connect_timeout(&target.into(), Duration::from_millis(400))
                .map(|_| TcpStream::from(sock))
        })
        .unwrap();
        match result {
            Ok(conn) => {
                let _ = conn.as_raw_fd();
                std::thread::sleep(Duration::from_millis(20));
                let seen = self.seen.lock().unwrap();
                // The accepted connection whose peer port is ours (masquerade
                // may change the port too: then the latest one).
                let hit = seen
                    .iter()
                    .rev()
                    .find(|(_, peer, _)| peer.port() == sport)
                    .or(seen.last());
                match hit {
                    Some((local, _, "untouched")) if local.ip() == target.ip() => {
                        Outcome::Untouched
                    }
                    Some((local, peer, "endpoint")) => Outcome::Forwarded {
                        endpoints: [local.ip().to_string()].into(),
                        masq: peer.ip() != bind.ip(),
                    },
                    other => panic!("{from:?} -> {target}: connected, but {other:?}"),
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Outcome::Rejected,
            Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => {
                Outcome::Dropped
            }
            Err(e) => panic!("{from:?} -> {target}: {e}"),
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for role in ["node", "pod", "out", "ep", "any"] {
            cleanup::release(&self.ns(role));
        }
    }
}

fn emit_args(dir: &Path, mode: EmitMode) -> EmitArgs {
    EmitArgs {
        mode,
        manifests: dir.to_path_buf(),
        config: Some(dir.join("config.yaml")),
        hostname: Some("test-node".into()),
        local_addresses: vec![NODE.parse().unwrap()],
    }
}

/// Several connections of one flow (fresh source ports): what came of them.
fn observe(
    mode: Mode,
    dir: &Path,
    topology: Option<&Topology>,
    flow: &Flow,
    first_port: u16,
) -> Outcome {
    if mode == Mode::Ebpf {
        return explain(dir, flow, first_port);
    }
    if mode == Mode::Ipvs {
        return ipvs_outcome(dir, flow);
    }
    let t = topology.expect("a topology for the rule modes");
    let mut result: Option<Outcome> = None;
    for i in 0..TRIES {
        let one = t.connect(flow.from, flow.dst, flow.dport, first_port + i);
        result = Some(match (result, one) {
            (None, o) => o,
            (
                Some(Outcome::Forwarded { endpoints: a, masq }),
                Outcome::Forwarded {
                    endpoints: b,
                    masq: m,
                },
            ) => {
                assert_eq!(masq, m, "{mode:?} {}: masquerade varies", flow.name);
                Outcome::Forwarded {
                    endpoints: a.union(&b).cloned().collect(),
                    masq,
                }
            }
            (Some(a), b) => {
                assert_eq!(a, b, "{mode:?} {}: outcomes vary", flow.name);
                a
            }
        });
        if !matches!(result, Some(Outcome::Forwarded { .. })) {
            break;
        }
    }
    result.unwrap()
}

/// Connections per flow: enough that two endpoints are both reached (a
/// chance of 2^-23 to miss one; with 8 tries, 2^-7 per flow made about one
/// CI run in ten fail).
const TRIES: u16 = 24;

/// `TRIES` flows through the real programs, in one run of `explain`.
fn explain(dir: &Path, flow: &Flow, first_port: u16) -> Outcome {
    let (src, origin) = match flow.from {
        From::Pod => (POD, Origin::Pod),
        From::Outside => (CLIENT, Origin::Outside),
        From::Denied => (DENIED, Origin::Outside),
        From::Node => (NODE, Origin::Host),
    };
    let args = Args {
        source: Source::Offline(Offline {
            manifests: dir.to_path_buf(),
            config: Some(dir.join("config.yaml")),
            ebpf_config: None,
            hostname: Some("test-node".into()),
            local_addresses: vec![NODE.parse().unwrap()],
        }),
        probe: Probe {
            proto: Proto::Tcp,
            src: src.parse().unwrap(),
            sport: first_port,
            dst: flow.dst.parse().unwrap(),
            dport: flow.dport,
            origin,
        },
        flows: Some(u32::from(TRIES)),
        output: Output::Json,
    };
    let v: Value = serde_json::from_str(&proxy_agent::cli::explain::run(&args).unwrap()).unwrap();
    let count = |verdict: &str| v["verdicts"][verdict].as_u64().unwrap_or(0);
    let total = u64::from(TRIES);
    if count("forwarded") == total {
        let masqueraded = v["masqueraded"].as_u64().unwrap();
        assert!(
            masqueraded == 0 || masqueraded == total,
            "{}: masquerade varies: {v:#}",
            flow.name
        );
        let endpoints = v["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e["endpoint"]
                    .as_str()
                    .unwrap()
                    .parse::<SocketAddr>()
                    .unwrap()
                    .ip()
                    .to_string()
            })
            .collect();
        return Outcome::Forwarded {
            endpoints,
            masq: masqueraded == total,
        };
    }
    for (verdict, outcome) in [
        ("dropped", Outcome::Dropped),
        ("rejected", Outcome::Rejected),
        ("passed", Outcome::Untouched),
    ] {
        if count(verdict) == total {
            return outcome;
        }
    }
    panic!("{}: outcomes vary: {v:#}", flow.name)
}

fn run_suite(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    write_manifests(dir.path());
    let topology = matches!(mode, Mode::Nftables | Mode::Iptables).then(Topology::new);
    if let Some(t) = &topology {
        let emit_mode = if mode == Mode::Nftables {
            EmitMode::Nftables
        } else {
            EmitMode::Iptables
        };
        let (opts, desired) = emit::prepare(&emit_args(dir.path(), emit_mode)).unwrap();
        let settings = NftSettings::from_options(&opts);
        netns::run_in(&t.ns("node"), move || {
            let full = SyncChanges {
                full: true,
                ..Default::default()
            };
            match mode {
                Mode::Nftables => NftablesProxier::new(settings)
                    .sync(&desired, &full)
                    .map_err(|e| e.to_string()),
                _ => IptablesProxier::new(settings)
                    .sync(&desired, &full)
                    .map_err(|e| e.to_string()),
            }
        })
        .unwrap()
        .unwrap();
    }
    let mut failures = Vec::new();
    for (i, flow) in flows().iter().enumerate() {
        let want = flow
            .differs
            .iter()
            .find(|(m, _)| *m == mode)
            .map_or(flow.expect.clone(), |(_, o)| o.clone());
        let got = observe(
            mode,
            dir.path(),
            topology.as_ref(),
            flow,
            20_000 + 100 * i as u16,
        );
        if got != want {
            failures.push(format!("{}: expected {want:?}, got {got:?}", flow.name));
        }
    }
    assert!(failures.is_empty(), "{mode:?}:\n{}", failures.join("\n"));
}

#[test]
fn flow_suite_ebpf() {
    run_suite(Mode::Ebpf);
}

#[test]
fn flow_suite_nftables() {
    run_suite(Mode::Nftables);
}

#[test]
fn flow_suite_iptables() {
    run_suite(Mode::Iptables);
}

#[test]
fn flow_suite_ipvs() {
    run_suite(Mode::Ipvs);
}

/// What the ipvs mode does with a flow, read from what its proxier writes
/// for this node: the filter rules (`KUBE-PROXY-FIREWALL` with the source
/// range sets, `KUBE-IPVS-FILTER`), IPVS (the virtual server of the
/// address and port, none for addresses that are not the node's or on
/// `kube-ipvs0`; one without real servers answers with ICMP port
/// unreachable, `ip_vs_leave`), and the masquerade marks of `KUBE-SERVICES`
/// (the sets matched as the rules match them, with the local detector).
fn ipvs_outcome(dir: &Path, flow: &Flow) -> Outcome {
    use proxy_agent::{model::IpFamily, modes::ipvs::proxier::plan};
    let (opts, desired) = emit::prepare(&emit_args(dir, EmitMode::Ipvs)).unwrap();
    let settings = NftSettings::from_options(&opts);
    let p = plan(
        &settings,
        &opts.config.ipvs.scheduler,
        IpFamily::V4,
        &desired,
    );
    let has = |set: &str, entry: &str| p.sets.entries.get(set).is_some_and(|e| e.contains(entry));
    let src = match flow.from {
        From::Pod => POD,
        From::Outside => CLIENT,
        From::Denied => DENIED,
        From::Node => NODE,
    };
    let (dst, port) = (flow.dst, flow.dport);
    let key = format!("{dst},tcp:{port}");
    let dst_ip: std::net::IpAddr = dst.parse().unwrap();
    if dst != NODE && !p.bound.contains(&dst_ip) {
        return Outcome::Untouched;
    }
    // filter INPUT (traffic from the node itself takes OUTPUT instead).
    if flow.from != From::Node {
        if has("KUBE-LOAD-BALANCER-FW", &key) {
            let src_ip: std::net::IpAddr = src.parse().unwrap();
            let allowed = p
                .sets
                .entries
                .get("KUBE-LOAD-BALANCER-SOURCE-CIDR")
                .into_iter()
                .flatten()
                .any(|e| {
                    e.strip_prefix(&format!("{key},"))
                        .and_then(|net| net.parse::<ipnet::IpNet>().ok())
                        .is_some_and(|net| net.contains(&src_ip))
                })
                || has("KUBE-LOAD-BALANCER-SOURCE-IP", &format!("{key},{src}"));
            if !allowed {
                return Outcome::Dropped;
            }
        }
        let serviced = [
            "KUBE-LOAD-BALANCER",
            "KUBE-CLUSTER-IP",
            "KUBE-EXTERNAL-IP",
            "KUBE-EXTERNAL-IP-LOCAL",
        ]
        .iter()
        .any(|s| has(s, &key))
            || has("KUBE-HEALTH-CHECK-NODE-PORT", &port.to_string());
        if !serviced && has("KUBE-IPVS-IPS", dst) {
            return Outcome::Rejected;
        }
    }
    let Some(vs) = p
        .servers
        .iter()
        .find(|vs| vs.address == dst_ip && vs.port == port)
    else {
        // The node's own address, no virtual server: its stack refuses.
        return Outcome::Rejected;
    };
    if vs.reals.is_empty() {
        return Outcome::Rejected;
    }
    // nat KUBE-SERVICES: any rule that marks for masquerade.
    let cluster_cidr: ipnet::IpNet = "198.18.10.0/24".parse().unwrap();
    let src_ip: std::net::IpAddr = src.parse().unwrap();
    let masq = (has("KUBE-LOAD-BALANCER", &key) && !has("KUBE-LOAD-BALANCER-LOCAL", &key))
        || (has("KUBE-CLUSTER-IP", &key) && !cluster_cidr.contains(&src_ip))
        || has("KUBE-EXTERNAL-IP", &key)
        || (has("KUBE-NODE-PORT-TCP", &port.to_string())
            && !has("KUBE-NODE-PORT-LOCAL-TCP", &port.to_string()));
    Outcome::Forwarded {
        endpoints: vs
            .reals
            .iter()
            .map(|r| r.address.ip().to_string())
            .collect(),
        masq,
    }
}
