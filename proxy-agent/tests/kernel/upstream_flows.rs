//! Upstream's packet-flow facts, carried over: the rows of `TestNodePorts`
//! in kube-proxy's nftables and iptables proxier tests
//! (`pkg/proxy/{nftables,iptables}/proxier_test.go`, `runPacketFlowTests`),
//! which are the IPv6 packet flows upstream tests (its other packet-flow
//! tests are IPv4 only), with their IPv4 siblings. Each row runs through
//! the real programs by `explain`'s offline form (the agent's own options,
//! model, node facts and programmer; BPF_PROG_TEST_RUN, and the socket hook
//! for the node's own connections), 40 flows per row: "both endpoints"
//! means every flow is forwarded and both endpoints are reached.
//!
//! Addresses are upstream's moved into the ranges tests may use
//! (fd00:: -> 2001:db8::, 10/8 -> 198.18/16, 172.30/16 -> 198.19/16,
//! 192.168.0/24 -> 198.18.0/24, 192.168.1/24 -> 198.18.200/24, the
//! external clients 203.0.113.2 -> 198.18.100.2 and 2600:5200::1 ->
//! 2001:db8:5200::1); 2001:db8::1 and 2001:db8:1::2 are upstream's own.
//!
//! Where our datapath reaches the same outcome another way, the row says
//! so: the node's own connections are pointed at the endpoint by the socket
//! hook at connect() and leave with the node's address, which is what
//! upstream's masquerade of them achieves, so explain reports them forwarded
//! without masquerade. Needs root.

use std::fs;

use proxy_agent::cli::explain::{
    args::{Args, Offline, Output, Source},
    probe::{Origin, Probe, Proto},
    run,
};
use serde_json::Value;

const FLOWS: u32 = 40;
const NODE_PORT: u16 = 3001;

/// One `TestNodePorts` family: its addresses and its sub-tests.
struct Family {
    node: &'static str,
    alt_node: &'static str,
    cluster_ip: &'static str,
    endpoints: [&'static str; 2],
    pod: &'static str,
    pod_cidr: &'static str,
    external_client: &'static str,
    localhost: &'static str,
    address_type: &'static str,
}

const IPV6: Family = Family {
    node: "2001:db8::1",
    alt_node: "2001:db8:1::2",
    cluster_ip: "2001:db8:172:30::41",
    endpoints: ["2001:db8:10:180::1", "2001:db8:10:180::2:1"],
    pod: "2001:db8:10::2",
    pod_cidr: "2001:db8:10::/64",
    external_client: "2001:db8:5200::1",
    localhost: "::1",
    address_type: "IPv6",
};

const IPV4: Family = Family {
    node: "198.18.0.2",
    alt_node: "198.18.200.2",
    cluster_ip: "198.19.0.41",
    endpoints: ["198.18.180.1", "198.18.182.1"],
    pod: "198.18.10.2",
    pod_cidr: "198.18.10.0/24",
    external_client: "198.18.100.2",
    localhost: "127.0.0.1",
    address_type: "IPv4",
};

/// What upstream's row expects, in explain's vocabulary.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// `output: "<both endpoints>"` with upstream's `masq`.
    Both { masq: bool },
    /// `output: ""`: not service traffic, left alone.
    Untouched,
}

struct Row {
    name: &'static str,
    src: &'static str,
    dst: &'static str,
    dport: u16,
    from: Origin,
    expect: Expect,
}

/// The cluster of `TestNodePorts`: `ns1/svc1`, NodePort 3001 on port 80,
/// one endpoint on no node and one on `test-node`; the node's two
/// addresses; pods detected by their CIDR; `nodePortAddresses` as given.
struct Setup {
    dir: tempfile::TempDir,
    family: &'static Family,
}

