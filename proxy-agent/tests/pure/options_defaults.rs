//! Every field's default (config_rules.md §1 and the first rows of §4), for both sources:
//! no flags at all, and a --config file holding only apiVersion/kind.

use crate::options_common::*;
use proxy_agent::options::ProxyMode;
use serde_yaml::Value;

/// (v1alpha1 path, expected value as YAML) after defaulting on a Linux node where only iptables
/// works (so the blank mode resolves to iptables exactly as upstream's platform default).
const DEFAULTS: &[(&str, &str)] = &[
    ("apiVersion", "kubeproxy.config.k8s.io/v1alpha1"),
    ("kind", "KubeProxyConfiguration"),
    ("featureGates", "{}"),
    ("clientConnection.kubeconfig", "''"),
    ("clientConnection.acceptContentTypes", "''"),
    (
        "clientConnection.contentType",
        "application/vnd.kubernetes.protobuf",
    ),
    ("clientConnection.qps", "5"),
    ("clientConnection.burst", "10"),
    ("logging.format", "text"),
    ("logging.flushFrequency", "5s"),
    ("logging.verbosity", "0"),
    ("logging.vmodule", "[]"),
    ("logging.options.text.infoBufferSize", "'0'"),
    ("logging.options.json.infoBufferSize", "'0'"),
    // `splitStream,omitempty` upstream: absent when false
    ("logging.options.text.splitStream", OMITTED),
    ("logging.options.json.splitStream", OMITTED),
    ("hostnameOverride", "''"),
    ("bindAddress", "0.0.0.0"),
    ("healthzBindAddress", "0.0.0.0:10256"),
    ("metricsBindAddress", "127.0.0.1:10249"),
    ("bindAddressHardFail", "false"),
    ("enableProfiling", "false"),
    ("showHiddenMetricsForVersion", "''"),
    ("mode", "iptables"),
    ("iptables.masqueradeBit", "14"),
    ("iptables.masqueradeAll", "false"),
    ("iptables.localhostNodePorts", "true"),
    ("iptables.syncPeriod", "30s"),
    ("iptables.minSyncPeriod", "1s"),
    ("ipvs.syncPeriod", "30s"),
    ("ipvs.minSyncPeriod", "0s"),
    ("ipvs.scheduler", "''"),
    ("ipvs.excludeCIDRs", "null"),
    ("ipvs.strictARP", "false"),
    ("ipvs.tcpTimeout", "0s"),
    ("ipvs.tcpFinTimeout", "0s"),
    ("ipvs.udpTimeout", "0s"),
    ("nftables.masqueradeBit", "14"),
    ("nftables.masqueradeAll", "false"),
    ("nftables.syncPeriod", "30s"),
    ("nftables.minSyncPeriod", "1s"),
    ("winkernel.networkName", "''"),
    ("winkernel.sourceVip", "''"),
    ("winkernel.enableDSR", "false"),
    ("winkernel.rootHnsEndpointName", "''"),
    ("winkernel.forwardHealthCheckVip", "false"),
    ("detectLocalMode", "ClusterCIDR"),
    ("detectLocal.bridgeInterface", "''"),
    ("detectLocal.interfaceNamePrefix", "''"),
    ("clusterCIDR", "''"),
    ("nodePortAddresses", "null"),
    ("oomScoreAdj", "-999"),
    ("conntrack.maxPerCore", "32768"),
    ("conntrack.min", "131072"),
    ("conntrack.tcpEstablishedTimeout", "24h0m0s"),
    ("conntrack.tcpCloseWaitTimeout", "1h0m0s"),
    ("conntrack.tcpBeLiberal", "false"),
    ("conntrack.udpTimeout", "0s"),
    ("conntrack.udpStreamTimeout", "0s"),
    ("configSyncPeriod", "15m0s"),
    ("portRange", "''"),
    ("windowsRunAsService", "false"),
];

/// A row value meaning "not written at all when it has its default".
const OMITTED: &str = "(omitted)";

fn check_table(source: &str, v: &Value, table: &[(&str, &str)]) {
    for (path, want) in table {
        if *want == OMITTED {
            assert_eq!(value_at_opt(v, path), None, "{source}: {path} is omitted");
            continue;
        }
        let want: Value = serde_yaml::from_str(want).unwrap();
        assert_eq!(value_at(v, path), want, "{source}: default of {path}");
    }
}

