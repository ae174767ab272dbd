//! Every kube-proxy flag (reference v1.33, seed 000) with upstream's name, type and default,
//! plus our own `--manifests` and `--ebpf-*` flags. Parsing follows pflag's conventions:
//! `--flag=value` or `--flag value`, booleans as `--flag` / `--flag=false`, a repeated flag's
//! last value wins (lists append), and `_` and `-` are interchangeable in names.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};

use super::duration::GoDuration;
use super::ebpf::{LbAlgorithm, XdpMode};
use super::error::OptionsError;
use super::features;
use super::quantity::Quantity;
use super::types::VModuleItem;
use super::validate::{parse_ip, split_host_port};

fn go_bool(s: &str) -> Result<bool, String> {
    features::parse_go_bool(s)
        .ok_or_else(|| format!("strconv.ParseBool: parsing {s:?}: invalid syntax"))
}
fn go_duration(s: &str) -> Result<GoDuration, String> {
    GoDuration::parse(s).map_err(|e| e.to_string())
}
fn go_i32(s: &str) -> Result<i32, String> {
    s.parse::<i32>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            format!("strconv.ParseInt: parsing {s:?}: value out of range")
        }
        _ => format!("strconv.ParseInt: parsing {s:?}: invalid syntax"),
    })
}
fn go_u32(s: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|_| format!("strconv.ParseUint: parsing {s:?}: invalid syntax"))
}
fn go_u64(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .map_err(|_| format!("strconv.ParseUint: parsing {s:?}: invalid syntax"))
}
fn go_f32(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .map_err(|_| format!("strconv.ParseFloat: parsing {s:?}: invalid syntax"))
}
/// component-base `IPPortVar`: an IP or IP:port; a blank value is stored as empty.
fn ip_port(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Ok(String::new());
    }
    if parse_ip(s).is_some() {
        return Ok(s.to_string());
    }
    let (host, port) = split_host_port(s)
        .ok_or_else(|| format!("{s:?} is not in a valid format (ip or ip:port)"))?;
    if parse_ip(host).is_none() {
        return Err(format!("{host:?} is not a valid IP address"));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a valid number"))?;
    Ok(s.to_string())
}
fn quantity(s: &str) -> Result<Quantity, String> {
    Quantity::parse(s).map_err(|e| e.to_string())
}
fn feature_gates(s: &str) -> Result<BTreeMap<String, bool>, String> {
    features::parse_flag(s)
}
/// The value of `--vmodule`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VModuleList(pub Vec<VModuleItem>);

/// `--vmodule pattern=N,...`
fn vmodule(s: &str) -> Result<VModuleList, String> {
    let mut out = Vec::new();
    for pat in s.split(',').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pat.split('=').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(format!("{pat:?} does not have the pattern=N format"));
        }
        let v = parts[1]
            .parse::<u32>()
            .ok()
            .filter(|v| *v <= i32::MAX as u32)
            .ok_or_else(|| format!("parsing verbosity in {pat:?}: invalid syntax"))?;
        out.push(VModuleItem {
            file_pattern: parts[0].to_string(),
            verbosity: v,
        });
    }
    Ok(VModuleList(out))
}
/// klog severity: a name or 0..3.
fn severity(s: &str) -> Result<String, String> {
    match s.to_ascii_uppercase().as_str() {
        "INFO" | "WARNING" | "ERROR" | "FATAL" | "0" | "1" | "2" | "3" => Ok(s.to_string()),
        _ => Err(format!("unknown severity {s:?}")),
    }
}
/// klog `file:N` trace location.
fn trace_location(s: &str) -> Result<String, String> {
    if s.is_empty() || s == ":0" {
        return Ok(s.to_string());
    }
    match s.rsplit_once(':') {
        Some((f, n)) if !f.is_empty() && n.parse::<u32>().is_ok() => Ok(s.to_string()),
        _ => Err("syntax error: expect file.go:234".into()),
    }
}
fn version_value(s: &str) -> Result<String, String> {
    match s {
        "raw" => Ok(s.into()),
        v if features::parse_go_bool(v).is_some() => Ok(v.into()),
        v if v.starts_with('v') && v[1..].split('.').count() >= 2 => Ok(v.into()),
        v => Err(format!(
            "invalid value {v:?}: must be true, false, raw or a version like v1.33.0"
        )),
    }
}
fn xdp_mode(s: &str) -> Result<XdpMode, String> {
    match s {
        "auto" => Ok(XdpMode::Auto),
        "native" => Ok(XdpMode::Native),
        "generic" => Ok(XdpMode::Generic),
        "disabled" => Ok(XdpMode::Disabled),
        _ => Err(format!(
            "{s:?} is not one of auto, native, generic, disabled"
        )),
    }
}
fn lb_algorithm(s: &str) -> Result<LbAlgorithm, String> {
    match s {
        "random" => Ok(LbAlgorithm::Random),
        "maglev" => Ok(LbAlgorithm::Maglev),
        _ => Err(format!("{s:?} is not one of random, maglev")),
    }
}

