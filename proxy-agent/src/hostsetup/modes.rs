//! Per-mode kernel settings made at start-up and by `--init-only` (config_rules.md §3).

use ipnet::IpNet;

use super::params::{KernelParams, ParamWrite, set_if_different, sysctl_key};
use crate::options::{NodePortAddresses, ProxyMode, ProxyOptions};

/// The sysctls (`name`, value) the mode needs, in the order they are written.
pub fn mode_sysctls(o: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    match o.mode {
        ProxyMode::Iptables => {
            if o.config.iptables.localhost_node_ports.unwrap_or(true) && node_ports_on_loopback(o) {
                out.push(("net/ipv4/conf/all/route_localnet", "1"));
            }
        }
        ProxyMode::Ipvs => {
            out.push(("net/ipv4/vs/conntrack", "1"));
            out.push(("net/ipv4/vs/expire_nodest_conn", "1"));
            out.push(("net/ipv4/vs/expire_quiescent_template", "1"));
            out.push(("net/ipv4/ip_forward", "1"));
            if o.config.ipvs.strict_arp {
                out.push(("net/ipv4/conf/all/arp_ignore", "1"));
                out.push(("net/ipv4/conf/all/arp_announce", "2"));
            }
        }
        // nftables never allows localhost NodePorts; ebpf NATs in BPF and needs no sysctl.
        ProxyMode::Nftables | ProxyMode::Ebpf => {}
    }
    out
}

/// Whether IPv4 loopback is among the NodePort addresses (all IPs, or a CIDR holding 127.0.0.1).
fn node_ports_on_loopback(o: &ProxyOptions) -> bool {
    match o.node_port_addresses() {
        NodePortAddresses::All => true,
        NodePortAddresses::Primary => false,
        NodePortAddresses::Cidrs(list) => list
            .iter()
            .any(|n| matches!(n, IpNet::V4(v4) if v4.contains(&std::net::Ipv4Addr::LOCALHOST))),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("could not set sysctl {key} for the {mode} mode: {source}")]
pub struct ModeSysctlError {
    pub mode: ProxyMode,
    pub key: String,
    #[source]
    pub source: std::io::Error,
}

/// Writes the mode's sysctls (only those that differ).
pub fn apply(
    o: &ProxyOptions,
    p: &mut dyn KernelParams,
) -> Result<Vec<ParamWrite>, ModeSysctlError> {
    let mut writes = Vec::new();
    for (name, value) in mode_sysctls(o) {
        let key = sysctl_key(name);
        match set_if_different(p, &key, value) {
            Ok(Some(w)) => writes.push(w),
            Ok(None) => {}
            Err(source) => {
                return Err(ModeSysctlError {
                    mode: o.mode,
                    key,
                    source,
                });
            }
        }
    }
    Ok(writes)
}
