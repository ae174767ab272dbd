//! Upstream's `Complete()` + `Validate()`: which source wins for each setting
//! (config_rules.md §3.1 and §4).
//!
//! * Without `--config`: defaults, overridden by the flags given on the command line. The
//!   `--iptables-[min-]sync-period` flags apply when the mode is not ipvs (to the iptables and
//!   nftables sections), the `--ipvs-*sync-period` flags only when it is ipvs. The deprecated
//!   `--healthz-port`/`--metrics-port` apply unless `--write-config-to` is given.
//! * With `--config`: the file (defaulted) replaces every config flag, except the logging flags
//!   and `--hostname-override`, which are laid over it when given. Ignored flags are warned about.
//! * Our `--ebpf-*` flags override `--ebpf-config` when given.

use std::ffi::OsString;
use std::path::Path;

use super::decode::{self, DocSpec};
use super::defaults::{self, append_port_if_needed};
use super::duration::GoDuration;
use super::ebpf::{self, EbpfDatapathConfiguration};
use super::error::{Document, OptionsError};
use super::features;
use super::flags::{self, Flags, FlagsOutcome, ParsedFlags};
use super::mode::ProxyMode;
use super::types::{self, KubeProxyConfiguration, VModuleItem};
use super::version::{self, VersionRequest};
use super::{Environment, LoadedFile, Parsed, ProxyOptions, validate};

/// Fields upstream removed from v1alpha1; old files that still carry them load with a warning.
pub const REMOVED_FIELDS: &[&str] = &["udpIdleTimeout", "resourceContainer", "conntrack.max"];

/// Flags that `--config` does not silence.
const KEPT_WITH_CONFIG: &[&str] = &[
    "config",
    "write-config-to",
    "cleanup",
    "init-only",
    "version",
    "master",
    "hostname-override",
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-info-buffer-size",
    "log-text-split-stream",
];

/// A fully populated configuration: the set of fields the decoder knows.
pub fn kube_proxy_schema() -> serde_yaml::Value {
    let mut c = KubeProxyConfiguration::default();
    defaults::set_defaults(&mut c);
    c.logging.vmodule = vec![VModuleItem::default()];
    c.logging.options.text.split_stream = true;
    c.logging.options.json.split_stream = true;
    decode::schema_of(&c)
}

fn read(doc: Document, path: &Path) -> Result<String, OptionsError> {
    std::fs::read_to_string(path).map_err(|source| OptionsError::ReadFile {
        doc,
        path: path.to_path_buf(),
        source,
    })
}

/// Loads and defaults a KubeProxyConfiguration file (no flags, no platform defaults).
pub fn load_config_file(
    path: &Path,
) -> Result<(KubeProxyConfiguration, Vec<String>), OptionsError> {
    let text = read(Document::KubeProxy, path)?;
    decode_config(path, &text)
}

/// Decodes and defaults the text of a KubeProxyConfiguration file read from `path`.
pub fn decode_config(
    path: &Path,
    text: &str,
) -> Result<(KubeProxyConfiguration, Vec<String>), OptionsError> {
    let spec = DocSpec {
        doc: Document::KubeProxy,
        api_version: types::API_VERSION,
        kind: types::KIND,
        schema: kube_proxy_schema(),
        free_maps: &["featureGates"],
        removed: REMOVED_FIELDS,
        strict: false,
    };
    let (mut c, warnings): (KubeProxyConfiguration, _) = decode::decode(&spec, path, text)?;
    defaults::set_defaults(&mut c);
    Ok((c, warnings))
}

/// Loads an EbpfDatapathConfiguration file (not yet defaulted).
pub fn load_ebpf_file(
    path: &Path,
) -> Result<(EbpfDatapathConfiguration, Vec<String>), OptionsError> {
    let text = read(Document::Ebpf, path)?;
    decode_ebpf(path, &text)
}

