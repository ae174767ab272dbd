//! The command line itself: every upstream flag exists, values parse like pflag, bad input
//! is a one-line error naming the flag.

use crate::options_common::*;
use proxy_agent::options::{OptionsError, Parsed};

/// Every flag of the kube-proxy v1.33 reference (seed 000).
const UPSTREAM_FLAGS: &[&str] = &[
    "add_dir_header",
    "alsologtostderr",
    "bind-address",
    "bind-address-hard-fail",
    "cleanup",
    "cluster-cidr",
    "config",
    "config-sync-period",
    "conntrack-max-per-core",
    "conntrack-min",
    "conntrack-tcp-be-liberal",
    "conntrack-tcp-timeout-close-wait",
    "conntrack-tcp-timeout-established",
    "conntrack-udp-timeout",
    "conntrack-udp-timeout-stream",
    "detect-local-mode",
    "feature-gates",
    "healthz-bind-address",
    "help",
    "hostname-override",
    "init-only",
    "iptables-localhost-nodeports",
    "iptables-masquerade-bit",
    "iptables-min-sync-period",
    "iptables-sync-period",
    "ipvs-exclude-cidrs",
    "ipvs-min-sync-period",
    "ipvs-scheduler",
    "ipvs-strict-arp",
    "ipvs-sync-period",
    "ipvs-tcp-timeout",
    "ipvs-tcpfin-timeout",
    "ipvs-udp-timeout",
    "kube-api-burst",
    "kube-api-content-type",
    "kube-api-qps",
    "kubeconfig",
    "log-flush-frequency",
    "log-text-info-buffer-size",
    "log-text-split-stream",
    "log_backtrace_at",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "logging-format",
    "logtostderr",
    "masquerade-all",
    "master",
    "metrics-bind-address",
    "nodeport-addresses",
    "one_output",
    "oom-score-adj",
    "pod-bridge-interface",
    "pod-interface-name-prefix",
    "profiling",
    "proxy-mode",
    "show-hidden-metrics-for-version",
    "skip_headers",
    "skip_log_headers",
    "stderrthreshold",
    "v",
    "version",
    "vmodule",
    "write-config-to",
];

/// Our own flags (`[ours]` in the help).
const OUR_FLAGS: &[&str] = &[
    "manifests",
    "ebpf-config",
    "ebpf-write-config-to",
    "ebpf-pod-interface-prefixes",
    "ebpf-external-interfaces",
    "ebpf-service-cidrs",
    "ebpf-xdp-mode",
    "ebpf-map-size-services",
    "ebpf-map-size-backend-slots",
    "ebpf-map-size-backends",
    "ebpf-map-size-conntrack",
    "ebpf-map-size-maglev-tables",
    "ebpf-lb-algorithm",
    "ebpf-maglev-table-size",
    "ebpf-socket-lb",
    "ebpf-socket-lb-host-namespace-only",
    "ebpf-socket-lb-cgroup-path",
    "ebpf-pin-root",
    "ebpf-detach-on-exit",
    "ebpf-state-dir",
];

/// Upstream flags hidden from the help (deprecated), like upstream.
const HIDDEN_UPSTREAM_FLAGS: &[&str] = &["healthz-port", "metrics-port"];

#[test]
fn every_accepted_flag_has_a_row() {
    // A flag added to the command line without a row in one of the tables fails here.
    let missing: Vec<String> = proxy_agent::options::flags::long_flag_names()
        .into_iter()
        .filter(|f| {
            !UPSTREAM_FLAGS.contains(&f.as_str())
                && !OUR_FLAGS.contains(&f.as_str())
                && !HIDDEN_UPSTREAM_FLAGS.contains(&f.as_str())
        })
        .collect();
    assert!(missing.is_empty(), "flags without a table row: {missing:?}");
}

