//! The ipvs mode (upstream's ipvs proxier): probe, sysctls and cleanup; the
//! virtual servers from the model and the netlink requests that program
//! them. The proxier that sends them (with its ipsets and companion
//! iptables rules) is not implemented yet.

pub mod cleanup;
pub mod messages;
pub mod virtual_servers;

use std::path::Path;

use super::{CleanupTools, HostFeed, Mode, Running, not_implemented};
use crate::{
    cleanup::Report,
    options::{ProxyMode, ProxyOptions},
};

pub struct IpvsMode;

impl Mode for IpvsMode {
    fn kind(&self) -> ProxyMode {
        ProxyMode::Ipvs
    }

    fn probe(&self) -> Result<(), String> {
        if Path::new("/proc/net/ip_vs").exists() {
            Ok(())
        } else {
            Err("the kernel has no IPVS support (/proc/net/ip_vs is missing)".into())
        }
    }

    fn sysctls(&self, o: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
        let mut out = vec![
            ("net/ipv4/vs/conntrack", "1"),
            ("net/ipv4/vs/expire_nodest_conn", "1"),
            ("net/ipv4/vs/expire_quiescent_template", "1"),
            ("net/ipv4/ip_forward", "1"),
        ];
        if o.config.ipvs.strict_arp {
            out.push(("net/ipv4/conf/all/arp_ignore", "1"));
            out.push(("net/ipv4/conf/all/arp_announce", "2"));
        }
        out
    }

    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report) {
        cleanup::cleanup(tools.genl, tools.run, report);
    }

    fn start(&self, _: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        Err(not_implemented(self.kind()))
    }
}
