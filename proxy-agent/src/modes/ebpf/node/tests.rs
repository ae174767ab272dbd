use std::{collections::BTreeMap, net::IpAddr};

use ipnet::IpNet;

use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
use proxy_common::conntrack::{DEFAULT_UDP_NS, DEFAULT_UDP_STREAM_NS};

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::*;
use crate::{
    model::{NodeSettings as ModelSettings, NodeTopology, node_pod_cidrs},
    options::{Environment, NodePortAddresses, Parsed, ProxyMode, mode::FixedSupport, parse},
};

/// The mode-neutral settings of the node model and the ebpf mode's own.
struct Settings {
    ebpf: EbpfNodeSettings,
    node: ModelSettings,
}

/// The facts the ebpf mode derives from the node model of `n` and `h`.
fn derive(s: &Settings, n: Option<&Node>, h: &HostNetwork) -> NodeFacts {
    let model = NodeModel::build(&s.node, NodeTopology::new("node-a"), n, Arc::new(h.clone()));
    node_facts(&s.ebpf, &model)
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn settings(detect_local: DetectLocal) -> Settings {
    Settings {
        ebpf: EbpfNodeSettings {
            conntrack: BpfConntrackParams {
                max_entries: 1,
                tcp_established: GoDuration::from_secs(86_400),
                tcp_close_wait: GoDuration::from_secs(3_600),
                udp: GoDuration::from_secs(30),
                udp_stream: GoDuration::from_secs(120),
            },
            masquerade_all: false,
            detect_local,
            external_interfaces: Vec::new(),
            pod_interface_prefixes: vec!["veth".into()],
            localhost_node_ports: false,
            socket_lb: Default::default(),
            maglev: Default::default(),
            ephemeral_ports: crate::modes::ebpf::node::LINUX_DEFAULT_EPHEMERAL,
        },
        node: ModelSettings::default(),
    }
}

fn iface(index: u32, name: &str, master: Option<&str>, addrs: &[&str]) -> HostInterface {
    HostInterface {
        name: name.into(),
        index,
        master: master.map(Into::into),
        peer_in_other_netns: false,
        ipv4: addrs.iter().map(|a| ip(a)).collect(),
        ipv6: Vec::new(),
    }
}

/// lo, two uplinks, a bridge with two pod ports, and a routed pod veth.
fn host() -> HostNetwork {
    HostNetwork {
        interfaces: vec![
            iface(1, "lo", None, &["127.0.0.1"]),
            iface(2, "eth0", None, &["192.0.2.10"]),
            iface(3, "eth1", None, &["198.51.100.7", "198.51.100.8"]),
            iface(4, "cni0", None, &["10.244.1.1"]),
            iface(5, "vethbr1", Some("cni0"), &[]),
            iface(6, "vethbr2", Some("cni0"), &[]),
            iface(7, "cali123", None, &[]),
        ],
        default_route_interface: Some("eth1".into()),
        ..HostNetwork::default()
    }
}

fn node(internal: &[&str], external: &[&str], pod_cidrs: &[&str]) -> Node {
    let addresses = internal
        .iter()
        .map(|a| ("InternalIP", a))
        .chain(external.iter().map(|a| ("ExternalIP", a)))
        .map(|(kind, a)| NodeAddress {
            type_: kind.into(),
            address: a.to_string(),
        })
        .collect();
    Node {
        spec: Some(NodeSpec {
            pod_cidrs: Some(pod_cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(addresses),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn flagged(facts: &NodeFacts, flag: u32) -> Vec<u32> {
    facts
        .ifaces
        .iter()
        .filter(|(_, i)| i.flags & flag != 0)
        .map(|(index, _)| *index)
        .collect()
}

#[test]
fn cluster_cidr_mode_detects_by_source_address() {
    let s = settings(DetectLocal::ClusterCidr(vec![net("10.244.0.0/16")]));
    let facts = derive(&s, None, &host());
    assert_eq!(facts.config.flags, flags::DETECT_LOCAL_BY_CIDR);
    assert_eq!(
        facts.local_pod_cidrs.iter().copied().collect::<Vec<_>>(),
        vec![net("10.244.0.0/16")]
    );
    assert!(flagged(&facts, iface::LOCAL_POD).is_empty());
}

#[test]
fn cluster_cidr_mode_without_an_ipv4_cidr_detects_nothing() {
    let facts = derive(&settings(DetectLocal::None), None, &host());
    assert_eq!(facts.config.flags, 0);
    assert!(facts.local_pod_cidrs.is_empty());
    assert!(flagged(&facts, iface::LOCAL_POD).is_empty());
}

#[test]
fn node_cidr_mode_uses_the_nodes_pod_cidrs_of_each_family_once_known() {
    let s = settings(DetectLocal::NodeCidr);
    let before = derive(&s, None, &host());
    assert_eq!(before.config.flags, 0, "no podCIDR yet: no detection");

    let n = node(&["192.0.2.10"], &[], &["10.244.1.0/24", "fd00:1::/64"]);
    let after = derive(&s, Some(&n), &host());
    assert_eq!(
        after.config.flags,
        flags::DETECT_LOCAL_BY_CIDR | flags::DETECT_LOCAL_BY_CIDR6
    );
    assert_eq!(
        after.local_pod_cidrs.iter().copied().collect::<Vec<_>>(),
        vec![net("10.244.1.0/24"), net("fd00:1::/64")]
    );

    // A family without a podCIDR has no detector, as upstream's no-op one.
    let v4_only = derive(
        &s,
        Some(&node(&["192.0.2.10"], &[], &["10.244.1.0/24"])),
        &host(),
    );
    assert_eq!(v4_only.config.flags, flags::DETECT_LOCAL_BY_CIDR);
}

#[test]
fn the_ipv6_facts_come_from_the_nodes_ipv6_addresses() {
    let mut h = host();
    h.interfaces[1].ipv6 = vec!["2001:db8::10".parse().unwrap(), "fe80::1".parse().unwrap()];
    let n = node(&["192.0.2.10", "2001:db8::10"], &[], &[]);
    let facts = derive(&settings(DetectLocal::None), Some(&n), &h);
    let primary6: std::net::Ipv6Addr = "2001:db8::10".parse().unwrap();
    assert_eq!(facts.addresses6.primary, Some(primary6));
    assert_eq!(facts.config6.masquerade_addr_be, V6::to_be(primary6));
    assert!(facts.addresses6.host.contains(&primary6));
    assert!(facts.addresses6.node_ports.contains(&primary6));
    assert!(
        !facts.addresses6.localhost_node_ports,
        "127.0.0.1 is IPv4's only"
    );
}

#[test]
fn node_cidr_falls_back_to_the_singular_pod_cidr() {
    let mut n = node(&[], &[], &[]);
    n.spec.as_mut().unwrap().pod_cidr = Some("10.244.9.0/24".into());
    assert_eq!(node_pod_cidrs(&n), vec![net("10.244.9.0/24")]);
}

#[test]
fn bridge_interface_mode_marks_the_bridge_and_its_ports() {
    let s = settings(DetectLocal::BridgeInterface("cni0".into()));
    let facts = derive(&s, None, &host());
    assert_eq!(facts.config.flags, flags::DETECT_LOCAL_BY_INTERFACE);
    assert_eq!(flagged(&facts, iface::LOCAL_POD), vec![4, 5, 6]);
    assert!(facts.local_pod_cidrs.is_empty());
}

#[test]
fn interface_name_prefix_mode_marks_matching_interfaces() {
    let s = settings(DetectLocal::InterfaceNamePrefix("veth".into()));
    let facts = derive(&s, None, &host());
    assert_eq!(facts.config.flags, flags::DETECT_LOCAL_BY_INTERFACE);
    assert_eq!(flagged(&facts, iface::LOCAL_POD), vec![5, 6]);
}

#[test]
fn masquerade_all_and_conntrack_timeouts_reach_the_config() {
    let mut s = settings(DetectLocal::None);
    s.ebpf.masquerade_all = true;
    let c = derive(&s, None, &host()).config;
    assert_eq!(c.flags, flags::MASQUERADE_ALL);
    assert_eq!(c.tcp_established_ns, 86_400 * 1_000_000_000);
    assert_eq!(c.tcp_closing_ns, 3_600 * 1_000_000_000);
    assert_eq!(c.udp_ns, DEFAULT_UDP_NS);
    assert_eq!(c.udp_stream_ns, DEFAULT_UDP_STREAM_NS);
    assert_eq!(
        [
            (c.snat_port_min, c.snat_port_max),
            (c.snat_port_min2, c.snat_port_max2)
        ],
        [(1_024, 29_999), (61_000, 65_535)]
    );
}

#[test]
fn each_family_shares_next_hops_only_while_its_routing_is_by_destination() {
    let s = settings(DetectLocal::None);
    let mut h = host();
    let shares = |h: &HostNetwork| {
        let c = derive(&s, None, h).config;
        (
            c.flags & flags::ROUTES_BY_DESTINATION != 0,
            c.flags & flags::ROUTES_BY_DESTINATION6 != 0,
        )
    };
    assert_eq!(shares(&h), (false, false));
    h.destination_routing = DestinationRouting {
        ipv4: true,
        ipv6: false,
    };
    assert_eq!(shares(&h), (true, false));
    h.destination_routing.ipv6 = true;
    assert_eq!(shares(&h), (true, true));
}

#[test]
fn primary_ip_prefers_bind_address_then_internal_then_external_then_default_route() {
    let mut s = settings(DetectLocal::None);
    let primary = |s: &Settings, n: Option<&Node>| derive(s, n, &host()).addresses.primary;

    assert_eq!(
        primary(&s, None),
        Some(ip("198.51.100.7")),
        "default route interface"
    );
    let external_only = node(&[], &["203.0.113.5"], &[]);
    assert_eq!(primary(&s, Some(&external_only)), Some(ip("203.0.113.5")));
    let both = node(&["fd00::1", "192.0.2.10"], &["203.0.113.5"], &[]);
    assert_eq!(primary(&s, Some(&both)), Some(ip("192.0.2.10")));
    s.node.bind_address = Some(IpAddr::V4(ip("198.51.100.8")));
    assert_eq!(primary(&s, Some(&both)), Some(ip("198.51.100.8")));

    let c = derive(&s, Some(&both), &host()).config;
    assert_eq!(c.masquerade_addr_be, u32::from(ip("198.51.100.8")).to_be());
}

#[test]
fn no_primary_ip_disables_masquerading() {
    let host = HostNetwork {
        interfaces: vec![iface(1, "lo", None, &["127.0.0.1"])],
        default_route_interface: None,
        ..HostNetwork::default()
    };
    let facts = derive(&settings(DetectLocal::None), None, &host);
    assert_eq!(facts.addresses.primary, None);
    assert_eq!(facts.config.masquerade_addr_be, 0);
}

fn node_ports(mode: NodePortAddresses, n: Option<&Node>) -> Vec<Ipv4Addr> {
    let mut s = settings(DetectLocal::None);
    s.node.node_port_addresses = mode;
    derive(&s, n, &host()).addresses.node_ports
}

#[test]
fn node_port_addresses_unset_means_every_non_loopback_address() {
    assert_eq!(
        node_ports(NodePortAddresses::All, None),
        ["10.244.1.1", "192.0.2.10", "198.51.100.7", "198.51.100.8"].map(ip)
    );
}

#[test]
fn node_port_addresses_cidrs_select_the_local_addresses_inside() {
    let cidrs = vec![
        "198.51.100.0/24".parse().unwrap(),
        "fd00::/8".parse().unwrap(),
    ];
    assert_eq!(
        node_ports(NodePortAddresses::Cidrs(cidrs), None),
        ["198.51.100.7", "198.51.100.8"].map(ip)
    );
    let loopback = vec!["127.0.0.0/8".parse().unwrap()];
    assert!(node_ports(NodePortAddresses::Cidrs(loopback), None).is_empty());
}

#[test]
fn node_port_addresses_without_an_ipv4_cidr_match_everything_as_upstream() {
    let v6_only = vec!["fd00::/8".parse().unwrap()];
    assert_eq!(node_ports(NodePortAddresses::Cidrs(v6_only), None).len(), 4);
}

#[test]
fn node_port_addresses_primary_is_the_primary_ip_if_local() {
    let n = node(&["192.0.2.10"], &[], &[]);
    assert_eq!(
        node_ports(NodePortAddresses::Primary, Some(&n)),
        vec![ip("192.0.2.10")]
    );
    let remote = node(&["203.0.113.99"], &[], &[]);
    assert!(node_ports(NodePortAddresses::Primary, Some(&remote)).is_empty());
}

#[test]
fn external_interfaces_are_the_addressed_non_pod_ones_unless_configured() {
    let facts = derive(&settings(DetectLocal::None), None, &host());
    assert_eq!(
        facts.external_interfaces,
        BTreeMap::from([("eth0".into(), 2), ("eth1".into(), 3)]),
        "neither the pod bridge nor lo"
    );
    assert_eq!(flagged(&facts, iface::EXTERNAL), vec![2, 3]);
    let mut with_service_ip_on_lo = host();
    with_service_ip_on_lo.interfaces[0]
        .ipv4
        .push(ip("192.0.2.99"));
    assert!(
        !derive(&settings(DetectLocal::None), None, &with_service_ip_on_lo)
            .external_interfaces
            .contains_key("lo")
    );

    let mut s = settings(DetectLocal::BridgeInterface("cni0".into()));
    let facts = derive(&s, None, &host());
    assert_eq!(
        facts.external_interfaces.keys().collect::<Vec<_>>(),
        ["eth0", "eth1"],
        "the pod bridge is not external"
    );

    s.ebpf.external_interfaces = vec!["eth1".into()];
    assert_eq!(
        derive(&s, None, &host()).external_interfaces,
        BTreeMap::from([("eth1".into(), 3)])
    );
}

#[test]
fn veths_whose_peer_is_in_a_pod_are_flagged_for_peer_delivery() {
    let mut host = host();
    // The routed pod's veth and one bridge port lead into pods.
    for i in [5, 6] {
        host.interfaces[i].peer_in_other_netns = true;
    }
    let facts = derive(&settings(DetectLocal::None), None, &host);
    assert_eq!(flagged(&facts, iface::PEER_IN_OTHER_NETNS), vec![6, 7]);
    assert_eq!(
        flagged(&facts, iface::EXTERNAL),
        vec![2, 3],
        "nothing else changes"
    );
}

fn options(args: &[&str]) -> ProxyOptions {
    let support = FixedSupport {
        supported: vec![ProxyMode::Ebpf],
    };
    let env = Environment {
        support: &support,
        hostname: Some("node-a".into()),
    };
    let mut all = vec!["kube-proxy", "--proxy-mode", "ebpf"];
    all.extend_from_slice(args);
    match parse(all, &env).unwrap() {
        Parsed::Run(opts) => *opts,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn settings_follow_the_options() {
    let o = options(&[
        "--cluster-cidr=10.244.0.0/16,fd00::/48",
        "--masquerade-all",
        "--bind-address=192.0.2.10",
        "--nodeport-addresses=primary",
    ]);
    let (s, n) = (
        EbpfNodeSettings::from_options(&o),
        ModelSettings::from_options(&o),
    );
    assert_eq!(
        s.detect_local,
        DetectLocal::ClusterCidr(vec![net("10.244.0.0/16"), net("fd00::/48")]),
        "both families' cluster CIDRs, each its family's detector"
    );
    assert!(s.masquerade_all);
    assert_eq!(n.bind_address, Some(IpAddr::V4(ip("192.0.2.10"))));
    assert_eq!(n.node_port_addresses, NodePortAddresses::Primary);

    let o = options(&[]);
    assert_eq!(
        EbpfNodeSettings::from_options(&o).detect_local,
        DetectLocal::None,
        "ClusterCIDR without a CIDR"
    );
    assert_eq!(
        ModelSettings::from_options(&o).bind_address,
        None,
        "0.0.0.0 names no address"
    );

    let s = EbpfNodeSettings::from_options(&options(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=cni0",
    ]));
    assert_eq!(s.detect_local, DetectLocal::BridgeInterface("cni0".into()));
    let s = EbpfNodeSettings::from_options(&options(&[
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=veth",
    ]));
    assert_eq!(
        s.detect_local,
        DetectLocal::InterfaceNamePrefix("veth".into())
    );
    let s = EbpfNodeSettings::from_options(&options(&["--detect-local-mode=NodeCIDR"]));
    assert_eq!(s.detect_local, DetectLocal::NodeCidr);
}

/// Records writes and checks that detection is never on without its data:
/// a CIDR or interface flag is written before `CONFIG` enables it.
#[derive(Default)]
struct FakeNodeMaps {
    config: Option<DatapathConfig>,
    ifaces: BTreeMap<u32, IfaceInfo>,
    cidrs: BTreeSet<IpNet>,
    service_cidrs: BTreeSet<IpNet>,
    log: Vec<String>,
}

impl NodeMaps for FakeNodeMaps {
    fn put_config(&mut self, config: &DatapathConfig) -> Result<(), MapError> {
        self.log.push("config".into());
        self.config = Some(*config);
        Ok(())
    }
    fn put_config6(&mut self, _config: &DatapathConfig6) -> Result<(), MapError> {
        self.log.push("config6".into());
        Ok(())
    }
    fn put_iface(&mut self, ifindex: u32, info: &IfaceInfo) -> Result<(), MapError> {
        self.log.push(format!("iface {ifindex}"));
        self.ifaces.insert(ifindex, *info);
        Ok(())
    }
    fn delete_iface(&mut self, ifindex: u32) -> Result<(), MapError> {
        self.log.push(format!("-iface {ifindex}"));
        self.ifaces.remove(&ifindex);
        Ok(())
    }
    fn put_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        self.log.push(format!("cidr {cidr}"));
        self.cidrs.insert(cidr);
        Ok(())
    }
    fn delete_local_pod_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        self.log.push(format!("-cidr {cidr}"));
        self.cidrs.remove(&cidr);
        Ok(())
    }
    fn put_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        self.log.push(format!("service-cidr {cidr}"));
        self.service_cidrs.insert(cidr);
        Ok(())
    }
    fn delete_service_cidr(&mut self, cidr: IpNet) -> Result<(), MapError> {
        self.log.push(format!("-service-cidr {cidr}"));
        self.service_cidrs.remove(&cidr);
        Ok(())
    }
}

#[test]
fn service_cidrs_are_added_before_stale_ones_go_and_only_changes_are_written() {
    let mut maps = FakeNodeMaps::default();
    let mut p = NodeProgrammer::new();
    let n = node(&["192.0.2.10"], &[], &["10.244.1.0/24"]);
    let base = derive(&settings(DetectLocal::None), Some(&n), &host());
    let cidrs = |c: &[&str]| -> BTreeSet<IpNet> { c.iter().map(|c| c.parse().unwrap()).collect() };
    let first = base
        .clone()
        .with_service_cidrs(&cidrs(&["10.96.0.7/16", "2001:db8:ffff::/108"]));
    p.apply(&first, &mut maps).unwrap();
    assert_eq!(
        maps.service_cidrs,
        cidrs(&["10.96.0.0/16", "2001:db8:ffff::/108"]),
        "host bits cleared"
    );
    let guarded = |maps: &FakeNodeMaps| maps.config.unwrap().flags & flags::SERVICE_CIDRS != 0;
    assert!(guarded(&maps), "the lookup is turned on");
    maps.log.clear();
    let next = base.with_service_cidrs(&cidrs(&["10.96.0.0/15"]));
    p.apply(&next, &mut maps).unwrap();
    let service_writes: Vec<&String> = maps
        .log
        .iter()
        .filter(|l| l.contains("service-cidr"))
        .collect();
    assert_eq!(
        service_writes,
        [
            "service-cidr 10.96.0.0/15",
            "-service-cidr 10.96.0.0/16",
            "-service-cidr 2001:db8:ffff::/108"
        ]
    );
    assert_eq!(p.apply(&next, &mut maps).unwrap(), 0, "nothing changed");
    let none =
        derive(&settings(DetectLocal::None), Some(&n), &host()).with_service_cidrs(&cidrs(&[]));
    p.apply(&none, &mut maps).unwrap();
    assert!(
        !guarded(&maps) && maps.service_cidrs.is_empty(),
        "off without CIDRs"
    );
}

#[test]
fn node_programmer_writes_data_before_config_and_removes_stale_entries_after() {
    let mut maps = FakeNodeMaps::default();
    let mut p = NodeProgrammer::new();
    let n = node(&["192.0.2.10"], &[], &["10.244.1.0/24"]);
    let by_cidr = derive(&settings(DetectLocal::NodeCidr), Some(&n), &host());
    p.apply(&by_cidr, &mut maps).unwrap();
    assert_eq!(
        maps.log,
        [
            "cidr 10.244.1.0/24",
            "iface 2",
            "iface 3",
            "config6",
            "config"
        ]
    );
    assert_eq!(p.apply(&by_cidr, &mut maps).unwrap(), 0, "nothing changed");

    maps.log.clear();
    let by_bridge = derive(
        &settings(DetectLocal::BridgeInterface("cni0".into())),
        Some(&n),
        &host(),
    );
    p.apply(&by_bridge, &mut maps).unwrap();
    assert_eq!(
        maps.log,
        [
            "iface 4",
            "iface 5",
            "iface 6",
            "config",
            "-cidr 10.244.1.0/24"
        ]
    );
    assert_eq!(maps.config, Some(by_bridge.config));
    assert_eq!(maps.ifaces, by_bridge.ifaces);
    assert!(maps.cidrs.is_empty());
}
