//! Our datapath extension: `EbpfDatapathConfiguration`.
//!
//! Design: upstream's `KubeProxyConfiguration` stays untouched (and decoded as upstream decodes
//! it), so a plain upstream file works unchanged and a file written for us still loads in
//! upstream kube-proxy.
//! Our own settings live in a *separate* document with its own group and kind, given with
//! `--ebpf-config FILE`, and each setting also has an `--ebpf-*` flag. An `--ebpf-*` flag that is
//! set explicitly overrides the file (unlike upstream flags, which `--config` silences), because
//! there is no upstream behaviour to stay compatible with here.
//!
//! ```yaml
//! apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1
//! kind: EbpfDatapathConfiguration
//! podInterfacePrefixes: [veth, cali, lxc, cni, gke, eni, azv]
//! externalInterfaces: []      # XDP (NodePort/LB/externalIPs); empty = the node-IP interfaces
//! xdpMode: auto               # auto | native | generic | disabled
//! maps: {services: 262144, backendSlots: 1048576, backends: 131072, conntrack: 0, maglevTables: 0}   # 0 = derived
//! loadBalancing: {algorithm: random, maglevTableSize: 16381}
//! socketLB: {enabled: true, hostNamespaceOnly: true, cgroupPath: ""}  # "" = the cgroup v2 root
//! pinning: {root: /sys/fs/bpf/kube-ebpf-proxy, detachOnExit: false, stateDir: /run/kube-ebpf-proxy}
//! ```

use serde::{Deserialize, Serialize};

use super::duration::GoDuration;
use super::error::{FieldError, FieldErrors};
use super::types::{KubeProxyConfiguration, nullable};

pub const API_VERSION: &str = "ebpf.kube-ebpf-proxy.io/v1alpha1";
pub const KIND: &str = "EbpfDatapathConfiguration";

/// Where every mode of ours pins BPF objects; `--cleanup` removes it.
pub const PIN_ROOT: &str = "/sys/fs/bpf/kube-ebpf-proxy";
/// Where the agent publishes what the maps' ids stand for (`inspect` reads it).
pub const STATE_DIR: &str = "/run/kube-ebpf-proxy";

/// Pod-side interface name prefixes of common CNIs: generic veth, Calico, Cilium, bridge CNI,
/// GKE, AWS VPC CNI, Azure CNI. Tunnel/host devices (`vxlan.calico`, `flannel.1`, `cilium_host`)
/// deliberately do not match.
pub const DEFAULT_POD_PREFIXES: [&str; 7] = ["veth", "cali", "lxc", "cni", "gke", "eni", "azv"];
/// Frontends (one per service port and address, two with a Local policy)
/// and cluster-IP markers.
pub const DEFAULT_SERVICES_MAP: u32 = 262_144;
/// Backend slots of all frontends (4 bytes each): 50,000 services of 10
/// endpoints take 600,000 (each frontend's rounded up to a multiple of 4).
pub const DEFAULT_BACKEND_SLOTS: u32 = 1_048_576;
pub const DEFAULT_BACKENDS_MAP: u32 = 131_072;
pub const DEFAULT_MAGLEV_TABLE: u32 = 16_381;
/// Maglev tables per family when `maps.maglevTables` is 0: enough for every
/// service under `algorithm: maglev`, and for a few annotated ones otherwise
/// (a table of 16381 buckets takes 32 KiB).
pub const DEFAULT_MAGLEV_TABLES: u32 = 1_024;
pub const DEFAULT_MAGLEV_TABLES_ANNOTATED: u32 = 32;
pub const MAX_MAP_ENTRIES: u32 = 1 << 24;
/// Conntrack table size cap, the same as upstream's nf_conntrack_max cap.
pub const MAX_CONNTRACK: u64 = 1 << 20;
/// Conntrack table size when `conntrack.maxPerCore` is 0 (upstream: "leave the kernel alone").
pub const FALLBACK_CONNTRACK: u32 = 262_144;
/// Kernel defaults used for our BPF conntrack when the kube setting is 0 ("leave as is").
pub const KERNEL_UDP_TIMEOUT: GoDuration = GoDuration::from_secs(30);
pub const KERNEL_UDP_STREAM_TIMEOUT: GoDuration = GoDuration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Native (driver) XDP where the driver supports it, none otherwise
    /// (generic XDP costs more than TC alone); a veth gets none.
    #[default]
    Auto,
    Native,
    Generic,
    /// No XDP program; NodePort/LB traffic is handled by the TC programs only.
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LbAlgorithm {
    #[default]
    Random,
    Maglev,
}