impl Setup {
    fn new(family: &'static Family, node_port_addresses: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, text: String| fs::write(dir.path().join(file), text).unwrap();
        let f = family;
        write(
            "node.yaml",
            format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: test-node}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: '{}'}}\n    - {{type: InternalIP, address: '{}'}}\n",
                f.node, f.alt_node
            ),
        );
        write(
            "svc1.yaml",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc1, namespace: ns1}}\nspec:\n  type: NodePort\n  ipFamilies: [{family}]\n  clusterIP: '{ip}'\n  clusterIPs: ['{ip}']\n  ports:\n    - {{name: p80, protocol: TCP, port: 80, nodePort: {NODE_PORT}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc1-1\n  namespace: ns1\n  labels: {{kubernetes.io/service-name: svc1}}\naddressType: {family}\nports:\n  - {{name: p80, protocol: TCP, port: 80}}\nendpoints:\n  - addresses: ['{}']\n  - addresses: ['{}']\n    nodeName: test-node\n",
                f.endpoints[0],
                f.endpoints[1],
                family = f.address_type,
                ip = f.cluster_ip,
            ),
        );
        write(
            "config.yaml",
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: ClusterCIDR\nclusterCIDR: '{}'\nnodePortAddresses: {node_port_addresses}\n",
                f.pod_cidr
            ),
        );
        Setup { dir, family }
    }

    /// Runs `row` as `FLOWS` flows and checks upstream's expectation.
    fn check(&self, sub_test: &str, row: &Row) {
        let what = format!("{sub_test} / {}", row.name);
        let f = self.family;
        let args = Args {
            source: Source::Offline(Offline {
                manifests: self.dir.path().to_owned(),
                config: Some(self.dir.path().join("config.yaml")),
                ebpf_config: None,
                hostname: Some("test-node".into()),
                local_addresses: vec![f.node.parse().unwrap(), f.alt_node.parse().unwrap()],
            }),
            probe: Probe {
                proto: Proto::Tcp,
                src: row.src.parse().unwrap(),
                sport: 40_000,
                dst: row.dst.parse().unwrap(),
                dport: row.dport,
                origin: row.from,
            },
            flows: Some(FLOWS),
            output: Output::Json,
        };
        // explain's offline form enters a network namespace of its own on
        // the calling thread: a thread of its own keeps the test's.
        let json = std::thread::spawn(move || run(&args))
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let v: Value = serde_json::from_str(&json).unwrap();
        match row.expect {
            Expect::Both { masq } => {
                assert_eq!(v["verdicts"]["forwarded"], FLOWS, "{what}: {v:#}");
                let reached: Vec<String> = v["endpoints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["endpoint"].as_str().unwrap().to_owned())
                    .collect();
                let mut both: Vec<String> = f
                    .endpoints
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(ip.parse().unwrap(), 80).to_string())
                    .collect();
                both.sort_by_key(|a| a.parse::<std::net::SocketAddr>().unwrap());
                assert_eq!(reached, both, "{what}: both endpoints: {v:#}");
                let masqueraded = if masq && row.from != Origin::Host {
                    FLOWS
                } else {
                    0
                };
                assert_eq!(v["masqueraded"], masqueraded, "{what}: masq {masq}: {v:#}");
            }
            Expect::Untouched => {
                assert_eq!(v["verdicts"]["passed"], FLOWS, "{what}: untouched: {v:#}");
            }
        }
    }
}

/// The rows every sub-test of a family has.
fn common_rows(f: &'static Family) -> Vec<Row> {
    vec![
        Row {
            name: "pod to cluster IP",
            src: f.pod,
            dst: f.cluster_ip,
            dport: 80,
            from: Origin::Pod,
            expect: Expect::Both { masq: false },
        },
        Row {
            name: "external to nodePort",
            src: f.external_client,
            dst: f.node,
            dport: NODE_PORT,
            from: Origin::Outside,
            expect: Expect::Both { masq: true },
        },
        Row {
            name: "node to nodePort",
            src: f.node,
            dst: f.node,
            dport: NODE_PORT,
            from: Origin::Host,
            expect: Expect::Both { masq: true },
        },
    ]
}

fn secondary(f: &'static Family, served: bool) -> Row {
    Row {
        name: if served {
            "external to nodePort on secondary IP"
        } else {
            "secondary nodeIP ignores NodePorts"
        },
        src: f.external_client,
        dst: f.alt_node,
        dport: NODE_PORT,
        from: Origin::Outside,
        expect: if served {
            Expect::Both { masq: true }
        } else {
            Expect::Untouched
        },
    }
}

/// nftables "ipv6": NodePorts on the node's primary IP only.
#[test]
fn node_ports_ipv6() {
    let setup = Setup::new(&IPV6, "[primary]");
    let mut rows = common_rows(&IPV6);
    rows.push(secondary(&IPV6, false));
    // iptables' IPv6 sub-tests: "localhost to nodePort is ignored" (localhost
    // NodePorts are IPv4 only, whatever localhostNodePorts says).
    rows.push(Row {
        name: "localhost to nodePort is ignored",
        src: IPV6.localhost,
        dst: IPV6.localhost,
        dport: NODE_PORT,
        from: Origin::Host,
        expect: Expect::Untouched,
    });
    for row in &rows {
        setup.check("ipv6", row);
    }
}

/// nftables "ipv6, multiple nodeport-addresses" (and iptables' IPv6
/// sub-tests that serve the secondary IP).
#[test]
fn node_ports_ipv6_multiple_nodeport_addresses() {
    let setup = Setup::new(
        &IPV6,
        "['198.18.0.0/24', '198.18.200.0/24', '2001:db8::/64', '2001:db8:1::2/128']",
    );
    let mut rows = common_rows(&IPV6);
    rows.push(secondary(&IPV6, true));
    for row in &rows {
        setup.check("ipv6, multiple nodeport-addresses", row);
    }
}

/// nftables "ipv4".
#[test]
fn node_ports_ipv4() {
    let setup = Setup::new(&IPV4, "[primary]");
    let mut rows = common_rows(&IPV4);
    rows.push(secondary(&IPV4, false));
    for row in &rows {
        setup.check("ipv4", row);
    }
}

/// nftables "ipv4, multiple nodeport-addresses".
#[test]
fn node_ports_ipv4_multiple_nodeport_addresses() {
    let setup = Setup::new(
        &IPV4,
        "['198.18.0.0/24', '198.18.200.0/24', '2001:db8::/64']",
    );
    let mut rows = common_rows(&IPV4);
    rows.push(secondary(&IPV4, true));
    for row in &rows {
        setup.check("ipv4, multiple nodeport-addresses", row);
    }
}