/// Decodes the text of an EbpfDatapathConfiguration file read from `path`.
pub fn decode_ebpf(
    path: &Path,
    text: &str,
) -> Result<(EbpfDatapathConfiguration, Vec<String>), OptionsError> {
    let spec = DocSpec {
        doc: Document::Ebpf,
        api_version: ebpf::API_VERSION,
        kind: ebpf::KIND,
        schema: decode::schema_of(&EbpfDatapathConfiguration::schema_example()),
        free_maps: &[],
        removed: &[],
        // Ours: no other version of it exists, so an unknown field is a typo.
        strict: true,
    };
    decode::decode(&spec, path, text)
}

/// The configuration built from flags alone (`--config` absent).
fn from_flags(p: &ParsedFlags) -> KubeProxyConfiguration {
    let f = &p.flags;
    let set = |name: &str| p.is_set(name);
    let mut c = KubeProxyConfiguration::default();
    if set("feature-gates") {
        c.feature_gates = f.feature_gates.clone().unwrap_or_default();
    }
    if set("kubeconfig") {
        c.client_connection.kubeconfig = f.kubeconfig.clone();
    }
    if set("kube-api-content-type") {
        c.client_connection.content_type = f.kube_api_content_type.clone();
    }
    if set("kube-api-qps") {
        c.client_connection.qps = f.kube_api_qps;
    }
    if set("kube-api-burst") {
        c.client_connection.burst = f.kube_api_burst;
    }
    if set("hostname-override") {
        c.hostname_override = f.hostname_override.clone();
    }
    if set("bind-address") {
        c.bind_address = f.bind_address.clone();
    }
    if set("healthz-bind-address") {
        c.healthz_bind_address = f.healthz_bind_address.clone();
    }
    if set("metrics-bind-address") {
        c.metrics_bind_address = f.metrics_bind_address.clone();
    }
    c.bind_address_hard_fail = f.bind_address_hard_fail;
    c.enable_profiling = f.profiling;
    c.show_hidden_metrics_for_version = f.show_hidden_metrics_for_version.clone();
    c.mode = f.proxy_mode.clone();
    c.iptables.masquerade_all = f.masquerade_all;
    c.nftables.masquerade_all = f.masquerade_all;
    c.iptables.masquerade_bit = Some(f.iptables_masquerade_bit);
    c.iptables.localhost_node_ports = Some(f.iptables_localhost_nodeports);
    if c.mode != ProxyMode::Ipvs.as_str() {
        if set("iptables-sync-period") {
            c.iptables.sync_period = f.iptables_sync_period;
            c.nftables.sync_period = f.iptables_sync_period;
        }
        if set("iptables-min-sync-period") {
            c.iptables.min_sync_period = f.iptables_min_sync_period;
            c.nftables.min_sync_period = f.iptables_min_sync_period;
        }
    } else {
        // The internal, unified periods come from the ipvs flags (their defaults included).
        c.ipvs.sync_period = f.ipvs_sync_period;
        c.ipvs.min_sync_period = f.ipvs_min_sync_period;
    }
    c.ipvs.scheduler = f.ipvs_scheduler.clone();
    c.ipvs.exclude_cidrs = f.ipvs_exclude_cidrs.clone();
    c.ipvs.strict_arp = f.ipvs_strict_arp;
    c.ipvs.tcp_timeout = f.ipvs_tcp_timeout;
    c.ipvs.tcp_fin_timeout = f.ipvs_tcpfin_timeout;
    c.ipvs.udp_timeout = f.ipvs_udp_timeout;
    c.detect_local_mode = f.detect_local_mode.clone();
    c.detect_local.bridge_interface = f.pod_bridge_interface.clone();
    c.detect_local.interface_name_prefix = f.pod_interface_name_prefix.clone();
    c.cluster_cidr = f.cluster_cidr.clone();
    c.node_port_addresses = f.nodeport_addresses.clone();
    c.oom_score_adj = Some(f.oom_score_adj);
    c.conntrack.max_per_core = Some(f.conntrack_max_per_core);
    c.conntrack.min = Some(f.conntrack_min);
    c.conntrack.tcp_established_timeout = Some(f.conntrack_tcp_timeout_established);
    c.conntrack.tcp_close_wait_timeout = Some(f.conntrack_tcp_timeout_close_wait);
    c.conntrack.tcp_be_liberal = f.conntrack_tcp_be_liberal;
    c.conntrack.udp_timeout = f.conntrack_udp_timeout;
    c.conntrack.udp_stream_timeout = f.conntrack_udp_timeout_stream;
    if set("config-sync-period") {
        c.config_sync_period = f.config_sync_period;
    }
    overlay_logging(p, &mut c);
    c
}

