//! The ebpf mode behind the [`Mode`] interface: load, pin, start the
//! proxier, keep the programs attached as the host's interfaces change.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::{info, warn};

use super::introspect::names::names_path;
use super::{
    Attacher, EbpfNodeSettings, EbpfProxier, KernelMaps, MapSizes, cleanup, collector, create_maps,
    load_packet_programs, migrate,
    node::masquerade_port_ranges,
    object_maps,
    pin::{Found, PinError, PinLayout},
    probe,
    programs_ready::ProgramsReady,
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
            slots: opts.ebpf.maps.backend_slots,
        };
        let Opened {
            mut ebpf,
            maps,
            counters,
            pins,
            takeover,
        } = open_maps(&PinLayout::new(&opts.ebpf.pinning.root), sizes)?;
        let adopting = takeover != Takeover::Fresh;

        let mut settings = EbpfNodeSettings::from_options(opts);
        log_masquerade_ports(settings.ephemeral_ports);
        let socket_hooks = sockets::start(&mut ebpf, opts, pins.as_ref(), &mut settings.socket_lb);
        settings.localhost_node_ports &= socket_hooks.is_some();
        let proxier = if adopting {
            EbpfProxier::adopting(maps, settings.clone())
        } else {
            EbpfProxier::new(maps, settings.clone(), host.initial)
                .context("writing the node's settings")?
        };
        let state_dir = PathBuf::from(&opts.ebpf.pinning.state_dir);
        let conntrack_metrics = proxier.conntrack_metrics();
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
            "maps ready; the packet programs are being verified"
        );
        // The verifier takes about half a second on a small node: the first
        // sync fills the maps meanwhile, and the programs are attached once verified
        // (an earlier agent's pinned programs serve until then).
        let metrics = Arc::new(std::sync::OnceLock::new());
        let attacher = Arc::new(std::sync::Mutex::new(None));
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ready = ProgramsReady::default();
        let proxier = proxier.waiting_for(ready.clone());
        let background = attach_once_verified(
            ebpf,
            Verified {
                metrics: metrics.clone(),
                attacher: attacher.clone(),
                stopped: stopped.clone(),
                ready,
                xdp: opts.ebpf.xdp_mode,
                pins: pins.clone(),
            },
            settings,
            host.changes,
        );
        let stop = stopper(
            Stopping {
                attacher,
                stopped,
                socket_hooks,
                counters,
                pins,
                state_dir,
            },
            opts.ebpf.pinning.detach_on_exit,
        );
        Ok(Running {
            proxier: boxed(proxier),
            // One sync programs both families' maps.
            families: IpFamily::BOTH.to_vec(),
            metrics: vec![
                Box::new(super::metrics::Deferred(metrics)),
                Box::new(conntrack_metrics),
            ],
            background: Box::pin(background),
            stop: Box::new(stop),
        })
    }
}

/// Where the verified datapath goes: the metrics, the stop, the first sync.
struct Verified {
    metrics: Arc<std::sync::OnceLock<super::metrics::DatapathMetrics>>,
    attacher: Arc<std::sync::Mutex<Option<Attacher>>>,
    /// Set by the stop under the attacher's lock: nothing is attached after it.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    ready: ProgramsReady,
    xdp: crate::options::ebpf::XdpMode,
    pins: Option<PinLayout>,
}

/// Verifies the packet programs on threads of their own (from now on) and
/// attaches them to the interfaces there are; the future returned keeps them
/// attached, and returns only when they cannot be loaded.
fn attach_once_verified(
    mut ebpf: aya::Ebpf,
    verified: Verified,
    settings: EbpfNodeSettings,
    host: watch::Receiver<Arc<HostNetwork>>,
) -> impl std::future::Future<Output = anyhow::Error> + Send + 'static {
    let started = std::time::Instant::now();
    let Verified {
        metrics,
        attacher,
        stopped,
        ready,
        xdp,
        pins,
    } = verified;
    let (first_host, first_settings, first_attacher) =
        (host.clone(), settings.clone(), attacher.clone());
    // All on a thread of its own, started now: the first sync waits for it
    // while blocking the task that polls this future.
    let (done, loaded) = tokio::sync::oneshot::channel();
    let on_panic = ready.clone();
    let load = move || -> anyhow::Result<()> {
        let loaded = load_packet_programs(&mut ebpf);
        if let Err(e) = &loaded {
            ready.set(Err(format!("{e:#}")));
        }
        loaded?;
        info!(took = ?started.elapsed(), "packet programs verified");
        // The agent sweeps conntrack itself while it runs (in process
        // context); without it, the datapath's timer does.
        let sweeper = collector::Sweep::of(&ebpf).and_then(|sweep| {
            let sweeper = collector::Sweeper {
                sweep,
                every: Duration::from_nanos(proxy_common::collector::SWEEP_INTERVAL_NS),
                stopped: stopped.clone(),
            };
            Ok(sweeper.spawn()?)
        });
        if let Err(e) = sweeper {
            warn!(
                error = %format!("{e:#}"),
                "the agent's conntrack sweeper did not start: the datapath's timer sweeps, in softirq"
            );
        }
        // After every program loaded: the metrics name the maps they use.
        let _ = metrics.set(super::metrics::DatapathMetrics::of(&ebpf));
        let mut slot = first_attacher.lock().unwrap_or_else(|e| e.into_inner());
        if stopped.load(std::sync::atomic::Ordering::Relaxed) {
            ready.set(Err("the agent is stopping".into()));
            return Ok(());
        }
        let mut first = Attacher::new(ebpf, xdp, pins);
        let snapshot = first_host.borrow().clone();
        let pods = first_settings.pod_interfaces(&snapshot);
        let external = first_settings.interface_roles(&snapshot).external;
        if let Err(e) = first.reconcile(&pods, &external) {
            warn!(error = %format!("{e:#}"), "reconciling interfaces");
        }
        *slot = Some(first);
        ready.set(Ok(()));
        Ok(())
    };
    std::thread::Builder::new()
        .name("verifier".into())
        .spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(load))
                .unwrap_or_else(|_| {
                    on_panic.set(Err("the verifier thread panicked".into()));
                    Err(anyhow::anyhow!("the verifier thread panicked"))
                });
            let _ = done.send(outcome);
        })
        .expect("spawning the verifier thread");
    async move {
        match loaded.await {
            Ok(Ok(())) => keep_attached(attacher, settings, host).await,
            Ok(Err(e)) => e,
            Err(_) => anyhow::anyhow!("the verifier thread ended without an answer"),
        }
    }
}