/// `--ebpf-config`. Decoded strictly, unlike the upstream document: an unknown or duplicate
/// field is an error, not a warning. The document is ours and has no newer or older version
/// with other fields, so such a field can only be a typo (see `decode.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EbpfDatapathConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// Interfaces whose name starts with one of these get the TC programs (pod side).
    #[serde(default)]
    pub pod_interface_prefixes: Option<Vec<String>>,
    /// Interfaces that get the XDP program; empty means the interfaces holding the node IPs.
    #[serde(default, deserialize_with = "nullable")]
    pub external_interfaces: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub xdp_mode: XdpMode,
    #[serde(default, deserialize_with = "nullable")]
    pub maps: MapSizes,
    #[serde(default, deserialize_with = "nullable")]
    pub load_balancing: LoadBalancing,
    #[serde(default, rename = "socketLB", deserialize_with = "nullable")]
    pub socket_lb: SocketLb,
    #[serde(default, deserialize_with = "nullable")]
    pub pinning: Pinning,
    /// The cluster's service CIDRs, used while the cluster has no ServiceCIDR
    /// objects (networking.k8s.io/v1): traffic to an address inside one
    /// that no service holds is dropped. Empty: nothing is dropped so.
    #[serde(default, rename = "serviceCIDRs", deserialize_with = "nullable")]
    pub service_cidrs: Vec<String>,
}