fn check_defaults(source: &str, o: &proxy_agent::options::ProxyOptions) {
    check_table(source, &serde_yaml::to_value(&o.config).unwrap(), DEFAULTS);
}

/// Every field of a document must have a row: the leaves of a fully populated instance (so
/// fields omitted when empty count too) against the table.
fn assert_every_leaf_has_a_row(schema: &Value, table: &[(&str, &str)]) {
    let missing: Vec<String> = leaf_paths(schema)
        .into_iter()
        .filter(|leaf| !table.iter().any(|(p, _)| p == leaf))
        .collect();
    assert!(missing.is_empty(), "no default row for {missing:?}");
}

#[test]
fn no_flags_no_file() {
    let o = opts(&[]);
    check_defaults("flags", &o);
    assert_eq!(o.mode, ProxyMode::Iptables);
    assert_eq!(o.sync_period().to_string(), "30s");
    assert_eq!(o.min_sync_period().to_string(), "1s");
    assert_eq!(o.node_name, "test-node", "OS hostname, lower-cased");
    assert!(!o.cleanup && !o.init_only);
}

#[test]
fn empty_file() {
    let dir = TempDir::new("defaults");
    let path = config_file(&dir, "");
    check_defaults("file", &opts(&["--config", &path]));
}

#[test]
fn every_leaf_field_is_in_the_table() {
    // Guards the table itself: a field added to the type without a default row fails here,
    // including fields that are only written when set (the schema has every field populated).
    assert_every_leaf_has_a_row(&proxy_agent::options::merge::kube_proxy_schema(), DEFAULTS);
}

/// Our extension's defaults (docs/configuration.md).
const EBPF_DEFAULTS: &[(&str, &str)] = &[
    ("apiVersion", "ebpf.kube-ebpf-proxy.io/v1alpha1"),
    ("kind", "EbpfDatapathConfiguration"),
    (
        "podInterfacePrefixes",
        "[veth, cali, lxc, cni, gke, eni, azv]",
    ),
    ("externalInterfaces", "[]"),
    ("xdpMode", "auto"),
    ("maps.services", "262144"),
    ("maps.backends", "131072"),
    ("maps.backendSlots", "1048576"),
    ("maps.conntrack", "0"),
    ("maps.maglevTables", "0"),
    ("loadBalancing.algorithm", "random"),
    ("loadBalancing.maglevTableSize", "16381"),
    ("socketLB.enabled", "true"),
    ("socketLB.hostNamespaceOnly", "true"),
    ("socketLB.cgroupPath", "\"\""),
    ("pinning.root", "/sys/fs/bpf/kube-ebpf-proxy"),
    ("pinning.detachOnExit", "false"),
    ("pinning.stateDir", "/run/kube-ebpf-proxy"),
    ("serviceCIDRs", "[]"),
];

#[test]
fn ebpf_defaults_table_covers_every_field() {
    let o = opts(&[]);
    check_table(
        "ebpf",
        &serde_yaml::to_value(&o.ebpf).unwrap(),
        EBPF_DEFAULTS,
    );
    let schema = serde_yaml::to_value(
        proxy_agent::options::ebpf::EbpfDatapathConfiguration::schema_example(),
    )
    .unwrap();
    assert_every_leaf_has_a_row(&schema, EBPF_DEFAULTS);
}

#[test]
fn ipv6_bind_address_moves_server_defaults() {
    let o = opts(&["--bind-address=fd00::1"]);
    assert_eq!(o.config.healthz_bind_address, "[::]:10256");
    assert_eq!(o.config.metrics_bind_address, "[::1]:10249");
}

#[test]
fn server_defaults_follow_upstreams_ipv4_test_of_bind_address() {
    // getDefaultAddresses: IPv4 defaults only when bindAddress parses as one IPv4 address
    // (IPv4-mapped included); a dual-stack pair gets the IPv6 ones.
    for (bind, healthz, metrics) in [
        ("10.0.0.1,fd00::1", "[::]:10256", "[::1]:10249"),
        ("::ffff:10.0.0.1", "0.0.0.0:10256", "127.0.0.1:10249"),
        ("010.0.0.1", "0.0.0.0:10256", "127.0.0.1:10249"),
        ("::", "[::]:10256", "[::1]:10249"),
    ] {
        let o = opts(&[&format!("--bind-address={bind}")]);
        assert_eq!(
            (
                o.config.healthz_bind_address.as_str(),
                o.config.metrics_bind_address.as_str()
            ),
            (healthz, metrics),
            "{bind}"
        );
    }
}