/// The command line. Field docs are the help text.
#[derive(Debug, Clone, Parser)]
#[command(
    about = "Node network proxy for Kubernetes Services: a drop-in kube-proxy replacement whose \
             ebpf mode programs Services into XDP/TC programs; the iptables, ipvs and nftables \
             modes behave as upstream's.",
    disable_version_flag = true,
    args_override_self = true,
    max_term_width = 100
)]
pub struct Flags {
    // ---- files and one-shot actions ---------------------------------------------------
    /// Path to a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file, YAML or JSON. When given, the file replaces every config flag except --hostname-override and the logging flags.
    #[arg(long, value_name = "string")]
    pub config: Option<PathBuf>,
    /// Write the fully defaulted configuration (flags or --config, plus defaults) to this file and exit.
    #[arg(long = "write-config-to", value_name = "string")]
    pub write_config_to: Option<PathBuf>,
    /// Remove every rule, table, interface and BPF object any proxy mode (ours or upstream kube-proxy's) left on this node, report it, and exit.
    #[arg(long, value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub cleanup: bool,
    /// Do only the steps that need full root (conntrack sysctls, mode set-up) and exit; the proxy can then run with CAP_NET_ADMIN only.
    #[arg(long = "init-only", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub init_only: bool,
    /// --version or --version=raw prints version information and exits; --version=vX.Y.Z sets the version reported.
    #[arg(long, value_name = "version[=true]", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = version_value)]
    pub version: Option<String>,

    // ---- API server --------------------------------------------------------------------
    /// Path to a kubeconfig file with the credentials for the API server (its server address can be overridden with --master).
    #[arg(long, value_name = "string", default_value = "")]
    pub kubeconfig: String,
    /// Address of the Kubernetes API server; overrides the one in the kubeconfig.
    #[arg(long, value_name = "string", default_value = "")]
    pub master: String,
    /// Maximum burst of requests to the API server.
    #[arg(long = "kube-api-burst", value_name = "int32", default_value = "10", value_parser = go_i32)]
    pub kube_api_burst: i32,
    /// Content type of requests sent to the API server.
    #[arg(
        long = "kube-api-content-type",
        value_name = "string",
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: String,
    /// Queries per second allowed towards the API server.
    #[arg(long = "kube-api-qps", value_name = "float", default_value = "5", value_parser = go_f32)]
    pub kube_api_qps: f32,
    /// How often the Service/EndpointSlice/Node informers resync from the API server. Must be greater than 0.
    #[arg(long = "config-sync-period", value_name = "duration", default_value = "15m0s", value_parser = go_duration)]
    pub config_sync_period: GoDuration,