#[test]
fn graduated_feature_gates_are_accepted_with_upstreams_warning() {
    // GA and deprecated gates v1.33 still registers (hidden from --help, like upstream's)
    let o = opts(&["--feature-gates=NFTablesProxyMode=true,KMSv1=false,LoggingAlphaOptions=true"]);
    assert_eq!(o.config.feature_gates.len(), 3);
    for w in [
        "Setting GA feature gate NFTablesProxyMode=true. It will be removed in a future release.",
        "Setting deprecated feature gate KMSv1=false. It will be removed in a future release.",
    ] {
        assert!(
            o.warnings.iter().any(|x| x == w),
            "{w} not in {:?}",
            o.warnings
        );
    }
    assert!(!o.warnings.iter().any(|w| w.contains("LoggingAlphaOptions")));
    let e = err(&["--feature-gates=NFTablesProxyMode=false"]);
    assert!(
        e.to_string().ends_with(
            "cannot set feature gate NFTablesProxyMode to false, feature is locked to true"
        ),
        "{e}"
    );
    // a GA gate that is not locked may be turned off
    assert!(matches!(
        try_parse(&["--feature-gates=MultiCIDRServiceAllocator=false"]),
        Ok(Parsed::Run(_))
    ));
}

fn help() -> String {
    match try_parse(&["--help"]).unwrap() {
        Parsed::Help(h) => h,
        other => panic!("{other:?}"),
    }
}

#[test]
fn help_lists_every_upstream_flag_and_ours() {
    let h = help();
    for f in UPSTREAM_FLAGS {
        assert!(
            h.contains(&format!("--{f} "))
                || h.contains(&format!("--{f}["))
                || h.contains(&format!("--{f}\n"))
                || h.contains(&format!("--{f}=")),
            "--{f} missing from help"
        );
    }
    assert!(h.contains("-v, --v"));
    for ours in [
        "--manifests",
        "--ebpf-config",
        "--ebpf-xdp-mode",
        "--ebpf-lb-algorithm",
        "--ebpf-socket-lb",
    ] {
        assert!(h.contains(ours), "{ours} missing");
    }
    assert!(
        !h.contains("--healthz-port"),
        "deprecated flags are hidden, like upstream"
    );
}

#[test]
fn every_upstream_flag_is_accepted() {
    let dir = TempDir::new("flags");
    let out = dir.path().join("w.yaml");
    let out = out.to_str().unwrap();
    // one value for each flag, of the right type
    let args = [
        "--add_dir_header",
        "--alsologtostderr=false",
        "--bind-address=10.0.0.1",
        "--bind-address-hard-fail",
        "--cluster-cidr=10.0.0.0/8",
        "--config-sync-period=1m",
        "--conntrack-max-per-core=0",
        "--conntrack-min=1",
        "--conntrack-tcp-be-liberal",
        "--conntrack-tcp-timeout-close-wait=1m",
        "--conntrack-tcp-timeout-established=1h",
        "--conntrack-udp-timeout=30s",
        "--conntrack-udp-timeout-stream=2m",
        "--detect-local-mode=ClusterCIDR",
        "--feature-gates=AllAlpha=false",
        "--healthz-bind-address=0.0.0.0:1",
        "--hostname-override=n1",
        "--iptables-localhost-nodeports=false",
        "--iptables-masquerade-bit=13",
        "--iptables-min-sync-period=2s",
        "--iptables-sync-period=20s",
        "--ipvs-exclude-cidrs=10.1.0.0/16",
        "--ipvs-min-sync-period=1s",
        "--ipvs-scheduler=rr",
        "--ipvs-strict-arp",
        "--ipvs-sync-period=20s",
        "--ipvs-tcp-timeout=1s",
        "--ipvs-tcpfin-timeout=1s",
        "--ipvs-udp-timeout=1s",
        "--kube-api-burst=20",
        "--kube-api-content-type=application/json",
        "--kube-api-qps=7.5",
        "--kubeconfig=/k",
        "--log-flush-frequency=3s",
        "--log-text-info-buffer-size=2Ki",
        "--log-text-split-stream",
        "--log_backtrace_at=a.go:3",
        "--log_dir=/d",
        "--log_file=/f",
        "--log_file_max_size=10",
        "--logging-format=text",
        "--logtostderr",
        "--masquerade-all",
        "--master=https://x",
        "--metrics-bind-address=127.0.0.1:2",
        "--nodeport-addresses=10.0.0.0/8",
        "--one_output",
        "--oom-score-adj=-10",
        "--pod-bridge-interface=br0",
        "--pod-interface-name-prefix=veth",
        "--profiling",
        "--proxy-mode=iptables",
        "--show-hidden-metrics-for-version=1.32",
        "--skip_headers",
        "--skip_log_headers",
        "--stderrthreshold=ERROR",
        "-v=3",
        "--vmodule=a.go=2",
        "--write-config-to",
        out,
        "--init-only",
        "--cleanup=false",
        "--version=false",
    ];
    let mut with_gate = args.to_vec();
    with_gate[14] = "--feature-gates=LoggingAlphaOptions=true";
    let o = opts(&with_gate);
    let c = &o.config;
    assert_eq!(c.bind_address, "10.0.0.1");
    assert!(
        c.bind_address_hard_fail
            && c.enable_profiling
            && c.conntrack.tcp_be_liberal
            && c.ipvs.strict_arp
    );
    assert_eq!(c.client_connection.qps, 7.5);
    assert_eq!(c.client_connection.burst, 20);
    assert_eq!(c.conntrack.max_per_core, Some(0));
    assert_eq!(c.iptables.localhost_node_ports, Some(false));
    assert_eq!(c.iptables.masquerade_bit, Some(13));
    assert_eq!(c.iptables.sync_period.to_string(), "20s");
    assert_eq!(c.oom_score_adj, Some(-10));
    assert_eq!(c.logging.verbosity, 3);
    assert_eq!(c.logging.options.text.info_buffer_size.value(), 2048);
    assert_eq!(o.master, "https://x");
    assert!(o.init_only && !o.cleanup);
    assert_eq!(o.node_name, "n1");
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("--log_dir") && w.contains("no effect")),
        "{:?}",
        o.warnings
    );
}

