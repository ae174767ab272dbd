//! The agent's main loop in standalone mode: watch the manifests directory
//! and the node's interfaces, keep the datapath programmed, and tear
//! everything down on SIGTERM/SIGINT.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::{datapath::Datapath, manifests, model};

/// How often the directory and the interfaces are looked at; changes are
/// applied within this period.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

pub struct Settings {
    pub manifests_dir: PathBuf,
    pub node_name: String,
    /// Host-side interfaces whose name starts with one of these face pods.
    pub pod_interface_prefixes: Vec<String>,
}

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let mut datapath = Datapath::new(settings.pod_interface_prefixes.clone())?;
    info!(
        manifests = %settings.manifests_dir.display(),
        node = %settings.node_name,
        prefixes = ?settings.pod_interface_prefixes,
        "datapath loaded"
    );
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    let mut last_fingerprint = None;

    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
        if let Err(e) = datapath.reconcile_interfaces() {
            warn!(error = %format!("{e:#}"), "reconciling pod interfaces");
        }
        let fingerprint = match manifests::fingerprint(&settings.manifests_dir) {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(dir = %settings.manifests_dir.display(), error = %e, "cannot read the manifests directory");
                continue;
            }
        };
        if fingerprint == last_fingerprint {
            continue;
        }
        last_fingerprint = fingerprint;
        match manifests::load_dir(&settings.manifests_dir) {
            Ok(objects) => {
                let state = model::build_desired_state(
                    &objects.services,
                    &objects.endpoint_slices,
                    &settings.node_name,
                );
                match datapath.sync(&state) {
                    Ok(stats) => info!(
                        services = state.services.len(),
                        frontends = stats.frontends,
                        backends = stats.backends,
                        writes = stats.writes,
                        deletes = stats.deletes,
                        flushed_flows = stats.flushed_flows,
                        "datapath synced"
                    ),
                    Err(e) => {
                        error!(error = %e, "datapath sync failed; retrying");
                        last_fingerprint = None;
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "manifests rejected; the last good state stays programmed")
            }
        }
    }

    let interfaces: Vec<String> = datapath.attached_interfaces().map(str::to_owned).collect();
    let counters = datapath.counters();
    drop(datapath);
    info!(detached = ?interfaces, counters = ?counters, "programs detached and maps released");
    Ok(())
}