    // ---- identity and addresses --------------------------------------------------------
    /// Name of this node, used instead of the OS hostname (trimmed and lower-cased). Still honoured with --config.
    #[arg(long = "hostname-override", value_name = "string", default_value = "")]
    pub hostname_override: String,
    /// This node's primary IP, or a dual-stack pair "IPv4,IPv6". Despite the name nothing binds to it. Ignored with --config.
    #[arg(
        long = "bind-address",
        value_name = "string",
        default_value = "0.0.0.0"
    )]
    pub bind_address: String,
    /// Exit when a server port cannot be bound, instead of only logging it.
    #[arg(long = "bind-address-hard-fail", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub bind_address_hard_fail: bool,
    /// IP and port of the health check server (/healthz, /livez). Empty disables it. Ignored with --config.
    #[arg(long = "healthz-bind-address", value_name = "ipport", default_value = "0.0.0.0:10256", value_parser = ip_port)]
    pub healthz_bind_address: String,
    /// IP and port of the metrics server ("0.0.0.0:10249" or "[::]:10249" for all interfaces). Empty disables it. Ignored with --config.
    #[arg(long = "metrics-bind-address", value_name = "ipport", default_value = "127.0.0.1:10249", value_parser = ip_port)]
    pub metrics_bind_address: String,
    /// Deprecated: use --healthz-bind-address. Port of the health check server; 0 disables it.
    #[arg(long = "healthz-port", value_name = "int32", default_value = "10256", value_parser = go_i32, hide = true)]
    pub healthz_port: i32,
    /// Deprecated: use --metrics-bind-address. Port of the metrics server; 0 disables it.
    #[arg(long = "metrics-port", value_name = "int32", default_value = "10249", value_parser = go_i32, hide = true)]
    pub metrics_port: i32,
    /// Serve /debug/pprof on the metrics server. Ignored with --config.
    #[arg(long, value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub profiling: bool,
    /// The previous minor version (<major>.<minor>, e.g. 1.32) whose now-hidden metrics should still be shown. Ignored with --config.
    #[arg(
        long = "show-hidden-metrics-for-version",
        value_name = "string",
        default_value = ""
    )]
    pub show_hidden_metrics_for_version: String,

    // ---- proxy mode and traffic handling -----------------------------------------------
    /// Proxy mode: 'ebpf' (ours), 'nftables', 'iptables' or 'ipvs'. Blank picks the best this node supports (ebpf, else nftables, else iptables). Ignored with --config.
    #[arg(long = "proxy-mode", value_name = "ProxyMode", default_value = "")]
    pub proxy_mode: String,
    /// Source NAT all traffic sent to Service cluster IPs. Some CNI plugins need it.
    #[arg(long = "masquerade-all", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub masquerade_all: bool,
    /// Pod CIDR(s) of the cluster (a dual-stack pair may be comma-separated). With --detect-local-mode=ClusterCIDR, traffic from these is local. Ignored with --config.
    #[arg(long = "cluster-cidr", value_name = "string", default_value = "")]
    pub cluster_cidr: String,
    /// How to tell pod-originated traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix. Ignored with --config.
    #[arg(
        long = "detect-local-mode",
        value_name = "LocalMode",
        default_value = ""
    )]
    pub detect_local_mode: String,
    /// With --detect-local-mode=BridgeInterface: traffic arriving from this bridge is local.
    #[arg(
        long = "pod-bridge-interface",
        value_name = "string",
        default_value = ""
    )]
    pub pod_bridge_interface: String,
    /// With --detect-local-mode=InterfaceNamePrefix: traffic from interfaces with this name prefix is local.
    #[arg(
        long = "pod-interface-name-prefix",
        value_name = "string",
        default_value = ""
    )]
    pub pod_interface_name_prefix: String,
    /// CIDRs of node IPs that accept NodePort connections, or the single value 'primary' (the node's primary IPs only). Unset: all local IPs. Ignored with --config.
    #[arg(long = "nodeport-addresses", value_name = "strings", action = ArgAction::Append, value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// oom_score_adj for this process, within [-1000, 1000]. Ignored with --config.
    #[arg(long = "oom-score-adj", value_name = "int32", default_value = "-999", value_parser = go_i32, allow_hyphen_values = true)]
    pub oom_score_adj: i32,
    /// Feature gates as comma-separated 'Name=true|false' pairs (the known gates are those of kube-proxy v1.33). Ignored with --config.
    #[arg(long = "feature-gates", value_name = "<comma-separated 'key=True|False' pairs>", value_parser = feature_gates)]
    pub feature_gates: Option<BTreeMap<String, bool>>,

    // ---- conntrack ---------------------------------------------------------------------
    /// Tracked connections per CPU (0 leaves the limit alone and ignores --conntrack-min). In ebpf mode this sizes our own conntrack table.
    #[arg(long = "conntrack-max-per-core", value_name = "int32", default_value = "32768", value_parser = go_i32, allow_hyphen_values = true)]
    pub conntrack_max_per_core: i32,
    /// Lower bound of tracked connections, whatever --conntrack-max-per-core gives.
    #[arg(long = "conntrack-min", value_name = "int32", default_value = "131072", value_parser = go_i32, allow_hyphen_values = true)]
    pub conntrack_min: i32,
    /// Set nf_conntrack_tcp_be_liberal=1 (accept out-of-window TCP packets).
    #[arg(long = "conntrack-tcp-be-liberal", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,
    /// Timeout of TCP connections in CLOSE_WAIT.
    #[arg(long = "conntrack-tcp-timeout-close-wait", value_name = "duration", default_value = "1h0m0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_close_wait: GoDuration,
    /// Idle timeout of established TCP connections (0 leaves it alone).
    #[arg(long = "conntrack-tcp-timeout-established", value_name = "duration", default_value = "24h0m0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_established: GoDuration,
    /// Idle timeout of UDP flows that never got a reply (0 leaves it alone).
    #[arg(long = "conntrack-udp-timeout", value_name = "duration", default_value = "0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub conntrack_udp_timeout: GoDuration,
    /// Idle timeout of UDP flows that got replies (0 leaves it alone).
    #[arg(long = "conntrack-udp-timeout-stream", value_name = "duration", default_value = "0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub conntrack_udp_timeout_stream: GoDuration,

    // ---- iptables / nftables -----------------------------------------------------------
    /// Allow NodePorts on localhost (iptables mode, IPv4 only; never in other modes).
    #[arg(long = "iptables-localhost-nodeports", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,
    /// Bit of the packet mark that flags packets for SNAT (iptables and ipvs modes), within [0, 31].
    #[arg(long = "iptables-masquerade-bit", value_name = "int32", default_value = "14", value_parser = go_i32, allow_hyphen_values = true)]
    pub iptables_masquerade_bit: i32,
    /// Minimum interval between rule syncs (e.g. '5s', '1m', '2h22m'); 0 syncs on every change. Used by every mode but ipvs.
    #[arg(long = "iptables-min-sync-period", value_name = "duration", default_value = "1s", value_parser = go_duration, allow_hyphen_values = true)]
    pub iptables_min_sync_period: GoDuration,
    /// Maximum interval between full resyncs (e.g. '5s', '1m', '2h22m'); must be greater than 0. Used by every mode but ipvs.
    #[arg(long = "iptables-sync-period", value_name = "duration", default_value = "30s", value_parser = go_duration, allow_hyphen_values = true)]
    pub iptables_sync_period: GoDuration,

    // ---- ipvs --------------------------------------------------------------------------
    /// Comma-separated CIDRs whose IPVS services the ipvs mode leaves alone when cleaning up.
    #[arg(long = "ipvs-exclude-cidrs", value_name = "strings", action = ArgAction::Append, value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Vec<String>,
    /// Minimum interval between IPVS syncs (e.g. '5s', '1m', '2h22m'); 0 syncs on every change.
    #[arg(long = "ipvs-min-sync-period", value_name = "duration", default_value = "1s", value_parser = go_duration, allow_hyphen_values = true)]
    pub ipvs_min_sync_period: GoDuration,
    /// IPVS scheduler (blank means rr).
    #[arg(long = "ipvs-scheduler", value_name = "string", default_value = "")]
    pub ipvs_scheduler: String,
    /// Set arp_ignore=1 and arp_announce=2 (strict ARP) for the ipvs mode.
    #[arg(long = "ipvs-strict-arp", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub ipvs_strict_arp: bool,
    /// Maximum interval between full IPVS resyncs (e.g. '5s', '1m', '2h22m'); must be greater than 0.
    #[arg(long = "ipvs-sync-period", value_name = "duration", default_value = "30s", value_parser = go_duration, allow_hyphen_values = true)]
    pub ipvs_sync_period: GoDuration,
    /// Idle timeout of IPVS TCP sessions; 0 leaves it alone.
    #[arg(long = "ipvs-tcp-timeout", value_name = "duration", default_value = "0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub ipvs_tcp_timeout: GoDuration,
    /// Timeout of IPVS TCP sessions after a FIN; 0 leaves it alone.
    #[arg(long = "ipvs-tcpfin-timeout", value_name = "duration", default_value = "0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub ipvs_tcpfin_timeout: GoDuration,
    /// Timeout of IPVS UDP sessions; 0 leaves it alone.
    #[arg(long = "ipvs-udp-timeout", value_name = "duration", default_value = "0s", value_parser = go_duration, allow_hyphen_values = true)]
    pub ipvs_udp_timeout: GoDuration,

    // ---- logging (these override the --config file when set) ---------------------------
    /// Log verbosity level.
    #[arg(short = 'v', long = "v", value_name = "int", default_value = "0", value_parser = go_u32)]
    pub v: u32,
    /// Per-file verbosity as comma-separated pattern=N (text format only).
    #[arg(long, value_name = "pattern=N,...", value_parser = vmodule)]
    pub vmodule: Option<VModuleList>,
    /// Log format. Permitted formats: "text".
    #[arg(long = "logging-format", value_name = "string", default_value = "text")]
    pub logging_format: String,
    /// Maximum time between log flushes.
    #[arg(long = "log-flush-frequency", value_name = "duration", default_value = "5s", value_parser = go_duration)]
    pub log_flush_frequency: GoDuration,
    /// [Alpha] Buffer info messages up to this size in text format with split streams (512, 1K, 2Ki, 3M, 5Mi...). Needs the LoggingAlphaOptions gate.
    #[arg(long = "log-text-info-buffer-size", value_name = "quantity", value_parser = quantity)]
    pub log_text_info_buffer_size: Option<Quantity>,
    /// [Alpha] In text format, errors go to stderr and info to stdout. Needs the LoggingAlphaOptions gate.
    #[arg(long = "log-text-split-stream", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub log_text_split_stream: bool,

    // klog's flags: accepted for compatibility; logs always go to stderr here.
    /// Prefix log lines with the source file's directory (accepted, no effect).
    #[arg(long = "add_dir_header", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub add_dir_header: bool,
    /// Log to stderr as well as files (accepted, no effect: logs go to stderr).
    #[arg(long = "alsologtostderr", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub alsologtostderr: bool,
    /// Emit a stack trace when logging at file:N (accepted, no effect).
    #[arg(long = "log_backtrace_at", value_name = "<a string in the form 'file:N'>", default_value = ":0", value_parser = trace_location)]
    pub log_backtrace_at: String,
    /// Write log files into this directory (accepted, no effect: logs go to stderr).
    #[arg(long = "log_dir", value_name = "string", default_value = "")]
    pub log_dir: String,
    /// Write logs to this file (accepted, no effect: logs go to stderr).
    #[arg(long = "log_file", value_name = "string", default_value = "")]
    pub log_file: String,
    /// Maximum log file size in MB, 0 for unlimited (accepted, no effect).
    #[arg(long = "log_file_max_size", value_name = "uint", default_value = "1800", value_parser = go_u64)]
    pub log_file_max_size: u64,
    /// Log to stderr instead of files (always the case here).
    #[arg(long = "logtostderr", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub logtostderr: bool,
    /// Write each log line only to the file of its own severity (accepted, no effect).
    #[arg(long = "one_output", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub one_output: bool,
    /// Omit the header prefix of log lines (accepted, no effect).
    #[arg(long = "skip_headers", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_headers: bool,
    /// Omit the header of new log files (accepted, no effect).
    #[arg(long = "skip_log_headers", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_log_headers: bool,
    /// Severity from which logs also go to stderr when logging to files (accepted, no effect).
    #[arg(long = "stderrthreshold", value_name = "int", default_value = "2", value_parser = severity)]
    pub stderrthreshold: String,

    // ---- ours ----------------------------------------------------------------------------
    /// [ours] Read Services, EndpointSlices and Nodes from YAML files in this directory instead of the API server (standalone mode).
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// [ours] Path to an EbpfDatapathConfiguration (ebpf.kube-ebpf-proxy.io/v1alpha1) file with the ebpf datapath settings. --ebpf-* flags set explicitly override it.
    #[arg(long = "ebpf-config", value_name = "FILE")]
    pub ebpf_config: Option<PathBuf>,
    /// [ours] Write the fully defaulted EbpfDatapathConfiguration to this file (together with --write-config-to, or alone) and exit.
    #[arg(long = "ebpf-write-config-to", value_name = "FILE")]
    pub ebpf_write_config_to: Option<PathBuf>,
    /// [ours] Name prefixes of pod-side interfaces that get the TC programs (default veth,cali,lxc,cni,gke,eni,azv).
    #[arg(long = "ebpf-pod-interface-prefixes", value_name = "strings", action = ArgAction::Append, value_delimiter = ',')]
    pub ebpf_pod_interface_prefixes: Vec<String>,
    /// [ours] Interfaces that get the XDP program for NodePort/LoadBalancer/externalIP traffic (default: those holding the node IPs).
    #[arg(long = "ebpf-external-interfaces", value_name = "strings", action = ArgAction::Append, value_delimiter = ',')]
    pub ebpf_external_interfaces: Vec<String>,
    /// [ours] The cluster's service CIDRs, used while it has no ServiceCIDR objects: traffic to an unallocated address in one is dropped.
    #[arg(long = "ebpf-service-cidrs", value_name = "strings", action = ArgAction::Append, value_delimiter = ',')]
    pub ebpf_service_cidrs: Vec<String>,
    /// [ours] XDP attach mode: auto (native where the driver has it, else none: TC alone), native, generic or disabled.
    #[arg(long = "ebpf-xdp-mode", value_name = "string", default_value = "auto", value_parser = xdp_mode)]
    pub ebpf_xdp_mode: XdpMode,
    /// [ours] Capacity of the services map.
    #[arg(long = "ebpf-map-size-services", value_name = "uint32", default_value = "65536", value_parser = go_u32)]
    pub ebpf_map_size_services: u32,
    /// [ours] Capacity of the backend slots array (every frontend's backends, by slot).
    #[arg(long = "ebpf-map-size-backend-slots", value_name = "uint32", default_value = "1048576", value_parser = go_u32)]
    pub ebpf_map_size_backend_slots: u32,
    /// [ours] Capacity of the backends map.
    #[arg(long = "ebpf-map-size-backends", value_name = "uint32", default_value = "65536", value_parser = go_u32)]
    pub ebpf_map_size_backends: u32,
    /// [ours] Capacity of the conntrack map; 0 derives it from --conntrack-max-per-core x CPUs and --conntrack-min.
    #[arg(long = "ebpf-map-size-conntrack", value_name = "uint32", default_value = "0", value_parser = go_u32)]
    pub ebpf_map_size_conntrack: u32,
    /// [ours] Maglev lookup tables per family (one per service port balanced by Maglev); 0: 1024 with --ebpf-lb-algorithm=maglev, else 32.
    #[arg(long = "ebpf-map-size-maglev-tables", value_name = "uint32", default_value = "0", value_parser = go_u32)]
    pub ebpf_map_size_maglev_tables: u32,
    /// [ours] Backend selection: random or maglev (consistent hashing).
    #[arg(long = "ebpf-lb-algorithm", value_name = "string", default_value = "random", value_parser = lb_algorithm)]
    pub ebpf_lb_algorithm: LbAlgorithm,
    /// [ours] Maglev lookup table size per service (a prime).
    #[arg(long = "ebpf-maglev-table-size", value_name = "uint32", default_value = "16381", value_parser = go_u32)]
    pub ebpf_maglev_table_size: u32,
    /// [ours] Socket-level balancing (cgroup connect/sendmsg/recvmsg/getpeername hooks) for the node's own processes, and for pods unless --ebpf-socket-lb-host-namespace-only.
    #[arg(long = "ebpf-socket-lb", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub ebpf_socket_lb: bool,
    /// [ours] Socket-level balancing for the node's own network namespace only; pods keep per-packet NAT (false: pods' sockets too).
    #[arg(long = "ebpf-socket-lb-host-namespace-only", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub ebpf_socket_lb_host_namespace_only: bool,
    /// [ours] The cgroup v2 directory the socket hooks attach to (default: the cgroup v2 root, found from the mounts).
    #[arg(
        long = "ebpf-socket-lb-cgroup-path",
        value_name = "string",
        default_value = ""
    )]
    pub ebpf_socket_lb_cgroup_path: String,
    /// [ours] Directory on a BPF filesystem where the programs' links and maps are pinned, so the datapath outlives the agent.
    #[arg(
        long = "ebpf-pin-root",
        value_name = "string",
        default_value = "/sys/fs/bpf/kube-ebpf-proxy"
    )]
    pub ebpf_pin_root: String,
    /// [ours] Detach the programs and remove the pins when the agent exits (for tests and demos; by default only --cleanup removes the datapath).
    #[arg(long = "ebpf-detach-on-exit", value_name = "bool", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub ebpf_detach_on_exit: bool,
    /// [ours] Directory where the agent publishes, after each sync, what the maps' service and backend ids stand for (read by `proxy-agent inspect`).
    #[arg(
        long = "ebpf-state-dir",
        value_name = "string",
        default_value = "/run/kube-ebpf-proxy"
    )]
    pub ebpf_state_dir: String,

    #[arg(hide = true, num_args = 0.., trailing_var_arg = false)]
    pub positional: Vec<String>,
}