impl Default for EbpfDatapathConfiguration {
    fn default() -> Self {
        EbpfDatapathConfiguration {
            api_version: String::new(),
            kind: String::new(),
            pod_interface_prefixes: None,
            external_interfaces: Vec::new(),
            xdp_mode: XdpMode::Auto,
            maps: MapSizes::default(),
            load_balancing: LoadBalancing::default(),
            socket_lb: SocketLb::default(),
            pinning: Pinning::default(),
            service_cidrs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MapSizes {
    /// 0 = default.
    #[serde(default, deserialize_with = "nullable")]
    pub services: u32,
    /// The slots array (each frontend's backends, by slot). 0 = default.
    #[serde(default, deserialize_with = "nullable")]
    pub backend_slots: u32,
    /// 0 = default.
    #[serde(default, deserialize_with = "nullable")]
    pub backends: u32,
    /// 0 = derived from `conntrack.maxPerCore` x CPUs and `conntrack.min` (see [`conntrack_params`]).
    #[serde(default, deserialize_with = "nullable")]
    pub conntrack: u32,
    /// Maglev lookup tables per family: one per endpoint set of a service
    /// port balanced by Maglev. 0 = [`DEFAULT_MAGLEV_TABLES`] with
    /// `loadBalancing.algorithm: maglev`, else [`DEFAULT_MAGLEV_TABLES_ANNOTATED`]
    /// (fewer when that many tables of `maglevTableSize` would not fit in a map).
    #[serde(default, deserialize_with = "nullable")]
    pub maglev_tables: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancing {
    #[serde(default, deserialize_with = "nullable")]
    pub algorithm: LbAlgorithm,
    /// Maglev lookup table size per service; must be prime. 0 = default.
    #[serde(default, deserialize_with = "nullable")]
    pub maglev_table_size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketLb {
    /// Socket-level balancing (cgroup connect, sendmsg, recvmsg and
    /// getpeername hooks) for the node's own processes, and for pods unless
    /// `hostNamespaceOnly`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Balance only sockets of the node's own network namespace (the
    /// default); pods keep per-packet NAT, which service meshes that must see
    /// the service address need, and whose conntrack flush ends a pod's UDP
    /// flows to an endpoint that no longer serves (the agent cannot reach sockets in pods'
    /// namespaces to end them).
    #[serde(default)]
    pub host_namespace_only: Option<bool>,
    /// The cgroup v2 directory the hooks attach to; empty = the root of the
    /// cgroup v2 hierarchy, found from the mounts.
    #[serde(default, deserialize_with = "nullable")]
    pub cgroup_path: String,
}

/// Where the datapath is pinned, so that it outlives the agent (as upstream's
/// rules outlive kube-proxy) and a restarted or upgraded agent adopts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pinning {
    /// A directory on a BPF filesystem; empty = [`PIN_ROOT`].
    #[serde(default, deserialize_with = "nullable")]
    pub root: String,
    /// Detach the programs and remove the pins when the agent exits (tests and
    /// demos); by default the datapath keeps serving and only `--cleanup` removes it.
    #[serde(default, deserialize_with = "nullable")]
    pub detach_on_exit: bool,
    /// A directory where the agent publishes, after each sync, what the
    /// maps' service and backend ids stand for; empty = [`STATE_DIR`].
    #[serde(default, deserialize_with = "nullable")]
    pub state_dir: String,
}

impl EbpfDatapathConfiguration {
    /// A fully populated instance, used as the strict decoder's schema.
    pub fn schema_example() -> Self {
        let mut c = Self::default();
        set_defaults(&mut c);
        c
    }
    pub fn pod_prefixes(&self) -> &[String] {
        self.pod_interface_prefixes.as_deref().unwrap_or_default()
    }
    /// `maps.maglevTables`, its default resolved by the algorithm.
    pub fn maglev_tables(&self) -> u32 {
        // A default never exceeds what one map holds with large tables.
        let fit = MAX_MAP_ENTRIES
            / proxy_common::maglev::chunks_per_table(self.load_balancing.maglev_table_size).max(1);
        match (self.maps.maglev_tables, self.load_balancing.algorithm) {
            (0, LbAlgorithm::Maglev) => DEFAULT_MAGLEV_TABLES.min(fit),
            (0, LbAlgorithm::Random) => DEFAULT_MAGLEV_TABLES_ANNOTATED.min(fit),
            (n, _) => n,
        }
    }
    /// `MAGLEV` array elements per family: tables x elements per table.
    pub fn maglev_chunks(&self) -> u32 {
        self.maglev_tables()
            .saturating_mul(proxy_common::maglev::chunks_per_table(
                self.load_balancing.maglev_table_size,
            ))
    }
    pub fn socket_lb_enabled(&self) -> bool {
        self.socket_lb.enabled.unwrap_or(true)
    }
    pub fn socket_lb_host_namespace_only(&self) -> bool {
        self.socket_lb.host_namespace_only.unwrap_or(true)
    }
    /// `serviceCIDRs`, parsed (validation refused any that is not a CIDR).
    pub fn service_cidrs(&self) -> Vec<ipnet::IpNet> {
        self.service_cidrs
            .iter()
            .filter_map(|c| c.trim().parse().ok())
            .collect()
    }
}

pub fn set_defaults(c: &mut EbpfDatapathConfiguration) {
    if c.api_version.is_empty() {
        c.api_version = API_VERSION.into();
    }
    if c.kind.is_empty() {
        c.kind = KIND.into();
    }
    if c.pod_interface_prefixes.is_none() {
        c.pod_interface_prefixes =
            Some(DEFAULT_POD_PREFIXES.iter().map(|s| s.to_string()).collect());
    }
    if c.maps.services == 0 {
        c.maps.services = DEFAULT_SERVICES_MAP;
    }
    if c.maps.backends == 0 {
        c.maps.backends = DEFAULT_BACKENDS_MAP;
    }
    if c.maps.backend_slots == 0 {
        c.maps.backend_slots = DEFAULT_BACKEND_SLOTS;
    }
    if c.load_balancing.maglev_table_size == 0 {
        c.load_balancing.maglev_table_size = DEFAULT_MAGLEV_TABLE;
    }
    c.socket_lb.enabled.get_or_insert(true);
    c.socket_lb.host_namespace_only.get_or_insert(true);
    if c.pinning.root.is_empty() {
        c.pinning.root = PIN_ROOT.into();
    }
    if c.pinning.state_dir.is_empty() {
        c.pinning.state_dir = STATE_DIR.into();
    }
}

fn is_prime(n: u32) -> bool {
    n >= 2
        && (2..)
            .take_while(|d: &u32| (*d as u64) * (*d as u64) <= n as u64)
            .all(|d| !n.is_multiple_of(d))
}

fn valid_ifname(s: &str) -> bool {
    !s.is_empty() && s.len() <= 15 && !s.contains(['/', ':']) && !s.chars().any(char::is_whitespace)
}

pub fn validate(c: &EbpfDatapathConfiguration) -> Result<(), FieldErrors> {
    let mut errs = Vec::new();
    for (i, p) in c.pod_prefixes().iter().enumerate() {
        if !valid_ifname(p) {
            errs.push(FieldError::invalid_str(
                format!("podInterfacePrefixes[{i}]"),
                p,
                "must be a non-empty interface name prefix of at most 15 characters without '/', ':' or spaces",
            ));
        }
    }
    for (i, p) in c.external_interfaces.iter().enumerate() {
        if !valid_ifname(p) {
            errs.push(FieldError::invalid_str(
                format!("externalInterfaces[{i}]"),
                p,
                "must be a valid interface name (1-15 characters, no '/', ':' or spaces)",
            ));
        }
    }
    for (i, cidr) in c.service_cidrs.iter().enumerate() {
        if cidr.trim().parse::<ipnet::IpNet>().is_err() {
            errs.push(FieldError::invalid_str(
                format!("serviceCIDRs[{i}]"),
                cidr,
                "must be a CIDR (198.19.0.0/16, 2001:db8:ffff::/108)",
            ));
        }
    }
    for (path, v) in [
        ("maps.services", c.maps.services),
        ("maps.backends", c.maps.backends),
        ("maps.backendSlots", c.maps.backend_slots),
    ] {
        if !(1..=MAX_MAP_ENTRIES).contains(&v) {
            errs.push(FieldError::invalid(
                path,
                v.to_string(),
                format!("must be within the range [1, {MAX_MAP_ENTRIES}]"),
            ));
        }
    }
    if c.maps.conntrack != 0 && !(1024..=MAX_MAP_ENTRIES).contains(&c.maps.conntrack) {
        errs.push(FieldError::invalid(
            "maps.conntrack",
            c.maps.conntrack.to_string(),
            format!("must be 0 (derive from conntrack settings) or within the range [1024, {MAX_MAP_ENTRIES}]"),
        ));
    }
    let tables = u64::from(c.maglev_tables());
    let elements = tables
        * u64::from(proxy_common::maglev::chunks_per_table(
            c.load_balancing.maglev_table_size.max(1),
        ));
    if elements > u64::from(MAX_MAP_ENTRIES) {
        errs.push(FieldError::invalid(
            "maps.maglevTables",
            c.maps.maglev_tables.to_string(),
            format!(
                "{tables} tables of loadBalancing.maglevTableSize {} buckets need {elements} map elements, more than {MAX_MAP_ENTRIES}",
                c.load_balancing.maglev_table_size
            ),
        ));
    }
    if !std::path::Path::new(&c.pinning.root).is_absolute() {
        errs.push(FieldError::invalid_str(
            "pinning.root",
            &c.pinning.root,
            "must be an absolute path (a directory on a BPF filesystem)",
        ));
    }
    if !std::path::Path::new(&c.pinning.state_dir).is_absolute() {
        errs.push(FieldError::invalid_str(
            "pinning.stateDir",
            &c.pinning.state_dir,
            "must be an absolute path (a directory the agent may write)",
        ));
    }
    if !c.socket_lb.cgroup_path.is_empty()
        && !std::path::Path::new(&c.socket_lb.cgroup_path).is_absolute()
    {
        errs.push(FieldError::invalid_str(
            "socketLB.cgroupPath",
            &c.socket_lb.cgroup_path,
            "must be empty (the cgroup v2 root) or an absolute path (a cgroup v2 directory)",
        ));
    }
    let m = c.load_balancing.maglev_table_size;
    if !(251..=131_071).contains(&m) || !is_prime(m) {
        errs.push(FieldError::invalid(
            "loadBalancing.maglevTableSize",
            m.to_string(),
            "must be a prime number within the range [251, 131071]",
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(FieldErrors(errs))
    }
}

/// How our BPF conntrack table is sized and expired in ebpf mode, from the upstream
/// `conntrack.*` settings (which in the other modes become nf_conntrack sysctls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfConntrackParams {
    pub max_entries: u32,
    pub tcp_established: GoDuration,
    pub tcp_close_wait: GoDuration,
    pub udp: GoDuration,
    pub udp_stream: GoDuration,
}

/// Same formula as nf_conntrack_max (max(maxPerCore x cpus, min), capped at 2^20) unless
/// `maps.conntrack` is set. Timeouts of 0 ("leave the kernel value") use the kernel defaults.
pub fn conntrack_params(
    kube: &KubeProxyConfiguration,
    ext: &EbpfDatapathConfiguration,
    num_cpus: u32,
) -> BpfConntrackParams {
    let per_core = kube.conntrack.max_per_core.unwrap_or(0).max(0) as u64;
    let min = kube.conntrack.min.unwrap_or(0).max(0) as u64;
    let max_entries = if ext.maps.conntrack != 0 {
        ext.maps.conntrack
    } else if per_core > 0 {
        (per_core * num_cpus as u64).max(min).min(MAX_CONNTRACK) as u32
    } else {
        FALLBACK_CONNTRACK
    };
    let or = |d: GoDuration, fallback: GoDuration| if d.nanos() > 0 { d } else { fallback };
    BpfConntrackParams {
        max_entries,
        // kernel defaults: established 5 days, close_wait 60s
        tcp_established: or(
            kube.conntrack.tcp_established_timeout.unwrap_or_default(),
            GoDuration::from_secs(5 * 24 * 3600),
        ),
        tcp_close_wait: or(
            kube.conntrack.tcp_close_wait_timeout.unwrap_or_default(),
            GoDuration::from_secs(60),
        ),
        udp: or(kube.conntrack.udp_timeout, KERNEL_UDP_TIMEOUT),
        udp_stream: or(kube.conntrack.udp_stream_timeout, KERNEL_UDP_STREAM_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        assert!(is_prime(16_381));
        assert!(is_prime(251));
        assert!(!is_prime(16_384));
        assert!(!is_prime(1));
    }
}
