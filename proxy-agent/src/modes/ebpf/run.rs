//! The ebpf mode behind the [`Mode`] interface: load, pin, start the
//! proxier, keep the programs attached as the host's interfaces change.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    Attacher, EbpfNodeSettings, EbpfProxier, KernelMaps, MapSizes, cleanup, load_with,
    node::warn_if_snat_ports_overlap, pin, probe, stats,
};
use crate::{
    cleanup::Report,
    modes::{CleanupTools, HostFeed, Mode, Running, boxed},
    options::{ProxyMode, ProxyOptions, ebpf::conntrack_params},
    sources::host::HostNetwork,
};

/// How soon an attachment that failed is tried again.
const ATTACH_RETRY: Duration = Duration::from_millis(200);

pub struct EbpfMode;

impl Mode for EbpfMode {
    fn kind(&self) -> ProxyMode {
        ProxyMode::Ebpf
    }

    fn probe(&self) -> Result<(), String> {
        probe::probe()
    }

    /// The programs NAT in BPF: no sysctl needed.
    fn sysctls(&self, _: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report) {
        cleanup::detach(tools.run, report);
        cleanup::remove_pins(tools.pin_root, report);
    }

    fn start(&self, opts: &ProxyOptions, host: HostFeed<'_>) -> anyhow::Result<Running> {
        warn_unimplemented(opts);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let sizes = MapSizes {
            services: opts.ebpf.maps.services,
            backends: opts.ebpf.maps.backends,
            conntrack: conntrack_params(&opts.config, &opts.ebpf, cpus).max_entries,
        };
        let mut ebpf = load_with(sizes)?;
        // Before the maps are taken out of the object: pins them all by name.
        let pins = pin::pin_or_warn(&ebpf);
        let (maps, counters) = KernelMaps::take(&mut ebpf)?;
        warn_if_snat_ports_overlap();

        let settings = EbpfNodeSettings::from_options(opts);
        let proxier = EbpfProxier::new(maps, settings.clone(), host.initial)
            .context("writing the node's settings")?;
        info!(
            node = %opts.node_name,
            ?sizes,
            pod_interface_prefixes = ?settings.pod_interface_prefixes,
            xdp = ?opts.ebpf.xdp_mode,
            "datapath loaded"
        );
        let attacher = Arc::new(std::sync::Mutex::new(Attacher::new(
            ebpf,
            opts.ebpf.xdp_mode,
        )));
        let background = keep_attached(attacher.clone(), settings, host.changes);
        let stop = move || {
            let attacher = attacher.lock().unwrap_or_else(|e| e.into_inner());
            let detached: Vec<&str> = attacher.pod_names().collect();
            info!(detached = ?detached, counters = ?stats::read(&counters), "programs detached and maps released");
            if let Some(pins) = pins
                && let Err(e) = pins.unpin()
            {
                warn!(error = %e, "removing pinned maps");
            }
        };
        Ok(Running {
            proxier: boxed(proxier),
            background: Box::pin(background),
            stop: Box::new(stop),
        })
    }
}

/// Attaches the programs to the pod-facing and external interfaces of every
/// host snapshot, at once (not at the next sync), retrying failed ones.
async fn keep_attached(
    attacher: Arc<std::sync::Mutex<Attacher>>,
    settings: EbpfNodeSettings,
    mut host: watch::Receiver<Arc<HostNetwork>>,
) {
    loop {
        let snapshot = host.borrow_and_update().clone();
        let pods = settings.pod_interfaces(&snapshot);
        let external = settings.interface_roles(&snapshot).external;
        let complete = {
            let mut attacher = attacher.lock().unwrap_or_else(|e| e.into_inner());
            attacher.reconcile(&pods, &external).unwrap_or_else(|e| {
                warn!(error = %format!("{e:#}"), "reconciling interfaces");
                false
            })
        };
        if complete {
            if host.changed().await.is_err() {
                return std::future::pending().await;
            }
        } else {
            tokio::select! {
                changed = host.changed() => if changed.is_err() { return std::future::pending().await },
                _ = tokio::time::sleep(ATTACH_RETRY) => {}
            }
        }
    }
}

/// Settings that validate but that this datapath does not act on yet: say so
/// instead of silently ignoring them.
fn warn_unimplemented(opts: &ProxyOptions) {
    use crate::options::ebpf::LbAlgorithm;
    let ext = &opts.ebpf;
    if ext.load_balancing.algorithm != LbAlgorithm::Random {
        warn!(
            "loadBalancing.algorithm {:?} is not implemented yet; balancing is random",
            ext.load_balancing.algorithm
        );
    }
    if ext.socket_lb.enabled == Some(true) {
        warn!(
            "socketLB.enabled is not implemented yet; services are balanced by the TC programs only"
        );
    }
}
