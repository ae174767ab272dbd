//! The agent's runtime: loads the datapath, keeps it attached to pod
//! interfaces, feeds the chosen source (API server or manifests directory)
//! through the sync engine into the ebpf proxier, and tears everything down
//! on SIGTERM/SIGINT.

use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{Stream, StreamExt};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Node;

use crate::{
    modes::ebpf::{
        self, Attacher, EbpfProxier, MapSizes,
        node::{self, HostNetwork, NodeSettings, node_facts},
    },
    options::file_watch as config_watch,
    options::{ProxyMode, ProxyOptions, ebpf::conntrack_params},
    sources::SourceEvent,
    sources::api as watch,
    sources::manifests,
    sync::{self, SyncTiming},
};

/// How often pod interfaces and the manifests directory are looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

pub async fn run(opts: ProxyOptions) -> anyhow::Result<()> {
    if opts.mode != ProxyMode::Ebpf {
        bail!(
            "proxy mode {} is accepted but not implemented yet; use --proxy-mode ebpf",
            opts.mode
        );
    }
    warn_unimplemented(&opts);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let sizes = MapSizes {
        services: opts.ebpf.maps.services,
        backends: opts.ebpf.maps.backends,
        conntrack: conntrack_params(&opts.config, &opts.ebpf, cpus).max_entries,
    };
    let prefixes = opts.ebpf.pod_interface_prefixes.clone().unwrap_or_default();
    let mut ebpf = ebpf::load_with(sizes)?;
    // Before the maps are taken out of the object: pins them all by name.
    let pins = ebpf::pin::pin_or_warn(&ebpf);
    let (maps, stats) = ebpf::KernelMaps::take(&mut ebpf)?;
    node::warn_if_snat_ports_overlap();

    let settings = NodeSettings::from_options(&opts);
    let host = HostNetwork::read().context("reading the node's interfaces and addresses")?;
    let initial = node_facts(&settings, None, &host);
    info!(
        primary = ?initial.addresses.primary,
        node_port_addresses = ?initial.addresses.node_ports,
        external_interfaces = ?initial.external_interfaces.keys().collect::<Vec<_>>(),
        "node facts"
    );
    let (facts_tx, facts_rx) = tokio::sync::watch::channel(initial.clone());
    let proxier = EbpfProxier::new(maps, facts_rx).context("writing the node's settings")?;
    let mut attacher = Attacher::new(ebpf, prefixes.clone(), opts.ebpf.xdp_mode);
    info!(node = %opts.node_name, ?sizes, ?prefixes, xdp = ?opts.ebpf.xdp_mode, "datapath loaded");

    let timing = SyncTiming {
        min_sync_period: opts.min_sync_period().to_std().unwrap_or_default(),
        sync_period: opts
            .sync_period()
            .to_std()
            .unwrap_or(Duration::from_secs(30)),
        ..SyncTiming::default()
    };
    // The latest Node object, copied off the event stream for the node facts.
    let node_object: Arc<Mutex<Option<Node>>> = Arc::default();
    let seen_node = node_object.clone();
    let (resync_tx, resync_rx) = futures::channel::mpsc::unbounded();
    let events = futures::stream::select(
        source(&opts).await?.inspect(move |event| match event {
            SourceEvent::NodeApplied(node) => *lock(&seen_node) = Some((**node).clone()),
            SourceEvent::NodeDeleted => *lock(&seen_node) = None,
            _ => {}
        }),
        resync_rx,
    );
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;

    let engine = sync::run(
        events,
        &opts.node_name,
        proxier,
        timing,
        std::future::pending(),
    );
    let node_watch = async {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        let mut last = initial;
        loop {
            tick.tick().await;
            match HostNetwork::read() {
                Ok(host) => {
                    let facts = node_facts(&settings, lock(&node_object).as_ref(), &host);
                    if facts != last {
                        info!(
                            node_port_addresses = ?facts.addresses.node_ports,
                            external_interfaces = ?facts.external_interfaces.keys().collect::<Vec<_>>(),
                            "node facts changed"
                        );
                        let _ = facts_tx.send(facts.clone());
                        let _ = resync_tx.unbounded_send(SourceEvent::Resync);
                        last = facts;
                    }
                }
                Err(e) => warn!(error = %e, "reading the node's interfaces"),
            }
            if let Err(e) = attacher.reconcile(&last.external_interfaces) {
                warn!(error = %format!("{e:#}"), "reconciling interfaces");
            }
        }
    };
    let config_changed = config_watch::watch(&opts);
    // Cancelling the engine is safe: a sync runs without awaiting, so it is
    // never cut half-way.
    let mut failure = None;
    tokio::select! {
        result = engine => result.context("the sync engine stopped")?,
        _ = node_watch => {}
        err = config_changed => failure = Some(err),
        _ = sigterm.recv() => info!("SIGTERM: shutting down"),
        _ = sigint.recv() => info!("SIGINT: shutting down"),
    }

    let detached: Vec<String> = attacher.pod_names().map(str::to_owned).collect();
    info!(detached = ?detached, counters = ?ebpf::stats::read(&stats), "programs detached and maps released");
    if let Some(pins) = pins
        && let Err(e) = pins.unpin()
    {
        warn!(error = %e, "removing pinned maps");
    }
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

async fn source(
    opts: &ProxyOptions,
) -> anyhow::Result<std::pin::Pin<Box<dyn Stream<Item = SourceEvent> + Send>>> {
    if let Some(dir) = &opts.manifests {
        info!(dir = %dir.display(), "source: manifests directory");
        return Ok(manifests::events(dir.clone(), opts.node_name.clone(), POLL_INTERVAL).boxed());
    }
    let cc = &opts.config.client_connection;
    let client = watch::build_client(&watch::ClientOptions {
        kubeconfig: Some(cc.kubeconfig.clone())
            .filter(|k| !k.is_empty())
            .map(Into::into),
        master: Some(opts.master.clone()).filter(|m| !m.is_empty()),
        qps: Some(cc.qps),
        burst: u32::try_from(cc.burst).ok(),
        content_type: Some(cc.content_type.clone()).filter(|c| !c.is_empty()),
    })
    .await
    .context("connecting to the API server")?;
    info!("source: API server");
    Ok(watch::events(client, &opts.node_name).boxed())
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