/// Logging flags given on the command line win over the file (vmodule: flag entries first).
fn overlay_logging(p: &ParsedFlags, c: &mut KubeProxyConfiguration) {
    let f = &p.flags;
    if p.is_set("v") {
        c.logging.verbosity = f.v;
    }
    if p.is_set("vmodule") {
        let mut v = f.vmodule.clone().unwrap_or_default().0;
        v.append(&mut c.logging.vmodule);
        c.logging.vmodule = v;
    }
    if p.is_set("logging-format") {
        c.logging.format = f.logging_format.clone();
    }
    if p.is_set("log-flush-frequency") {
        c.logging.flush_frequency = f.log_flush_frequency;
    }
    if p.is_set("log-text-info-buffer-size")
        && let Some(q) = &f.log_text_info_buffer_size
    {
        c.logging.options.text.info_buffer_size = q.clone();
    }
    if p.is_set("log-text-split-stream") {
        c.logging.options.text.split_stream = f.log_text_split_stream;
    }
}

/// Upstream lays the flags over an already defaulted configuration, so a flag given explicitly
/// with the value the defaulter treats as "unset" keeps that value: an empty
/// `--healthz-bind-address` / `--metrics-bind-address` turns the server off, a zero
/// `--*-sync-period` / `--config-sync-period` reaches validation ("must be greater than 0")
/// instead of silently becoming the default, and `--iptables-min-sync-period=0` syncs on every
/// change (in a file, `minSyncPeriod: 0s` means the default, 1s). Call after defaulting.
fn keep_explicit_zero_flags(p: &ParsedFlags, c: &mut KubeProxyConfiguration) {
    let f = &p.flags;
    let zero = |name: &str, given: GoDuration| p.is_set(name) && given == GoDuration::ZERO;
    if p.is_set("healthz-bind-address") && f.healthz_bind_address.trim().is_empty() {
        c.healthz_bind_address.clear();
    }
    if p.is_set("metrics-bind-address") && f.metrics_bind_address.trim().is_empty() {
        c.metrics_bind_address.clear();
    }
    if zero("config-sync-period", f.config_sync_period) {
        c.config_sync_period = GoDuration::ZERO;
    }
    if c.mode != ProxyMode::Ipvs.as_str() {
        if zero("iptables-sync-period", f.iptables_sync_period) {
            c.iptables.sync_period = GoDuration::ZERO;
            c.nftables.sync_period = GoDuration::ZERO;
        }
        if zero("iptables-min-sync-period", f.iptables_min_sync_period) {
            c.iptables.min_sync_period = GoDuration::ZERO;
            c.nftables.min_sync_period = GoDuration::ZERO;
        }
    } else if zero("ipvs-sync-period", f.ipvs_sync_period) {
        c.ipvs.sync_period = GoDuration::ZERO;
    }
}

/// Deprecated `--healthz-port` / `--metrics-port` (config_rules.md §3 step 4a). Port 0 turns
/// the server off; another port is appended only to an address without one.
/// Returns (healthz_off, metrics_off); call before defaulting.
fn apply_deprecated_ports(f: &Flags, c: &mut KubeProxyConfiguration) -> (bool, bool) {
    let apply = |addr: &mut String, port: i32| -> bool {
        if port == 0 {
            return true;
        }
        if !addr.is_empty()
            && let Ok(p) = u16::try_from(port)
        {
            *addr = append_port_if_needed(addr, p);
        }
        false
    };
    (
        apply(&mut c.healthz_bind_address, f.healthz_port),
        apply(&mut c.metrics_bind_address, f.metrics_port),
    )
}