/// Flags whose use only earns a deprecation warning.
pub const DEPRECATED: &[(&str, &str)] = &[
    (
        "healthz-port",
        "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.",
    ),
    (
        "metrics-port",
        "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.",
    ),
];

/// klog flags we accept but that change nothing (logs always go to stderr).
pub const NO_EFFECT: &[&str] = &[
    "add_dir_header",
    "alsologtostderr",
    "log_backtrace_at",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "logtostderr",
    "one_output",
    "skip_headers",
    "skip_log_headers",
    "stderrthreshold",
];

/// Parsed flags plus which of them were given on the command line.
#[derive(Debug, Clone)]
pub struct ParsedFlags {
    pub flags: Flags,
    matches: ArgMatches,
}

/// What the command line asked for before any config processing.
#[derive(Debug)]
pub enum FlagsOutcome {
    Parsed(Box<ParsedFlags>),
    /// `--help`: print this and exit 0.
    Help(String),
}

impl ParsedFlags {
    /// Whether the flag (by its long name) was given on the command line.
    pub fn is_set(&self, long: &str) -> bool {
        let id = long_to_id(long);
        matches!(
            self.matches.value_source(&id),
            Some(ValueSource::CommandLine)
        )
    }

    /// Long names of every flag given on the command line.
    pub fn set_flags(&self) -> Vec<String> {
        Flags::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .filter(|l| self.is_set(l))
            .collect()
    }
}