#[test]
fn appended_port_keeps_the_address_as_written() {
    // AppendPortIfNeeded formats the original string, not a normalised IP
    let dir = TempDir::new("defaults");
    let path = config_file(
        &dir,
        "healthzBindAddress: 010.0.0.1\nmetricsBindAddress: \"0:0::1\"\n",
    );
    let o = opts(&["--config", &path]);
    assert_eq!(o.config.healthz_bind_address, "010.0.0.1:10256");
    assert_eq!(o.config.metrics_bind_address, "[0:0::1]:10249");
}

#[test]
fn blank_hostname_override_in_the_file_is_an_error() {
    // nodeutil.GetHostname: a non-empty override is trimmed and may not end up empty; only an
    // empty override falls back to the OS hostname.
    let e = parse_file("hostnameOverride: \"   \"\n").unwrap_err();
    assert!(e.to_string().contains("empty hostname is invalid"), "{e}");
    assert_eq!(opts_file("hostnameOverride: \"\"\n").node_name, "test-node");
}

fn opts_file(body: &str) -> proxy_agent::options::ProxyOptions {
    match parse_file(body) {
        Ok(proxy_agent::options::Parsed::Run(o)) => *o,
        other => panic!("{other:?}"),
    }
}

#[test]
fn file_addresses_without_port_get_the_default_port() {
    let dir = TempDir::new("defaults");
    let path = config_file(
        &dir,
        "healthzBindAddress: 0.0.0.0\nmetricsBindAddress: \"::1\"\n",
    );
    let o = opts(&["--config", &path]);
    assert_eq!(o.config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(o.config.metrics_bind_address, "[::1]:10249");
}

#[test]
fn zero_durations_in_a_file_are_defaulted_pointer_ones_are_kept() {
    // syncPeriod and minSyncPeriod are plain Durations (0 = unset: `if
    // obj.IPTables.MinSyncPeriod.Duration == 0 { ... 1s }`); masqueradeBit, maxPerCore,
    // tcpEstablishedTimeout and oomScoreAdj are pointers (0 stays 0).
    let dir = TempDir::new("defaults");
    let path = config_file(
        &dir,
        "iptables:\n  syncPeriod: 0s\n  minSyncPeriod: 0s\n  masqueradeBit: 0\nconntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\noomScoreAdj: 0\n",
    );
    let o = opts(&["--config", &path]);
    assert_eq!(o.config.iptables.sync_period.to_string(), "30s");
    assert_eq!(o.config.iptables.min_sync_period.to_string(), "1s");
    assert_eq!(o.min_sync_period().to_string(), "1s");
    assert_eq!(o.config.iptables.masquerade_bit, Some(0));
    assert_eq!(o.config.conntrack.max_per_core, Some(0));
    assert_eq!(
        o.config
            .conntrack
            .tcp_established_timeout
            .unwrap()
            .to_string(),
        "0s"
    );
    assert_eq!(o.config.oom_score_adj, Some(0));
}

#[test]
fn zero_min_sync_period_in_a_file_is_defaulted_except_for_ipvs() {
    // nftables.minSyncPeriod is defaulted like the iptables one; ipvs.minSyncPeriod has no
    // default (config_rules.md §1 #22), so 0 stays 0 there.
    let dir = TempDir::new("defaults");
    let path = config_file(
        &dir,
        "mode: nftables\nnftables:\n  minSyncPeriod: 0s\nipvs:\n  minSyncPeriod: 0s\n",
    );
    let o = opts_with(&["--config", &path], &[ProxyMode::Nftables]);
    assert_eq!(o.config.nftables.min_sync_period.to_string(), "1s");
    assert_eq!(o.min_sync_period().to_string(), "1s");
    assert_eq!(o.config.ipvs.min_sync_period.to_string(), "0s");
    let path = config_file(&dir, "mode: ipvs\nipvs:\n  minSyncPeriod: 0s\n");
    let o = opts_with(&["--config", &path], &[ProxyMode::Ipvs]);
    assert_eq!(o.min_sync_period().to_string(), "0s");
}

#[test]
fn nftables_mode_defaults_node_port_addresses_to_primary() {
    let o = opts(&["--proxy-mode=nftables"]);
    assert_eq!(o.config.node_port_addresses, vec!["primary".to_string()]);
    assert_eq!(o.sync_period().to_string(), "30s");
    assert_eq!(o.min_sync_period().to_string(), "1s");
    assert_eq!(o.masquerade_bit(), 14);
    assert_eq!(
        o.node_port_addresses(),
        proxy_agent::options::NodePortAddresses::Primary
    );
}

#[test]
fn blank_mode_picks_the_best_supported_mode() {
    let all = [ProxyMode::Ebpf, ProxyMode::Nftables, ProxyMode::Iptables];
    let o = opts_with(&[], &all);
    assert_eq!(o.mode, ProxyMode::Ebpf);
    assert_eq!(o.config.mode, "ebpf");
    assert!(o.mode_choice.as_ref().unwrap().reason.contains("ebpf"));
    let o = opts_with(&[], &[ProxyMode::Nftables, ProxyMode::Iptables]);
    assert_eq!(o.mode, ProxyMode::Nftables);
    assert!(
        o.mode_choice
            .unwrap()
            .reason
            .contains("ebpf is unavailable")
    );
    assert_eq!(o.config.node_port_addresses, vec!["primary".to_string()]);
    let o = opts_with(&["--proxy-mode=ipvs"], &[]);
    assert_eq!(o.mode, ProxyMode::Ipvs);
    assert!(o.mode_choice.is_none(), "explicit modes are not probed");
}

#[test]
fn unsupported_explicit_mode_is_fatal_at_startup() {
    let o = opts_with(&["--proxy-mode=ipvs"], &[ProxyMode::Iptables]);
    let e = o
        .check_mode_supported(&support(&[ProxyMode::Iptables]))
        .unwrap_err();
    assert!(
        e.to_string().starts_with("can't use the IPVS proxier: "),
        "{e}"
    );
    assert!(o.check_mode_supported(&support(&[ProxyMode::Ipvs])).is_ok());
}

#[test]
fn ebpf_extension_defaults() {
    let o = opts(&[]);
    let e = &o.ebpf;
    assert_eq!(e.api_version, "ebpf.kube-ebpf-proxy.io/v1alpha1");
    assert_eq!(e.kind, "EbpfDatapathConfiguration");
    assert_eq!(
        e.pod_prefixes(),
        ["veth", "cali", "lxc", "cni", "gke", "eni", "azv"]
    );
    assert!(
        !e.pod_prefixes()
            .iter()
            .any(|p| "vxlan.calico".starts_with(p.as_str()))
    );
    assert!(e.external_interfaces.is_empty());
    assert_eq!(e.xdp_mode, proxy_agent::options::ebpf::XdpMode::Auto);
    assert_eq!(
        (e.maps.services, e.maps.backends, e.maps.conntrack),
        (262144, 131072, 0)
    );
    assert_eq!(
        e.load_balancing.algorithm,
        proxy_agent::options::ebpf::LbAlgorithm::Random
    );
    assert_eq!(e.load_balancing.maglev_table_size, 16381);
    assert!(e.socket_lb_enabled());
}

#[test]
fn ebpf_conntrack_is_sized_and_expired_from_the_conntrack_settings() {
    use proxy_agent::options::ebpf::conntrack_params;
    let o = opts(&["--conntrack-udp-timeout=45s"]);
    let p = conntrack_params(&o.config, &o.ebpf, 2);
    assert_eq!(p.max_entries, 131072, "max(32768*2, min 131072)");
    assert_eq!(conntrack_params(&o.config, &o.ebpf, 8).max_entries, 262144);
    assert_eq!(
        conntrack_params(&o.config, &o.ebpf, 256).max_entries,
        1 << 20,
        "capped"
    );
    assert_eq!(p.tcp_established.to_string(), "24h0m0s");
    assert_eq!(p.tcp_close_wait.to_string(), "1h0m0s");
    assert_eq!(p.udp.to_string(), "45s");
    assert_eq!(p.udp_stream.to_string(), "2m0s", "0 = kernel default");
    let o = opts(&[
        "--ebpf-map-size-conntrack=4096",
        "--conntrack-max-per-core=0",
    ]);
    assert_eq!(conntrack_params(&o.config, &o.ebpf, 4).max_entries, 4096);
    let o = opts(&["--conntrack-max-per-core=0"]);
    assert_eq!(conntrack_params(&o.config, &o.ebpf, 4).max_entries, 262144);
}
