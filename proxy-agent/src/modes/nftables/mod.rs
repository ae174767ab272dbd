//! The nftables mode (upstream's nftables proxier): probe and cleanup today;
//! the proxier itself is not implemented yet.

pub mod cleanup;

use super::{CleanupTools, HostFeed, Mode, Running, not_implemented, tool_works};
use crate::{
    cleanup::Report,
    options::{ProxyMode, ProxyOptions},
};

pub struct NftablesMode;

impl Mode for NftablesMode {
    fn kind(&self) -> ProxyMode {
        ProxyMode::Nftables
    }

    fn probe(&self) -> Result<(), String> {
        tool_works("nft", &["list", "tables"])
    }

    /// nftables never allows localhost NodePorts, so it needs no sysctl.
    fn sysctls(&self, _: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report) {
        cleanup::cleanup(tools.run, report);
    }

    fn start(&self, _: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        Err(not_implemented(self.kind()))
    }
}
