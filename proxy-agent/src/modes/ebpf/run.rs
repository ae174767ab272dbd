//! The ebpf mode behind the [`Mode`] interface: load, pin, start the
//! proxier, keep the programs attached as the host's interfaces change.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::{info, warn};

use super::introspect::names::names_path;
use super::{
    Attacher, EbpfNodeSettings, EbpfProxier, KernelMaps, MapSizes, cleanup, load_pinned, load_with,
    migrate,
    node::warn_if_snat_ports_overlap,
    object_maps,
    pin::{Found, PinError, PinLayout},
    probe,
    publish::NamesPublisher,
    sockets, stats,
};
use crate::{
    cleanup::Report,
    model::IpFamily,
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
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let sizes = MapSizes {
            services: opts.ebpf.maps.services,
            backends: opts.ebpf.maps.backends,
            conntrack: conntrack_params(&opts.config, &opts.ebpf, cpus).max_entries,
            maglev: opts.ebpf.maglev_chunks(),
        };
        let Opened {
            mut ebpf,
            maps,
            counters,
            pins,
            takeover,
        } = open(&PinLayout::new(&opts.ebpf.pinning.root), sizes)?;
        let adopting = takeover != Takeover::Fresh;
        warn_if_snat_ports_overlap();

        let mut settings = EbpfNodeSettings::from_options(opts);
        let mut socket_hooks =
            sockets::start(&mut ebpf, opts, pins.as_ref(), &mut settings.socket_lb);
        settings.localhost_node_ports &= socket_hooks.is_some();
        // After the socket programs loaded: they use maps of their own.
        let datapath_metrics = super::metrics::DatapathMetrics::of(&ebpf);
        let proxier = if adopting {
            EbpfProxier::adopting(maps, settings.clone())
        } else {
            EbpfProxier::new(maps, settings.clone(), host.initial)
                .context("writing the node's settings")?
        };
        let state_dir = PathBuf::from(&opts.ebpf.pinning.state_dir);
        let proxier = proxier.publishing_names(NamesPublisher::new(
            state_dir.clone(),
            opts.node_name.clone(),
            opts.ebpf.pinning.root.clone(),
        ));
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
            pins.clone(),
        )));
        let background = keep_attached(attacher.clone(), settings, host.changes);
        let detach_on_exit = opts.ebpf.pinning.detach_on_exit;
        let stop = move || {
            let mut attacher = attacher.lock().unwrap_or_else(|e| e.into_inner());
            let counters = stats::read(&counters);
            match pins {
                Some(pins) if !detach_on_exit => info!(
                    pin_root = %pins.root().display(),
                    ?counters,
                    "datapath left in place: it keeps serving until the next agent takes it over (`--cleanup` removes it)"
                ),
                _ => {
                    if let Some(pins) = pins {
                        attacher.unpin_links();
                        if let Some(hooks) = socket_hooks.as_mut() {
                            hooks.unpin();
                        }
                        if let Err(e) = pins.remove_all() {
                            warn!(error = %e, "removing the pins");
                        }
                    }
                    drop(socket_hooks.take());
                    // The ids it names are gone with the maps.
                    let _ = std::fs::remove_file(names_path(&state_dir));
                    let detached: Vec<&str> = attacher.pod_names().collect();
                    info!(detached = ?detached, ?counters, "programs detached and maps released");
                }
            }
        };
        Ok(Running {
            proxier: boxed(proxier),
            // One sync programs both families' maps.
            families: IpFamily::BOTH.to_vec(),
            metrics: Some(Box::new(datapath_metrics)),
            background: Box::pin(background),
            stop: Box::new(stop),
        })
    }
}

/// How a start relates to a datapath an earlier agent pinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// Nothing was pinned (or nothing can be).
    Fresh,
    /// Maps of this ABI: reused as they are.
    Adopt,
    /// Maps of an older ABI in `dir`: copied into new ones, then taken over.
    Migrate { version: u32, dir: PathBuf },
}

/// The loaded datapath, its maps taken out of the object.
pub struct Opened {
    pub ebpf: aya::Ebpf,
    pub maps: KernelMaps,
    pub counters: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    pub pins: Option<PinLayout>,
    pub takeover: Takeover,
}

/// Loads the programs pinned under `layout` (see [`load`]), and migrates the
/// maps an older ABI version pinned.
pub fn open(layout: &PinLayout, sizes: MapSizes) -> anyhow::Result<Opened> {
    let (mut ebpf, pins, takeover) = load(layout, sizes)?;
    let (mut maps, mut counters) = KernelMaps::take(&mut ebpf)?;
    if let Takeover::Migrate { version, dir } = &takeover {
        migrate::migrate(*version, dir, &mut maps, &mut counters)
            .with_context(|| format!("migrating the maps pinned by ABI version {version}"))?;
        if let Err(e) = layout.remove_other_versions() {
            warn!(error = %e, "removing the migrated maps' pins");
        }
    }
    Ok(Opened {
        ebpf,
        maps,
        counters,
        pins,
        takeover,
    })
}

/// Loads the programs, pinned under `layout` when its root is on a BPF
/// filesystem (reusing what is pinned there), else unpinned.
pub fn load(
    layout: &PinLayout,
    mut sizes: MapSizes,
) -> anyhow::Result<(aya::Ebpf, Option<PinLayout>, Takeover)> {
    use proxy_common::maps as names;
    let found = match layout.inspect(&object_maps()?) {
        Ok(found) => found,
        Err(e @ (PinError::NotBpffs { .. } | PinError::Io { .. })) => {
            warn!(
                error = %e,
                "running without pinned maps: the datapath goes away with the agent, so a restart \
                 cuts established connections, and `proxy-agent explain --online` cannot read it"
            );
            return Ok((load_with(sizes)?, None, Takeover::Fresh));
        }
        Err(e) => return Err(e.into()),
    };
    let (takeover, capacities) = match found {
        Found::Nothing => (Takeover::Fresh, Default::default()),
        Found::Current { capacities } => (Takeover::Adopt, capacities),
        Found::Older {
            version,
            dir,
            capacities,
        } => (Takeover::Migrate { version, dir }, capacities),
    };
    for (name, size) in [
        (names::SERVICES, &mut sizes.services),
        (names::BACKENDS, &mut sizes.backends),
        (names::CONNTRACK, &mut sizes.conntrack),
        (names::MAGLEV, &mut sizes.maglev),
    ] {
        if let Some(pinned) = capacities.get(name)
            && pinned != size
        {
            warn!(
                map = name,
                pinned,
                configured = *size,
                "a pinned map keeps its capacity; `--cleanup` and a restart apply the new one"
            );
            *size = *pinned;
        }
    }
    let ebpf = load_pinned(sizes, &layout.maps_dir())?;
    info!(
        pin_root = %layout.root().display(),
        takeover = ?takeover,
        "maps pinned"
    );
    Ok((ebpf, Some(layout.clone()), takeover))
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