fn ebpf_from_flags(p: &ParsedFlags, c: &mut EbpfDatapathConfiguration) {
    let f = &p.flags;
    if p.is_set("ebpf-pod-interface-prefixes") {
        c.pod_interface_prefixes = Some(f.ebpf_pod_interface_prefixes.clone());
    }
    if p.is_set("ebpf-external-interfaces") {
        c.external_interfaces = f.ebpf_external_interfaces.clone();
    }
    if p.is_set("ebpf-service-cidrs") {
        c.service_cidrs = f.ebpf_service_cidrs.clone();
    }
    if p.is_set("ebpf-xdp-mode") {
        c.xdp_mode = f.ebpf_xdp_mode;
    }
    if p.is_set("ebpf-map-size-services") {
        c.maps.services = f.ebpf_map_size_services;
    }
    if p.is_set("ebpf-map-size-backend-slots") {
        c.maps.backend_slots = f.ebpf_map_size_backend_slots;
    }
    if p.is_set("ebpf-map-size-backends") {
        c.maps.backends = f.ebpf_map_size_backends;
    }
    if p.is_set("ebpf-map-size-conntrack") {
        c.maps.conntrack = f.ebpf_map_size_conntrack;
    }
    if p.is_set("ebpf-map-size-maglev-tables") {
        c.maps.maglev_tables = f.ebpf_map_size_maglev_tables;
    }
    if p.is_set("ebpf-lb-algorithm") {
        c.load_balancing.algorithm = f.ebpf_lb_algorithm;
    }
    if p.is_set("ebpf-maglev-table-size") {
        c.load_balancing.maglev_table_size = f.ebpf_maglev_table_size;
    }
    if p.is_set("ebpf-socket-lb") {
        c.socket_lb.enabled = Some(f.ebpf_socket_lb);
    }
    if p.is_set("ebpf-socket-lb-host-namespace-only") {
        c.socket_lb.host_namespace_only = Some(f.ebpf_socket_lb_host_namespace_only);
    }
    if p.is_set("ebpf-socket-lb-cgroup-path") {
        c.socket_lb.cgroup_path = f.ebpf_socket_lb_cgroup_path.clone();
    }
    if p.is_set("ebpf-pin-root") {
        c.pinning.root = f.ebpf_pin_root.clone();
    }
    if p.is_set("ebpf-detach-on-exit") {
        c.pinning.detach_on_exit = f.ebpf_detach_on_exit;
    }
    if p.is_set("ebpf-state-dir") {
        c.pinning.state_dir = f.ebpf_state_dir.clone();
    }
}

/// The OS hostname (`nodeutil.GetHostname`): trimmed and lower-cased.
fn os_hostname() -> Result<String, OptionsError> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .map_err(|e| OptionsError::Hostname(e.to_string()))
}

