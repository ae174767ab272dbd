//! Every validation rule of config_rules.md §1/§1.1/§4, as a table: a config file body, the
//! field path that must be reported, and the exact detail text.

use crate::options_common::*;
use proxy_agent::options::{OptionsError, Parsed};

fn errors_of(body: &str) -> Vec<String> {
    match parse_file(body) {
        Err(OptionsError::Validation(errs)) => errs.0.iter().map(|e| e.to_string()).collect(),
        Err(other) => panic!("expected a validation error for {body:?}, got {other}"),
        Ok(Parsed::Run(_)) => Vec::new(),
        Ok(other) => panic!("unexpected {other:?}"),
    }
}

/// (file body, expected error line). Each line is exactly what the operator sees.
const INVALID: &[(&str, &str)] = &[
    (
        "featureGates:\n  NoSuchGate: true\n",
        "featureGates: Invalid value: map[string]bool{\"NoSuchGate\":true}: unrecognized feature gate: NoSuchGate",
    ),
    (
        // a gate locked to its default (GA in v1.33) cannot be flipped
        "featureGates:\n  NFTablesProxyMode: false\n",
        "featureGates: Invalid value: map[string]bool{\"NFTablesProxyMode\":false}: cannot set feature gate NFTablesProxyMode to false, feature is locked to true",
    ),
    (
        "clientConnection:\n  burst: -1\n",
        "clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
    ),
    (
        "logging:\n  format: json\n",
        "logging.format: Invalid value: \"json\": Unsupported log format",
    ),
    (
        "logging:\n  vmodule:\n  - filePattern: \"\"\n    verbosity: 2\n",
        "logging.vmodule[0].filePattern: Invalid value: \"\": file pattern must not be empty",
    ),
    (
        "logging:\n  options:\n    text:\n      splitStream: true\n",
        "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
    ),
    (
        "logging:\n  options:\n    text:\n      infoBufferSize: 1Ki\n",
        "logging.options.text.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled",
    ),
    (
        "logging:\n  options:\n    json:\n      splitStream: true\n      infoBufferSize: 1Ki\n",
        "logging.options.json.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
    ),
    (
        "logging:\n  options:\n    json:\n      infoBufferSize: 1Ki\n",
        "logging.options.json.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled",
    ),
    (
        "logging:\n  flushFrequency: -1s\n",
        "logging.flushFrequency: Invalid value: -1s: must be greater than 0",
    ),
    (
        "bindAddress: 1.2.3\n",
        "bindAddress: Invalid value: \"1.2.3\": must be a valid IP (e.g. 10.100.0.0 or fde4:8dba:82e1::)",
    ),
    (
        "bindAddress: 1.2.3.4,5.6.7.8\n",
        "bindAddress: Invalid value: \"1.2.3.4,5.6.7.8\": must be a either a single IP or dual-stack pair of IPs (e.g. [10.100.0.0, fde4:8dba:82e1::])",
    ),
    (
        "healthzBindAddress: 10.10.10.10:0\n",
        "healthzBindAddress: Invalid value: \"0\": must be a valid port",
    ),
    (
        "healthzBindAddress: 10.10.10.10:65536\n",
        "healthzBindAddress: Invalid value: \"65536\": must be a valid port",
    ),
    (
        "healthzBindAddress: foo:10256\n",
        "healthzBindAddress: Invalid value: \"foo\": must be a valid IP",
    ),
    (
        "healthzBindAddress: foo\n",
        "healthzBindAddress: Invalid value: \"foo\": must be IP:port",
    ),
    (
        // Go's SplitHostPort rejects a stray ']' (so this is not "must be a valid IP")
        "healthzBindAddress: \"1.2.3.4]:80\"\n",
        "healthzBindAddress: Invalid value: \"1.2.3.4]:80\": must be IP:port",
    ),
    (
        "metricsBindAddress: 127.0.0.1:x\n",
        "metricsBindAddress: Invalid value: \"x\": must be a valid port",
    ),
    (
        "showHiddenMetricsForVersion: \"1.20\"\n",
        "showHiddenMetricsForVersion: Invalid value: \"1.20\": --show-hidden-metrics-for-version must be omitted or have the value '1.32'. Only the previous minor version is allowed",
    ),
    (
        "mode: kernelspace\n",
        "mode: Invalid value: \"kernelspace\": must be iptables, ipvs, nftables, ebpf or blank (blank means the best-available proxy [currently ebpf where the kernel supports it, else nftables, else iptables])",
    ),
    (
        "iptables:\n  masqueradeBit: 32\n",
        "iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
    ),
    (
        "iptables:\n  masqueradeBit: -1\n",
        "iptables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]",
    ),
    (
        "mode: ipvs\niptables:\n  masqueradeBit: 40\n",
        "iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]",
    ),
    (
        "iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 5s\n",
        "iptables.syncPeriod: Invalid value: 5s: must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod",
    ),
    (
        "iptables:\n  minSyncPeriod: -1s\n",
        "iptables.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: ipvs\nipvs:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n",
        "ipvs.syncPeriod: Invalid value: 2s: must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod",
    ),
    (
        "mode: ipvs\nipvs:\n  minSyncPeriod: -1s\n",
        "ipvs.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: nftables\nnftables:\n  minSyncPeriod: -1s\n",
        "nftables.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: nftables\nnftables:\n  syncPeriod: -5s\n",
        "nftables.syncPeriod: Invalid value: -5s: must be greater than 0",
    ),
    (
        "mode: ipvs\nipvs:\n  tcpTimeout: -1s\n",
        "ipvs.tcpTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: ipvs\nipvs:\n  tcpFinTimeout: -1s\n",
        "ipvs.tcpFinTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: ipvs\nipvs:\n  udpTimeout: -1s\n",
        "ipvs.udpTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "mode: ipvs\nipvs:\n  excludeCIDRs: [10.0.0.0/8, 10.0.0.1]\n",
        "ipvs.excludeCIDRs[1]: Invalid value: \"10.0.0.1\": must be a valid CIDR",
    ),
    (
        "mode: nftables\nnftables:\n  masqueradeBit: 32\n",
        "nftables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
    ),
    (
        "conntrack:\n  maxPerCore: -1\n",
        "conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
    ),
    (
        "conntrack:\n  min: -1\n",
        "conntrack.min: Invalid value: -1: must be greater than or equal to 0",
    ),
    (
        "conntrack:\n  tcpEstablishedTimeout: -1s\n",
        "conntrack.tcpEstablishedTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "conntrack:\n  tcpCloseWaitTimeout: -1s\n",
        "conntrack.tcpCloseWaitTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "conntrack:\n  udpTimeout: -1s\n",
        "conntrack.udpTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "conntrack:\n  udpStreamTimeout: -1s\n",
        "conntrack.udpStreamTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ),
    (
        "configSyncPeriod: -1s\n",
        "configSyncPeriod: Invalid value: -1s: must be greater than 0",
    ),
    (
        "oomScoreAdj: 1001\n",
        "oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]",
    ),
    (
        "oomScoreAdj: -1001\n",
        "oomScoreAdj: Invalid value: -1001: must be within the range [-1000, 1000]",
    ),
    (
        "detectLocalMode: Guess\n",
        "detectLocalMode: Unsupported value: \"Guess\": supported values: \"ClusterCIDR\", \"NodeCIDR\", \"BridgeInterface\", \"InterfaceNamePrefix\", \"\"",
    ),
    (
        "detectLocalMode: BridgeInterface\n",
        "detectLocal.bridgeInterface: Invalid value: \"\": must not be empty",
    ),
    (
        "detectLocalMode: InterfaceNamePrefix\n",
        "detectLocal.interfaceNamePrefix: Invalid value: \"\": must not be empty",
    ),
    (
        "clusterCIDR: 10.0.0.0/16,192.168.0.0/16\n",
        "clusterCIDR: Invalid value: \"10.0.0.0/16,192.168.0.0/16\": must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]",
    ),
    (
        "clusterCIDR: 10.0.0.0/16,fd00::/48,fd01::/48\n",
        "clusterCIDR: Invalid value: \"10.0.0.0/16,fd00::/48,fd01::/48\": must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]",
    ),
    (
        "clusterCIDR: 10.0.0.0\n",
        "clusterCIDR: Invalid value: \"10.0.0.0\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
    ),
    (
        "portRange: 2000-300\n",
        "portRange: Invalid value: \"2000-300\": must be a valid port range (e.g. 300-2000)",
    ),
    (
        // ParsePortRange trims the value, not its parts
        "portRange: 300 - 2000\n",
        "portRange: Invalid value: \"300 - 2000\": must be a valid port range (e.g. 300-2000)",
    ),
    (
        "portRange: 300-400+5\n",
        "portRange: Invalid value: \"300-400+5\": must be a valid port range (e.g. 300-2000)",
    ),
    (
        "portRange: abc\n",
        "portRange: Invalid value: \"abc\": must be a valid port range (e.g. 300-2000)",
    ),
    (
        "nodePortAddresses: [primary, 127.0.0.1/32]\n",
        "nodePortAddresses[0]: Invalid value: \"primary\": can't use both 'primary' and CIDRs",
    ),
    (
        "nodePortAddresses: [10.20.30.40]\n",
        "nodePortAddresses[0]: Invalid value: \"10.20.30.40\": must be a valid CIDR",
    ),
    (
        "nodePortAddresses: [\"::1\"]\n",
        "nodePortAddresses[0]: Invalid value: \"::1\": must be a valid CIDR",
    ),
];

#[test]
fn each_rule_reports_path_value_and_message() {
    for (body, want) in INVALID {
        let got = errors_of(body);
        assert!(
            got.iter().any(|g| g == want),
            "file {body:?}\n  want: {want}\n  got:  {got:?}"
        );
    }
}

/// Values at the edge of each rule that must pass.
const VALID: &[&str] = &[
    "",
    "iptables:\n  masqueradeBit: 0\n",
    "iptables:\n  masqueradeBit: 31\n",
    "oomScoreAdj: -1000\n",
    "oomScoreAdj: 1000\n",
    "iptables:\n  syncPeriod: 5s\n  minSyncPeriod: 5s\n",
    "mode: ipvs\nipvs:\n  minSyncPeriod: 0s\n  excludeCIDRs: [10.0.0.0/8, \"fd00::/64\"]\n",
    "mode: nftables\niptables:\n  syncPeriod: 1s\n  minSyncPeriod: 9s\n  masqueradeAll: true\n",
    "mode: iptables\nnftables:\n  masqueradeBit: 99\n",
    "mode: iptables\nipvs:\n  tcpTimeout: -1s\n  excludeCIDRs: [nonsense]\n",
    "mode: ebpf\n",
    "bindAddress: \"::\"\n",
    "bindAddress: \"[::]\"\n",
    "bindAddress: ::0\n",
    "bindAddress: 10.0.0.1,fd00::1\n",
    "healthzBindAddress: \"[::1]:8080\"\n",
    "detectLocalMode: NodeCIDR\nclusterCIDR: garbage\n",
    "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n",
    "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n",
    "clusterCIDR: 10.0.0.0/16,fd00::/48\n",
    "clusterCIDR: fd00::/48\n",
    "portRange: 300-2000\n",
    "portRange: 300+100\n",
    "portRange: \" 300-2000 \"\n",
    "portRange: \"8080\"\n",
    "nodePortAddresses: [primary]\n",
    "nodePortAddresses: [127.0.0.0/8, \"::1/128\"]\n",
    "showHiddenMetricsForVersion: \"1.32\"\n",
    "featureGates:\n  LoggingAlphaOptions: true\nlogging:\n  options:\n    text:\n      splitStream: true\n      infoBufferSize: 1Ki\n",
    "conntrack:\n  maxPerCore: 0\n  min: 0\n",
    // GA and deprecated gates v1.33 still knows are accepted (locked ones at their default)
    "featureGates:\n  NFTablesProxyMode: true\n  TopologyAwareHints: true\n  KMSv1: false\n  ServiceTrafficDistribution: true\n",
    // ParseIPSloppy / ParseCIDRSloppy: leading zeros in IPv4 octets and prefix lengths
    "bindAddress: 010.000.000.001\nclusterCIDR: 010.0.0.0/08\nnodePortAddresses: [\"010.0.0.0/8\"]\nhealthzBindAddress: 010.0.0.1:10256\n",
    "mode: ipvs\nipvs:\n  excludeCIDRs: [\"192.168.001.0/24\"]\n",
];

#[test]
fn edge_values_pass() {
    for body in VALID {
        let got = errors_of(body);
        assert!(got.is_empty(), "file {body:?} should be valid, got {got:?}");
    }
}

#[test]
fn negative_sync_period_gives_both_errors() {
    let got = errors_of("iptables:\n  syncPeriod: -1s\n");
    assert_eq!(
        got,
        vec![
            "iptables.syncPeriod: Invalid value: -1s: must be greater than 0",
            // upstream reports minSyncPeriod's value here (field.Invalid(.., config.MinSyncPeriod, ..))
            "iptables.syncPeriod: Invalid value: 1s: must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod",
        ]
    );
}

#[test]
fn all_errors_are_reported_at_once_in_one_line() {
    let e = parse_file("oomScoreAdj: 5000\nconfigSyncPeriod: -1s\n").unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("failed validate: ["), "{text}");
    assert!(
        text.contains("oomScoreAdj") && text.contains("configSyncPeriod"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    assert_eq!(
        e.field_errors().unwrap().paths(),
        ["oomScoreAdj", "configSyncPeriod"]
    );
}

#[test]
fn the_flag_path_is_validated_too() {
    let e = err(&["--iptables-masquerade-bit=32"]);
    assert_eq!(
        e.to_string(),
        "failed validate: iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]"
    );
    let e = err(&["--nodeport-addresses=10.0.0.0/8,1.2.3.4"]);
    assert!(
        e.to_string()
            .contains("nodePortAddresses[1]: Invalid value: \"1.2.3.4\": must be a valid CIDR"),
        "{e}"
    );
    let e = err(&[
        "--detect-local-mode=ClusterCIDR",
        "--cluster-cidr=10.0.0.0/33",
    ]);
    assert!(
        e.to_string()
            .contains("clusterCIDR: Invalid value: \"10.0.0.0/33\""),
        "{e}"
    );
    assert!(
        err(&["--proxy-mode=userspace"])
            .to_string()
            .contains("mode: Invalid value: \"userspace\"")
    );
    assert!(
        err(&["--feature-gates=Bogus=true"])
            .to_string()
            .contains("unrecognized feature gate: Bogus")
    );
    assert!(
        err(&["--show-hidden-metrics-for-version=1.2"])
            .to_string()
            .contains("showHiddenMetricsForVersion")
    );
}

#[test]
fn ebpf_extension_rules() {
    let dir = TempDir::new("ebpfval");
    let cases: &[(&str, &str)] = &[
        ("maps:\n  services: 0\n", ""),
        (
            "maps:\n  services: 16777217\n",
            "maps.services: Invalid value: 16777217: must be within the range [1, 16777216]",
        ),
        (
            "maps:\n  backends: 99999999\n",
            "maps.backends: Invalid value: 99999999: must be within the range [1, 16777216]",
        ),
        (
            "maps:\n  conntrack: 10\n",
            "maps.conntrack: Invalid value: 10: must be 0 (derive from conntrack settings) or within the range [1024, 16777216]",
        ),
        (
            "loadBalancing:\n  algorithm: maglev\n  maglevTableSize: 1000\n",
            "loadBalancing.maglevTableSize: Invalid value: 1000: must be a prime number within the range [251, 131071]",
        ),
        (
            "loadBalancing:\n  maglevTableSize: 131101\n",
            "loadBalancing.maglevTableSize: Invalid value: 131101: must be a prime number within the range [251, 131071]",
        ),
        (
            "maps:\n  maglevTables: 600\nloadBalancing:\n  maglevTableSize: 131071\n",
            "maps.maglevTables: Invalid value: 600: 600 tables of loadBalancing.maglevTableSize 131071 buckets need 19660800 map elements, more than 16777216",
        ),
        ("maps:\n  maglevTables: 4096\n", ""),
        (
            "podInterfacePrefixes: [\"\"]\n",
            "podInterfacePrefixes[0]: Invalid value: \"\": must be a non-empty interface name prefix of at most 15 characters without '/', ':' or spaces",
        ),
        (
            "externalInterfaces: [eth0, \"a/b\"]\n",
            "externalInterfaces[1]: Invalid value: \"a/b\": must be a valid interface name (1-15 characters, no '/', ':' or spaces)",
        ),
        (
            "serviceCIDRs: [198.19.0.0/16, \"2001:db8:ffff::/108\", 10.96.0.1]\n",
            "serviceCIDRs[2]: Invalid value: \"10.96.0.1\": must be a CIDR (198.19.0.0/16, 2001:db8:ffff::/108)",
        ),
        (
            "xdpMode: native\nsocketLB:\n  enabled: false\nloadBalancing:\n  algorithm: maglev\n  maglevTableSize: 65537\nserviceCIDRs: [198.19.0.0/16, \"2001:db8:ffff::/108\"]\n",
            "",
        ),
    ];
    for (body, want) in cases {
        let p = dir.file(
            "ebpf.yaml",
            &format!("apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\n{body}"),
        );
        let r = try_parse(&["--ebpf-config", p.to_str().unwrap()]);
        match (r, want.is_empty()) {
            (Ok(_), true) => {}
            (Err(OptionsError::EbpfValidation(errs)), false) => {
                assert_eq!(errs.to_string(), *want, "{body:?}");
            }
            (other, _) => panic!("{body:?}: expected {want:?}, got {other:?}"),
        }
    }
    // the same rules reach the flags
    let e = err(&["--ebpf-maglev-table-size=100"]);
    assert!(matches!(e, OptionsError::EbpfValidation(_)), "{e}");
    assert!(
        err(&["--ebpf-xdp-mode=turbo"])
            .to_string()
            .contains("--ebpf-xdp-mode")
    );
}

/// Fields without any validation rule upstream (or whose checks live elsewhere: apiVersion and
/// kind in decoding, hostnameOverride in the node name). Every other field must have a row in
/// `INVALID`; `every_field_has_a_rule_row_or_is_listed_as_unvalidated` enforces it, so a new
/// field cannot be added without deciding which it is.
const NOT_VALIDATED: &[&str] = &[
    "apiVersion",
    "kind",
    "clientConnection.kubeconfig",
    "clientConnection.acceptContentTypes",
    "clientConnection.contentType",
    "clientConnection.qps",
    "logging.verbosity",
    "hostnameOverride",
    "bindAddressHardFail",
    "enableProfiling",
    "iptables.masqueradeAll",
    "iptables.localhostNodePorts",
    "ipvs.scheduler",
    "ipvs.strictARP",
    "nftables.masqueradeAll",
    "winkernel.networkName",
    "winkernel.sourceVip",
    "winkernel.enableDSR",
    "winkernel.rootHnsEndpointName",
    "winkernel.forwardHealthCheckVip",
    "conntrack.tcpBeLiberal",
    "windowsRunAsService",
];

#[test]
fn every_field_has_a_rule_row_or_is_listed_as_unvalidated() {
    let schema = proxy_agent::options::merge::kube_proxy_schema();
    let mut missing = Vec::new();
    for leaf in leaf_paths(&schema) {
        let has_row = INVALID.iter().any(|(_, want)| {
            want.strip_prefix(leaf.as_str()).is_some_and(|rest| {
                rest.starts_with(':') || rest.starts_with('[') || rest.starts_with('.')
            })
        });
        let listed = NOT_VALIDATED.contains(&leaf.as_str());
        assert!(
            !(has_row && listed),
            "{leaf} has a rule row but is listed as unvalidated"
        );
        if !has_row && !listed {
            missing.push(leaf);
        }
    }
    assert!(
        missing.is_empty(),
        "no validation row (and not listed as unvalidated): {missing:?}"
    );
}