/// What the agent's stop releases.
struct Stopping {
    attacher: Arc<std::sync::Mutex<Option<Attacher>>>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    socket_hooks: Option<sockets::SocketHooks>,
    counters: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    pins: Option<PinLayout>,
    state_dir: PathBuf,
}

fn stopper(stopping: Stopping, detach_on_exit: bool) -> impl FnOnce() + Send {
    move || {
        let Stopping {
            attacher,
            stopped,
            mut socket_hooks,
            counters,
            pins,
            state_dir,
        } = stopping;
        let mut attacher = attacher.lock().unwrap_or_else(|e| e.into_inner());
        stopped.store(true, std::sync::atomic::Ordering::Relaxed);
        let counters = stats::read(&counters);
        match pins {
            Some(pins) if !detach_on_exit => info!(
                pin_root = %pins.root().display(),
                ?counters,
                "datapath left in place: it keeps serving until the next agent takes it over (`--cleanup` removes it)"
            ),
            _ => {
                if let Some(pins) = pins {
                    if let Some(attacher) = attacher.as_mut() {
                        attacher.unpin_links();
                    }
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
                let detached: Vec<&str> = attacher.iter().flat_map(|a| a.pod_names()).collect();
                info!(detached = ?detached, ?counters, "programs detached and maps released");
            }
        }
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

/// Loads the datapath pinned under `layout` (see [`load`]), programs
/// included, and migrates the maps an older ABI version pinned.
pub fn open(layout: &PinLayout, sizes: MapSizes) -> anyhow::Result<Opened> {
    let mut opened = open_maps(layout, sizes)?;
    load_packet_programs(&mut opened.ebpf)?;
    Ok(opened)
}

/// [`open`] without verifying the packet programs: the maps are ready to be
/// filled while [`load_packet_programs`] runs.
pub fn open_maps(layout: &PinLayout, sizes: MapSizes) -> anyhow::Result<Opened> {
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

/// Creates the maps, pinned under `layout` when its root is on a BPF
/// filesystem (reusing what is pinned there), else unpinned; the programs
/// are left to [`load_packet_programs`].
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
            return Ok((create_maps(sizes, None)?, None, Takeover::Fresh));
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
    if let Some(pinned) = capacities.get(names::SLOTS)
        && *pinned != super::slot_elements(sizes.slots)
    {
        let pinned_slots = pinned.saturating_mul(proxy_common::slots::SLOTS_PER_ELEMENT);
        warn!(
            map = names::SLOTS,
            pinned = pinned_slots,
            configured = sizes.slots,
            "a pinned map keeps its capacity; `--cleanup` and a restart apply the new one"
        );
        sizes.slots = pinned_slots;
    }
    let ebpf = create_maps(sizes, Some(&layout.maps_dir()))?;
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
    attacher: Arc<std::sync::Mutex<Option<Attacher>>>,
    settings: EbpfNodeSettings,
    mut host: watch::Receiver<Arc<HostNetwork>>,
) -> anyhow::Error {
    loop {
        let snapshot = host.borrow_and_update().clone();
        let pods = settings.pod_interfaces(&snapshot);
        let external = settings.interface_roles(&snapshot).external;
        let complete = {
            let mut attacher = attacher.lock().unwrap_or_else(|e| e.into_inner());
            match attacher.as_mut() {
                Some(attacher) => attacher.reconcile(&pods, &external).unwrap_or_else(|e| {
                    warn!(error = %format!("{e:#}"), "reconciling interfaces");
                    false
                }),
                None => true,
            }
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

/// Which source ports masqueraded flows take, and what that leaves out.
fn log_masquerade_ports(ephemeral: (u16, u16)) {
    let ranges = masquerade_port_ranges(ephemeral);
    let shown: Vec<String> = ranges
        .iter()
        .filter(|(low, _)| *low != 0)
        .map(|(low, high)| format!("{low}-{high}"))
        .collect();
    let ephemeral_shown = format!("{}-{}", ephemeral.0, ephemeral.1);
    if ranges[0].0 <= ephemeral.1 && ranges[0].1 >= ephemeral.0 {
        warn!(
            masquerade_ports = ?shown,
            ephemeral_ports = %ephemeral_shown,
            "net.ipv4.ip_local_port_range leaves no port for masqueraded flows; they share the \
             node's ephemeral ports, and a connection of the node itself may collide with one"
        );
    } else {
        info!(
            masquerade_ports = ?shown,
            ephemeral_ports = %ephemeral_shown,
            "masqueraded flows take source ports outside the node's ephemeral range and the NodePort range"
        );
    }
}
