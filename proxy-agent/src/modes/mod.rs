//! The proxy modes, one folder each, behind one [`Mode`] interface: whether
//! the node can run it (probe), the kernel parameters it needs (sysctls),
//! what it leaves behind (cleanup), and starting it (a [`Proxier`] for the
//! sync engine, plus whatever the mode keeps doing beside syncs). The agent's
//! runtime only talks to this interface.

pub mod conntrack;
pub mod detect_local;
pub mod ebpf;
pub mod iptables;
pub mod ipvs;
pub mod nfnetlink;
pub mod nftables;

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
};

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::{
    cleanup::{CommandRunner, GenlTransport, Report},
    model::{DesiredState, NodeModel},
    options::{ProxyMode, ProxyOptions, mode::ModeSupport},
    sources::host::HostNetwork,
    sync::{Proxier, SyncChanges},
};

/// One proxy mode.
pub trait Mode: Sync {
    fn kind(&self) -> ProxyMode;

    /// `Ok(())` when this node can run the mode, else the reason it cannot.
    fn probe(&self) -> Result<(), String>;

    /// The sysctls (`name`, value) the mode needs, in the order they are written.
    fn sysctls(&self, opts: &ProxyOptions) -> Vec<(&'static str, &'static str)>;

    /// Removes whatever the mode (ours or upstream's) leaves on a node.
    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report);

    /// Starts the datapath for `node` (the model before the sources ran).
    fn start(&self, opts: &ProxyOptions, host: HostFeed<'_>) -> anyhow::Result<Running>;
}

/// What a cleanup may use: commands, generic netlink, the BPF pin root.
pub struct CleanupTools<'a> {
    pub run: &'a mut dyn CommandRunner,
    pub genl: &'a mut dyn GenlTransport,
    pub pin_root: &'a Path,
}

/// The host source as a starting mode sees it.
pub struct HostFeed<'a> {
    /// The node model from the options and the host alone (no Node object yet).
    pub initial: &'a NodeModel,
    /// Every new host snapshot, for work that cannot wait for a sync.
    pub changes: watch::Receiver<Arc<HostNetwork>>,
}

/// A started mode.
pub struct Running {
    pub proxier: ModeProxier,
    /// The IP families the mode serves (each reports its health on its own).
    pub families: Vec<crate::model::IpFamily>,
    /// The mode's own metrics, collected at each scrape.
    pub metrics: Vec<Box<dyn prometheus_client::collector::Collector>>,
    /// Work beside the syncs (keeping programs attached); runs until the
    /// agent stops, or returns why the mode cannot go on.
    pub background: BoxFuture<'static, anyhow::Error>,
    /// Runs once when the agent stops.
    pub stop: Box<dyn FnOnce() + Send>,
}

/// Any mode's proxier, as the sync engine drives it.
pub type ModeProxier = Box<dyn Proxier<Error = ModeSyncError>>;

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ModeSyncError(Box<dyn std::error::Error + Send + Sync>);

/// Adapts a mode's own proxier to [`ModeProxier`].
pub fn boxed<P>(proxier: P) -> ModeProxier
where
    P: Proxier + 'static,
{
    struct Boxed<P>(P);
    impl<P: Proxier> Proxier for Boxed<P> {
        type Error = ModeSyncError;
        fn sync(
            &mut self,
            desired: &DesiredState,
            changes: &SyncChanges,
        ) -> Result<(), Self::Error> {
            self.0
                .sync(desired, changes)
                .map_err(|e| ModeSyncError(Box::new(e)))
        }
        fn after_sync(&mut self, desired: &DesiredState, changes: &SyncChanges) {
            self.0.after_sync(desired, changes)
        }
    }
    Box::new(Boxed(proxier))
}

/// The implementation of `mode`.
pub fn of(mode: ProxyMode) -> &'static dyn Mode {
    match mode {
        ProxyMode::Ebpf => &ebpf::EbpfMode,
        ProxyMode::Nftables => &nftables::NftablesMode,
        ProxyMode::Iptables => &iptables::IptablesMode,
        ProxyMode::Ipvs => &ipvs::IpvsMode,
    }
}

/// The live probes of every mode, for choosing and checking the mode at start.
#[derive(Debug, Clone, Default)]
pub struct HostSupport;

impl ModeSupport for HostSupport {
    fn check(&self, mode: ProxyMode) -> Result<(), String> {
        of(mode).probe()
    }
}

/// Runs a tool as a probe: `Ok` when it exits 0.
fn tool_works(program: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {program}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_answers_every_probe() {
        // Whatever the host supports, each probe returns (no panic, no hang) with a reason.
        for m in ProxyMode::ALL {
            assert_eq!(of(m).kind(), m);
            if let Err(why) = HostSupport.check(m) {
                assert!(!why.is_empty(), "{m}");
            }
        }
    }
}