#[test]
fn bad_values_are_one_line_errors_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--iptables-sync-period=abc"], "--iptables-sync-period"),
        (
            &["--conntrack-tcp-timeout-established", "5"],
            "--conntrack-tcp-timeout-established",
        ),
        (&["--kube-api-burst=ten"], "--kube-api-burst"),
        (&["--oom-score-adj=99999999999"], "--oom-score-adj"),
        (&["--kube-api-qps=fast"], "--kube-api-qps"),
        (
            &["--healthz-bind-address=1.2.3:80"],
            "--healthz-bind-address",
        ),
        (
            &["--metrics-bind-address=127.0.0.1:http"],
            "--metrics-bind-address",
        ),
        (
            &["--log-text-info-buffer-size=lots"],
            "--log-text-info-buffer-size",
        ),
        (&["--feature-gates=Foo"], "--feature-gates"),
        (&["--vmodule=a.go"], "--vmodule"),
        (&["--cleanup=yes"], "--cleanup"),
        (&["-v=x"], "--v"),
        (&["--no-such-flag"], "--no-such-flag"),
        (&["--config"], "--config"),
    ];
    for (args, flag) in cases {
        let e = err(args);
        let text = e.to_string();
        assert!(matches!(e, OptionsError::Flag { .. }), "{args:?}: {e:?}");
        assert!(text.contains(flag), "{args:?}: {text}");
        assert!(!text.contains('\n'), "{args:?}: {text:?}");
    }
}

#[test]
fn unknown_flags_are_named_as_pflag_names_them() {
    for (args, want) in [
        (&["--x"][..], "unknown flag: --x"),
        (&["--x=5"][..], "unknown flag: --x"),
        (
            &["--iptables-sync-periods", "5s"][..],
            "unknown flag: --iptables-sync-periods",
        ),
        (&["-x"][..], "unknown shorthand flag: 'x' in -x"),
    ] {
        let e = err(args);
        assert!(matches!(e, OptionsError::Flag { .. }), "{args:?}: {e:?}");
        assert_eq!(e.to_string(), want, "{args:?}");
    }
}

#[test]
fn malformed_ip_cidr_in_string_flags_fail_in_validation_naming_the_field() {
    for (args, field) in [
        (&["--bind-address=1.2.3.400"][..], "bindAddress"),
        (&["--cluster-cidr=10.0.0.0/40"][..], "clusterCIDR"),
        (
            &["--ipvs-exclude-cidrs=nope", "--proxy-mode=ipvs"][..],
            "ipvs.excludeCIDRs[0]",
        ),
    ] {
        let e = err(args);
        assert!(e.to_string().contains(field), "{args:?}: {e}");
        assert!(!e.to_string().contains('\n'));
    }
}