pub(super) fn run(args: Vec<OsString>, env: &Environment<'_>) -> Result<Parsed, OptionsError> {
    let original_args = args.clone();
    let mut loaded_files = Vec::new();
    let p = match flags::parse(args)? {
        FlagsOutcome::Help(h) => return Ok(Parsed::Help(h)),
        FlagsOutcome::Parsed(p) => p,
    };
    let f = &p.flags;
    let mut reported_version = version::compat_version();
    match version::request(f.version.as_deref()) {
        VersionRequest::Print => return Ok(Parsed::Version(version::short(&reported_version))),
        VersionRequest::Raw => return Ok(Parsed::Version(version::raw(&reported_version))),
        VersionRequest::Override(v) => reported_version = v,
        VersionRequest::None => {}
    }

    let mut warnings = Vec::new();
    for (name, msg) in flags::DEPRECATED {
        if p.is_set(name) {
            warnings.push(format!("Flag --{name} has been deprecated, {msg}"));
        }
    }
    for name in flags::NO_EFFECT {
        if p.is_set(name) {
            warnings.push(format!("flag --{name} is accepted for compatibility but has no effect: logs always go to stderr"));
        }
    }

    let mut c = match &f.config {
        Some(path) => {
            let text = read(Document::KubeProxy, path)?;
            let (mut c, w) = decode_config(path, &text)?;
            loaded_files.push(LoadedFile {
                path: path.clone(),
                contents: text,
            });
            warnings.extend(w);
            let ignored: Vec<String> = p
                .set_flags()
                .into_iter()
                .filter(|l| {
                    !KEPT_WITH_CONFIG.contains(&l.as_str())
                        && !l.starts_with("ebpf-")
                        && l != "manifests"
                        && !flags::NO_EFFECT.contains(&l.as_str())
                })
                .map(|l| format!("--{l}"))
                .collect();
            if !ignored.is_empty() {
                warnings.push(format!(
                    "flags {} are ignored because --config is given (the file replaces them)",
                    ignored.join(", ")
                ));
            }
            overlay_logging(&p, &mut c);
            c
        }
        None => {
            let mut c = from_flags(&p);
            let (healthz_off, metrics_off) = if f.write_config_to.is_none() {
                apply_deprecated_ports(f, &mut c)
            } else {
                (false, false)
            };
            defaults::set_defaults(&mut c);
            if healthz_off {
                c.healthz_bind_address.clear();
            }
            if metrics_off {
                c.metrics_bind_address.clear();
            }
            keep_explicit_zero_flags(&p, &mut c);
            c
        }
    };

    let mode_choice = defaults::platform_apply_defaults(&mut c, env.support);

    if p.is_set("hostname-override") && !f.hostname_override.is_empty() {
        let h = f.hostname_override.trim();
        if h.is_empty() {
            return Err(OptionsError::EmptyHostnameOverride);
        }
        c.hostname_override = h.to_lowercase();
    }

    validate::validate(&c).map_err(OptionsError::Validation)?;
    warnings.extend(features::warnings(&c.feature_gates));

    let mut ext = match &f.ebpf_config {
        Some(path) => {
            let text = read(Document::Ebpf, path)?;
            let (e, w) = decode_ebpf(path, &text)?;
            loaded_files.push(LoadedFile {
                path: path.clone(),
                contents: text,
            });
            warnings.extend(w);
            e
        }
        None => EbpfDatapathConfiguration::default(),
    };
    ebpf_from_flags(&p, &mut ext);
    ebpf::set_defaults(&mut ext);
    ebpf::validate(&ext).map_err(OptionsError::EbpfValidation)?;

    // `nodeutil.GetHostname`: an empty override means the OS hostname; whatever is used is
    // trimmed and lower-cased, and may not end up empty (a blank `hostnameOverride: " "` in
    // the file is an error, not the OS hostname).
    let node_name = if c.hostname_override.is_empty() {
        match &env.hostname {
            Some(h) => h.trim().to_lowercase(),
            None => os_hostname()?,
        }
    } else {
        c.hostname_override.trim().to_lowercase()
    };
    if node_name.is_empty() {
        return Err(OptionsError::Hostname("empty hostname is invalid".into()));
    }

    let mode = ProxyMode::parse(&c.mode).expect("validated above");
    Ok(Parsed::Run(Box::new(ProxyOptions {
        config: c,
        ebpf: ext,
        mode,
        mode_choice,
        node_name,
        config_file: f.config.clone(),
        ebpf_config_file: f.ebpf_config.clone(),
        write_config_to: f.write_config_to.clone(),
        ebpf_write_config_to: f.ebpf_write_config_to.clone(),
        cleanup: f.cleanup,
        init_only: f.init_only,
        master: f.master.clone(),
        manifests: f.manifests.clone(),
        reported_version,
        warnings,
        args: original_args,
        loaded_files,
    })))
}
