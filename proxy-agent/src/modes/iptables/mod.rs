//! The iptables mode (upstream's iptables proxier): upstream's chains from
//! the model (`rules`) written with `iptables-restore` at each sync
//! (`proxier`), its sysctls and cleanup.

pub mod backend;
pub mod cleanup;
pub mod nfacct;
pub mod proxier;
pub mod rules;

use ipnet::IpNet;

pub use backend::IptablesBackend;

use super::{CleanupTools, HostFeed, Mode, Running, boxed, tool_works};
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
        let (backend, _) = IptablesBackend::detect();
        let tools = backend.tools(crate::model::IpFamily::V4);
        tool_works(tools.iptables, &["-w", "-t", "nat", "-S", "POSTROUTING"])
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

    fn start(&self, opts: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        self.probe().map_err(anyhow::Error::msg)?;
        let settings = crate::modes::nftables::proxier::NftSettings::from_options(opts);
        let proxier = proxier::IptablesProxier::new(settings);
        let metrics = proxier.metrics();
        Ok(Running {
            proxier: boxed(proxier),
            families: crate::model::IpFamily::BOTH.to_vec(),
            metrics,
            background: Box::pin(futures::future::pending()),
            // As upstream: the rules stay when the agent stops; `--cleanup` removes them.
            stop: Box::new(|| {}),
        })
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