/// Long names of every flag the command line accepts (hidden ones included).
pub fn long_flag_names() -> Vec<String> {
    Flags::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

fn long_to_id(long: &str) -> String {
    match long {
        "v" => "v".into(),
        other => other.replace('-', "_"),
    }
}

/// pflag's word-separator normalisation: `--log-dir` finds `--log_dir` and
/// `--iptables_sync_period` finds `--iptables-sync-period`.
fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let cmd = Flags::command();
    let longs: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let mut out = Vec::with_capacity(args.len());
    let mut rest_literal = false;
    for (i, arg) in args.into_iter().enumerate() {
        let Some(s) = arg
            .to_str()
            .filter(|s| i > 0 && !rest_literal && s.starts_with("--") && s.len() > 2)
        else {
            if arg == "--" {
                rest_literal = true;
            }
            out.push(arg);
            continue;
        };
        let body = &s[2..];
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let norm = name.replace('_', "-");
        match longs.iter().find(|l| l.replace('_', "-") == norm) {
            Some(real) if real != name => {
                let mut s = format!("--{real}");
                if let Some(v) = value {
                    s.push('=');
                    s.push_str(v);
                }
                out.push(OsString::from(s));
            }
            _ => out.push(arg),
        }
    }
    out
}

/// A string-slice flag's value as pflag's `StringSlice.Set` builds it: each occurrence's values
/// are appended, and an empty occurrence (`--nodeport-addresses=`) adds nothing, so that alone
/// it gives the empty list (clap would give `[""]`).
fn string_slice(matches: &ArgMatches, long: &str) -> Vec<String> {
    let Ok(Some(occurrences)) = matches.try_get_occurrences::<String>(&long_to_id(long)) else {
        return Vec::new();
    };
    occurrences
        .map(|o| o.cloned().collect::<Vec<String>>())
        .filter(|values| !matches!(values.as_slice(), [only] if only.is_empty()))
        .flatten()
        .collect()
}