#[test]
fn positional_arguments_are_rejected() {
    let e = err(&["extra"]);
    assert_eq!(
        e.to_string(),
        "\"kube-proxy\" does not take any arguments, got [\"extra\"]"
    );
    // pflag booleans never take a separate value
    assert!(matches!(
        err(&["--cleanup", "true"]),
        OptionsError::UnexpectedArgs { .. }
    ));
}

#[test]
fn pflag_conventions() {
    assert!(opts(&["--cleanup"]).cleanup);
    assert!(opts(&["--cleanup=true"]).cleanup);
    assert!(opts(&["--cleanup=T"]).cleanup);
    assert!(!opts(&["--cleanup=0"]).cleanup);
    assert_eq!(opts(&["-v", "4"]).config.logging.verbosity, 4);
    assert_eq!(opts(&["--v=5"]).config.logging.verbosity, 5);
    assert_eq!(opts(&["-v4"]).config.logging.verbosity, 4);
    // last value wins; lists accumulate
    assert_eq!(
        opts(&["--kube-api-burst=1", "--kube-api-burst=2"])
            .config
            .client_connection
            .burst,
        2
    );
    assert_eq!(
        opts(&[
            "--nodeport-addresses=10.0.0.0/8",
            "--nodeport-addresses",
            "192.168.0.0/16,fd00::/64"
        ])
        .config
        .node_port_addresses,
        ["10.0.0.0/8", "192.168.0.0/16", "fd00::/64"]
    );
    // an empty value is pflag's empty list (StringSlice.Set("") gives []), not `[""]`
    for flag in ["--nodeport-addresses=", "--nodeport-addresses"] {
        let o = if flag.ends_with('=') {
            opts(&[flag])
        } else {
            opts(&[flag, ""])
        };
        assert!(o.config.node_port_addresses.is_empty(), "{flag}");
    }
    let o = opts(&["--proxy-mode=ipvs", "--ipvs-exclude-cidrs="]);
    assert!(o.config.ipvs.exclude_cidrs.is_empty());
    let o = opts(&["--ebpf-external-interfaces="]);
    assert!(o.ebpf.external_interfaces.is_empty());
    assert_eq!(
        opts(&["--nodeport-addresses=", "--nodeport-addresses=10.0.0.0/8"])
            .config
            .node_port_addresses,
        ["10.0.0.0/8"]
    );
    // an empty entry inside a list is still an entry (and invalid)
    assert!(
        err(&["--nodeport-addresses=10.0.0.0/8,"])
            .to_string()
            .contains("nodePortAddresses[1]")
    );
    // word separators are normalised both ways
    assert_eq!(
        opts(&["--iptables_sync_period=11s"])
            .config
            .iptables
            .sync_period
            .to_string(),
        "11s"
    );
    assert!(
        opts(&["--log-dir=/tmp"])
            .warnings
            .iter()
            .any(|w| w.contains("--log_dir"))
    );
    assert_eq!(
        opts(&["--oom-score-adj", "-500"]).config.oom_score_adj,
        Some(-500)
    );
}

#[test]
fn version_flag() {
    match try_parse(&["--version"]).unwrap() {
        Parsed::Version(v) => assert!(v.starts_with("Kubernetes v1.33.0"), "{v}"),
        other => panic!("{other:?}"),
    }
    match try_parse(&["--version=raw"]).unwrap() {
        Parsed::Version(v) => assert!(
            v.starts_with("version.Info{Major:\"1\", Minor:\"33\""),
            "{v}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(opts(&["--version=v1.99.1"]).reported_version, "v1.99.1");
    assert!(matches!(
        try_parse(&["--version=false"]).unwrap(),
        Parsed::Run(_)
    ));
    // bad flags are still reported before --version is honoured
    assert!(try_parse(&["--version", "--bogus"]).is_err());
}

#[test]
fn service_cidrs_come_from_the_flag_and_are_validated() {
    let o = opts(&["--ebpf-service-cidrs=198.19.0.0/16,2001:db8:ffff::/108"]);
    let cidrs: Vec<String> = o
        .ebpf
        .service_cidrs()
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(cidrs, ["198.19.0.0/16", "2001:db8:ffff::/108"]);
    assert!(opts(&[]).ebpf.service_cidrs().is_empty());
    let e = err(&["--ebpf-service-cidrs=198.19.0.0/33"]).to_string();
    assert!(
        e.contains("serviceCIDRs[0]") && e.contains("must be a CIDR"),
        "{e}"
    );
}
