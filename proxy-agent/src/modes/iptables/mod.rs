//! The iptables mode (upstream's iptables proxier): probe, sysctls and
//! cleanup today; the proxier itself is not implemented yet.

pub mod cleanup;

use ipnet::IpNet;

use super::{CleanupTools, HostFeed, Mode, Running, not_implemented, tool_works};
use crate::{
    cleanup::Report,
    options::{NodePortAddresses, ProxyMode, ProxyOptions},
};

pub struct IptablesMode;

impl Mode for IptablesMode {
    fn kind(&self) -> ProxyMode {
        ProxyMode::Iptables
    }

    fn probe(&self) -> Result<(), String> {
        tool_works("iptables", &["-w", "-t", "nat", "-S", "POSTROUTING"])
    }

    fn sysctls(&self, o: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
        if o.config.iptables.localhost_node_ports.unwrap_or(true) && node_ports_on_loopback(o) {
            vec![("net/ipv4/conf/all/route_localnet", "1")]
        } else {
            Vec::new()
        }
    }

    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report) {
        cleanup::cleanup(tools.run, report);
    }

    fn start(&self, _: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        Err(not_implemented(self.kind()))
    }
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