/// pflag's words for a flag it does not know: `unknown flag: --x` (the value, if any, left
/// off), `unknown shorthand flag: 'x' in -x`.
fn unknown_flag_message(arg: &str) -> String {
    match arg.strip_prefix("--") {
        Some(long) => format!("unknown flag: --{}", long.split('=').next().unwrap_or(long)),
        None => {
            let short = arg.trim_start_matches('-').chars().next().unwrap_or('-');
            format!("unknown shorthand flag: {short:?} in {arg}")
        }
    }
}

/// One line from a clap error: its first line, without clap's `error: ` prefix.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid command line");
    first.trim_start_matches("error: ").to_string()
}

/// Parses `args` (including the program name). Never exits the process.
pub fn parse(args: Vec<OsString>) -> Result<FlagsOutcome, OptionsError> {
    let program = args
        .first()
        .map(|a| {
            std::path::Path::new(a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_else(|| "kube-proxy".into());
    let name: &'static str = Box::leak(program.clone().into_boxed_str());
    let cmd = Flags::command().name(name);
    let matches = match cmd.try_get_matches_from(normalize_args(args)) {
        Ok(m) => m,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            return Ok(FlagsOutcome::Help(e.render().to_string()));
        }
        Err(e) => {
            let flag = e
                .get(clap::error::ContextKind::InvalidArg)
                .map(|v| v.to_string());
            let message = match &flag {
                Some(arg) if e.kind() == clap::error::ErrorKind::UnknownArgument => {
                    unknown_flag_message(arg)
                }
                _ => one_line(&e),
            };
            return Err(OptionsError::Flag { flag, message });
        }
    };
    let mut flags = Flags::from_arg_matches(&matches).map_err(|e| OptionsError::Flag {
        flag: None,
        message: one_line(&e),
    })?;
    // The string-slice flags (`ArgAction::Append`, split on `,`), as pflag builds them.
    for (long, value) in [
        ("nodeport-addresses", &mut flags.nodeport_addresses),
        ("ipvs-exclude-cidrs", &mut flags.ipvs_exclude_cidrs),
        (
            "ebpf-pod-interface-prefixes",
            &mut flags.ebpf_pod_interface_prefixes,
        ),
        (
            "ebpf-external-interfaces",
            &mut flags.ebpf_external_interfaces,
        ),
        ("ebpf-service-cidrs", &mut flags.ebpf_service_cidrs),
    ] {
        *value = string_slice(&matches, long);
    }
    if !flags.positional.is_empty() {
        return Err(OptionsError::UnexpectedArgs {
            program,
            args: flags.positional.clone(),
        });
    }
    Ok(FlagsOutcome::Parsed(Box::new(ParsedFlags {
        flags,
        matches,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Flags::command().debug_assert();
    }

    #[test]
    fn underscores_and_dashes_are_interchangeable() {
        let args: Vec<OsString> = [
            "x",
            "--log-dir=/tmp",
            "--iptables_sync_period",
            "5s",
            "--",
            "--log-dir",
        ]
        .map(OsString::from)
        .to_vec();
        let n = normalize_args(args);
        assert_eq!(n[1], "--log_dir=/tmp");
        assert_eq!(n[2], "--iptables-sync-period");
        assert_eq!(n[5], "--log-dir", "after -- nothing is rewritten");
    }
}
