//! kube-proxy's command line and `KubeProxyConfiguration`, reproduced exactly, plus our
//! `EbpfDatapathConfiguration` extension (see [`ebpf`]).
//!
//! [`parse`] runs upstream's start-up order (config_rules.md §3): flags -> `--version` ->
//! `--config` file *or* flag-built config -> scheme defaults -> platform defaults (blank mode
//! resolved by probing) -> `--hostname-override` -> validation. Nothing on the node is touched
//! here apart from read-only probes, so every bad input fails before any change.

pub mod checks;
pub mod decode;
pub mod defaults;
pub mod duration;
pub mod ebpf;
pub mod error;
pub mod features;
pub mod file_watch;
pub mod flags;
pub mod merge;
pub mod mode;
pub mod quantity;
pub mod types;
pub mod validate;
pub mod version;
pub mod write;

use std::ffi::OsString;
use std::path::PathBuf;

use ipnet::IpNet;

pub use duration::GoDuration;
pub use ebpf::EbpfDatapathConfiguration;
pub use error::{FieldError, FieldErrors, OptionsError};
pub use mode::{ModeChoice, ModeSupport, ProxyMode};
pub use types::KubeProxyConfiguration;

/// What the environment provides to option processing; tests substitute both.
pub struct Environment<'a> {
    /// Which proxy modes this node supports (used to resolve a blank mode).
    pub support: &'a dyn ModeSupport,
    /// The OS hostname; `None` reads it from the kernel.
    pub hostname: Option<String>,
}

impl Default for Environment<'static> {
    fn default() -> Self {
        Environment {
            support: &crate::modes::HostSupport,
            hostname: None,
        }
    }
}

/// The result of option processing.
#[derive(Debug)]
pub enum Parsed {
    /// `--help`: print and exit 0.
    Help(String),
    /// `--version` / `--version=raw`: print and exit 0.
    Version(String),
    /// Everything else: the validated settings.
    Run(Box<ProxyOptions>),
}

/// Validated settings: the upstream config (merged, defaulted), our extension, and the
/// flag-only actions.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub config: KubeProxyConfiguration,
    pub ebpf: EbpfDatapathConfiguration,
    /// The active mode (a blank setting already resolved).
    pub mode: ProxyMode,
    /// How a blank mode was resolved; `None` when the mode was set explicitly.
    pub mode_choice: Option<ModeChoice>,
    /// The Node name: `hostnameOverride` or the OS hostname, trimmed and lower-cased.
    pub node_name: String,
    pub config_file: Option<PathBuf>,
    pub ebpf_config_file: Option<PathBuf>,
    pub write_config_to: Option<PathBuf>,
    pub ebpf_write_config_to: Option<PathBuf>,
    pub cleanup: bool,
    pub init_only: bool,
    /// `--master`: API server URL overriding the kubeconfig's.
    pub master: String,
    /// `--manifests DIR` (ours): standalone source instead of the API server.
    pub manifests: Option<PathBuf>,
    /// The version string reported (`--version=vX.Y.Z` changes it).
    pub reported_version: String,
    /// Warnings to log once logging is up (deprecated flags, ignored flags, removed fields).
    pub warnings: Vec<String>,
    /// The command line these options came from (program name first), so that a changed
    /// config file can be checked the way a restart would load it (`file_watch`).
    pub args: Vec<OsString>,
    /// The files read (`--config`, `--ebpf-config`) with the exact content used.
    pub loaded_files: Vec<LoadedFile>,
}

/// A configuration file as read at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedFile {
    /// As given on the command line.
    pub path: PathBuf,
    pub contents: String,
}

/// `nodePortAddresses` interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Empty list: every local IP.
    All,
    /// `["primary"]`: the node's primary IP(s) only.
    Primary,
    Cidrs(Vec<IpNet>),
}

impl ProxyOptions {
    /// The unified sync period of the active mode (conversion rule of config_rules.md §2).
    pub fn sync_period(&self) -> GoDuration {
        validate::sync_section(&self.config).1
    }
    pub fn min_sync_period(&self) -> GoDuration {
        validate::sync_section(&self.config).2
    }
    /// `Linux.MasqueradeAll`: from nftables in nftables mode, from iptables otherwise.
    pub fn masquerade_all(&self) -> bool {
        match self.mode {
            ProxyMode::Nftables => self.config.nftables.masquerade_all,
            _ => self.config.iptables.masquerade_all,
        }
    }
    /// The masquerade mark bit the proxier uses.
    pub fn masquerade_bit(&self) -> i32 {
        match self.mode {
            ProxyMode::Nftables => self.config.nftables.masquerade_bit,
            _ => self.config.iptables.masquerade_bit,
        }
        .unwrap_or(defaults::DEFAULT_MASQUERADE_BIT)
    }
    /// `DetectLocal.ClusterCIDRs`.
    pub fn cluster_cidrs(&self) -> Vec<IpNet> {
        self.config
            .cluster_cidr
            .split(',')
            .filter_map(validate::parse_cidr)
            .collect()
    }
    pub fn node_port_addresses(&self) -> NodePortAddresses {
        match self.config.node_port_addresses.as_slice() {
            [] => NodePortAddresses::All,
            [p] if p == "primary" => NodePortAddresses::Primary,
            list => NodePortAddresses::Cidrs(
                list.iter()
                    .filter_map(|c| validate::parse_cidr(c))
                    .collect(),
            ),
        }
    }
    /// Fails when the (explicit or resolved) mode cannot work on this node, as upstream does
    /// at proxier creation. Not part of [`parse`] so `--write-config-to` and `--cleanup` work
    /// anywhere.
    pub fn check_mode_supported(&self, support: &dyn ModeSupport) -> Result<(), OptionsError> {
        support
            .check(self.mode)
            .map_err(|reason| OptionsError::ModeUnsupported {
                // Upstream's words: "can't use the IPVS proxier: ...".
                mode: match self.mode {
                    ProxyMode::Ipvs => "IPVS".into(),
                    m => m.to_string(),
                },
                reason,
            })
    }
}

/// Runs option processing on `args` (program name first).
pub fn parse<I, T>(args: I, env: &Environment<'_>) -> Result<Parsed, OptionsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    merge::run(args.into_iter().map(Into::into).collect(), env)
}
