//! The nftables mode (upstream's nftables proxier): the `kube-proxy` table
//! of each family written from the model (`ruleset`) in one transaction per
//! sync (`nft`), and its cleanup.

pub mod cleanup;
pub mod nft;
pub mod proxier;
pub mod ruleset;

use super::{CleanupTools, HostFeed, Mode, Running, boxed, tool_works};
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

    fn start(&self, opts: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        self.probe().map_err(anyhow::Error::msg)?;
        let proxier = proxier::NftablesProxier::new(proxier::NftSettings::from_options(opts));
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
