//! Defaulting, in upstream's two steps: `SetDefaults_KubeProxyConfiguration` (scheme defaults,
//! applied to flags and file alike) and `platformApplyDefaults` (Linux, after flags/file merge).

use super::duration::GoDuration;
use super::mode::{ModeChoice, ModeSupport, ProxyMode, pick_best};
use super::types::{API_VERSION, KIND, KubeProxyConfiguration};

pub const DEFAULT_HEALTHZ_PORT: u16 = 10256;
pub const DEFAULT_METRICS_PORT: u16 = 10249;
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -999;
pub const DEFAULT_MASQUERADE_BIT: i32 = 14;
pub const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub const DEFAULT_CONNTRACK_MAX_PER_CORE: i32 = 32 * 1024;
pub const DEFAULT_CONNTRACK_MIN: i32 = 128 * 1024;

/// `getDefaultAddresses`: the IPv4 server defaults only when `bindAddress` parses (sloppily) as
/// an IPv4 address; anything else, a dual-stack pair included, gets the IPv6 ones.
fn bind_is_ipv4(bind_address: &str) -> bool {
    super::validate::parse_ip(bind_address).is_some_and(super::validate::is_ipv4_like)
}

/// `proxyutil.AppendPortIfNeeded`: an address without a port that is an IP gets `:port`
/// (`[ip]:port` for IPv6), written as given; anything else is left alone for validation.
pub fn append_port_if_needed(addr: &str, port: u16) -> String {
    if super::validate::split_host_port(addr).is_some() {
        return addr.to_string();
    }
    match super::validate::parse_ip(addr) {
        None => addr.to_string(),
        Some(ip) if super::validate::is_ipv4_like(ip) => format!("{addr}:{port}"),
        Some(_) => format!("[{addr}]:{port}"),
    }
}

/// Upstream's scheme defaults. Zero-valued plain fields and absent pointer fields get defaults.
pub fn set_defaults(c: &mut KubeProxyConfiguration) {
    if c.api_version.is_empty() {
        c.api_version = API_VERSION.into();
    }
    if c.kind.is_empty() {
        c.kind = KIND.into();
    }
    if c.bind_address.is_empty() {
        c.bind_address = "0.0.0.0".into();
    }
    let v6 = !bind_is_ipv4(&c.bind_address);
    if c.healthz_bind_address.is_empty() {
        let host = if v6 { "[::]" } else { "0.0.0.0" };
        c.healthz_bind_address = format!("{host}:{DEFAULT_HEALTHZ_PORT}");
    } else {
        c.healthz_bind_address =
            append_port_if_needed(&c.healthz_bind_address, DEFAULT_HEALTHZ_PORT);
    }
    if c.metrics_bind_address.is_empty() {
        let host = if v6 { "[::1]" } else { "127.0.0.1" };
        c.metrics_bind_address = format!("{host}:{DEFAULT_METRICS_PORT}");
    } else {
        c.metrics_bind_address =
            append_port_if_needed(&c.metrics_bind_address, DEFAULT_METRICS_PORT);
    }
    c.oom_score_adj.get_or_insert(DEFAULT_OOM_SCORE_ADJ);
    if c.iptables.sync_period == GoDuration::ZERO {
        c.iptables.sync_period = GoDuration::from_secs(30);
    }
    if c.iptables.min_sync_period == GoDuration::ZERO {
        c.iptables.min_sync_period = GoDuration::from_secs(1);
    }
    c.iptables.localhost_node_ports.get_or_insert(true);
    c.iptables
        .masquerade_bit
        .get_or_insert(DEFAULT_MASQUERADE_BIT);
    if c.ipvs.sync_period == GoDuration::ZERO {
        c.ipvs.sync_period = GoDuration::from_secs(30);
    }
    if c.nftables.sync_period == GoDuration::ZERO {
        c.nftables.sync_period = GoDuration::from_secs(30);
    }
    if c.nftables.min_sync_period == GoDuration::ZERO {
        c.nftables.min_sync_period = GoDuration::from_secs(1);
    }
    // ipvs.minSyncPeriod has no default (0 stays 0).
    c.nftables
        .masquerade_bit
        .get_or_insert(DEFAULT_MASQUERADE_BIT);
    c.conntrack
        .max_per_core
        .get_or_insert(DEFAULT_CONNTRACK_MAX_PER_CORE);
    c.conntrack.min.get_or_insert(DEFAULT_CONNTRACK_MIN);
    c.conntrack
        .tcp_established_timeout
        .get_or_insert(GoDuration::from_secs(24 * 3600));
    c.conntrack
        .tcp_close_wait_timeout
        .get_or_insert(GoDuration::from_secs(3600));
    if c.config_sync_period == GoDuration::ZERO {
        c.config_sync_period = GoDuration::from_secs(15 * 60);
    }
    if c.client_connection.content_type.is_empty() {
        c.client_connection.content_type = DEFAULT_CONTENT_TYPE.into();
    }
    if c.client_connection.qps == 0.0 {
        c.client_connection.qps = 5.0;
    }
    if c.client_connection.burst == 0 {
        c.client_connection.burst = 10;
    }
    // logsapi.SetRecommendedLoggingConfiguration
    if c.logging.format.is_empty() {
        c.logging.format = "text".into();
    }
    if c.logging.flush_frequency == GoDuration::ZERO {
        c.logging.flush_frequency = GoDuration::from_secs(5);
    }
}

/// Linux `platformApplyDefaults`, with our twist: a blank mode is resolved by probing the node
/// (ebpf, else nftables, else iptables) instead of always meaning iptables.
/// Returns how the mode was chosen (`None` when it was given explicitly).
pub fn platform_apply_defaults(
    c: &mut KubeProxyConfiguration,
    support: &dyn ModeSupport,
) -> Option<ModeChoice> {
    let choice = if c.mode.is_empty() {
        let choice = pick_best(support);
        c.mode = choice.mode.as_str().into();
        Some(choice)
    } else {
        None
    };
    if c.mode == ProxyMode::Nftables.as_str() && c.node_port_addresses.is_empty() {
        c.node_port_addresses = vec!["primary".into()];
    }
    if c.detect_local_mode.is_empty() {
        c.detect_local_mode = "ClusterCIDR".into();
    }
    choice
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_port() {
        assert_eq!(append_port_if_needed("0.0.0.0", 10256), "0.0.0.0:10256");
        assert_eq!(append_port_if_needed("::", 10256), "[::]:10256");
        assert_eq!(append_port_if_needed("1.2.3.4:99", 10256), "1.2.3.4:99");
        assert_eq!(append_port_if_needed("nonsense", 10256), "nonsense");
        // written as given, like Go's Sprintf of the original string
        assert_eq!(append_port_if_needed("010.0.0.1", 1), "010.0.0.1:1");
        assert_eq!(append_port_if_needed("0:0::1", 1), "[0:0::1]:1");
    }
}
