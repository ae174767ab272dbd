//! `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration`, field for field.
//!
//! Pointer fields of the Go type (`*int32`, `*bool`, `*Duration`) are `Option` here so that
//! "absent" and "zero" stay distinct, exactly as upstream's defaulting relies on; every other
//! field uses Go's zero-value semantics (absent, `null` and zero are the same).
//! Every struct rejects unknown fields; `decode.rs` finds them first (full field path, file
//! name) and either fails or, as upstream's lenient decoding does, warns and drops them.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::duration::GoDuration;
use super::quantity::Quantity;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

/// Go's JSON decoding leaves a non-pointer field at its zero value when it is `null`.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Go's encoder writes a float without a fraction as an integer (`qps: 5`, not `5.0`).
fn go_float<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
    // Exactly representable integers only; anything else as a float.
    if v.fract() == 0.0 && v.abs() < (1u64 << 53) as f32 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f32(*v)
    }
}

/// Go writes a nil slice as `null`, and upstream's lists are nil unless set; reading `null`
/// back gives the empty list again.
fn null_if_empty<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    if v.is_empty() {
        s.serialize_none()
    } else {
        v.serialize(s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub client_connection: ClientConnectionConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub logging: LoggingConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub hostname_override: String,
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub healthz_bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub metrics_bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address_hard_fail: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub enable_profiling: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub show_hidden_metrics_for_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub mode: String,
    #[serde(default, deserialize_with = "nullable")]
    pub iptables: KubeProxyIPTablesConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub ipvs: KubeProxyIPVSConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub nftables: KubeProxyNFTablesConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub winkernel: KubeProxyWinkernelConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local_mode: String,
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local: DetectLocalConfiguration,
    #[serde(default, rename = "clusterCIDR", deserialize_with = "nullable")]
    pub cluster_cidr: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        serialize_with = "null_if_empty"
    )]
    pub node_port_addresses: Vec<String>,
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub conntrack: KubeProxyConntrackConfiguration,
    #[serde(default, deserialize_with = "nullable")]
    pub config_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub port_range: String,
    #[serde(default, deserialize_with = "nullable")]
    pub windows_run_as_service: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnectionConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub kubeconfig: String,
    #[serde(default, deserialize_with = "nullable")]
    pub accept_content_types: String,
    #[serde(default, deserialize_with = "nullable")]
    pub content_type: String,
    #[serde(default, deserialize_with = "nullable", serialize_with = "go_float")]
    pub qps: f32,
    #[serde(default, deserialize_with = "nullable")]
    pub burst: i32,
}

/// component-base `LoggingConfiguration`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoggingConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub format: String,
    #[serde(
        default,
        deserialize_with = "super::duration::time_or_meta::deserialize"
    )]
    pub flush_frequency: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub verbosity: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub vmodule: Vec<VModuleItem>,
    #[serde(default, deserialize_with = "nullable")]
    pub options: FormatOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VModuleItem {
    #[serde(default, deserialize_with = "nullable")]
    pub file_pattern: String,
    #[serde(default, deserialize_with = "nullable")]
    pub verbosity: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FormatOptions {
    #[serde(default, deserialize_with = "nullable")]
    pub text: OutputRoutingOptions,
    #[serde(default, deserialize_with = "nullable")]
    pub json: OutputRoutingOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutputRoutingOptions {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "is_false"
    )]
    pub split_stream: bool,
    #[serde(default)]
    pub info_buffer_size: Quantity,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyIPTablesConfiguration {
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    #[serde(default)]
    pub localhost_node_ports: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    /// A plain `metav1.Duration` upstream (not a pointer): 0 in a file is defaulted to 1s.
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyIPVSConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduler: String,
    #[serde(
        default,
        rename = "excludeCIDRs",
        deserialize_with = "nullable",
        serialize_with = "null_if_empty"
    )]
    pub exclude_cidrs: Vec<String>,
    #[serde(default, rename = "strictARP", deserialize_with = "nullable")]
    pub strict_arp: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_fin_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyNFTablesConfiguration {
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    /// A plain `metav1.Duration` upstream (not a pointer): 0 in a file is defaulted to 1s.
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyWinkernelConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub network_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub source_vip: String,
    #[serde(default, rename = "enableDSR", deserialize_with = "nullable")]
    pub enable_dsr: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub root_hns_endpoint_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub forward_health_check_vip: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DetectLocalConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub bridge_interface: String,
    #[serde(default, deserialize_with = "nullable")]
    pub interface_name_prefix: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConntrackConfiguration {
    #[serde(default)]
    pub max_per_core: Option<i32>,
    #[serde(default)]
    pub min: Option<i32>,
    #[serde(default)]
    pub tcp_established_timeout: Option<GoDuration>,
    #[serde(default)]
    pub tcp_close_wait_timeout: Option<GoDuration>,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_be_liberal: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_stream_timeout: GoDuration,
}
