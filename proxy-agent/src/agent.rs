//! The agent's runtime, the same for every mode: starts the host source and
//! the chosen mode, feeds the API server (or a manifests directory) and the
//! host through the sync engine into the mode's proxier, serves health and
//! metrics, and stops on SIGTERM/SIGINT or when the configuration file changes.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::{
    events::{ApiEvents, EventRecorder, LogEvents},
    model::{NodeModel, NodeSettings, NodeTopology},
    modes::{self, HostFeed},
    options::{ProxyOptions, file_watch},
    serving::{Bound, Serving},
    sources::{SourceEvent, api, host::HostSource, manifests},
    sync::{self, SourceState, SyncTiming},
};

/// How often the manifests directory is looked at (the host source follows netlink).
const POLL_INTERVAL: Duration = Duration::from_millis(200);

type Events = std::pin::Pin<Box<dyn Stream<Item = SourceEvent> + Send>>;

pub async fn run(opts: ProxyOptions) -> anyhow::Result<()> {
    let host = HostSource::new().context("reading the node's interfaces and addresses")?;
    let node_settings = NodeSettings::from_options(&opts);
    let initial = NodeModel::build(
        &node_settings,
        NodeTopology::new(&opts.node_name),
        None,
        host.current(),
    );
    info!(
        primary_ipv4 = ?initial.primary_ipv4,
        primary_ipv6 = ?initial.primary_ipv6,
        node_port_addresses = ?initial.node_port_addresses,
        "node facts"
    );
    // Under bindAddressHardFail a server that cannot listen stops the agent
    // before it touches the datapath.
    let bound = Bound::listen(&opts)?;
    // The objects are listed (and, from manifests, parsed) while the
    // datapath loads: the verifier takes about a second at start.
    let (events, client) = source(&opts).await?;
    let events = read_ahead(events);
    let mut running = modes::of(opts.mode).start(
        &opts,
        HostFeed {
            initial: &initial,
            changes: host.subscribe(),
        },
    )?;

    let timing = SyncTiming {
        min_sync_period: opts.min_sync_period().to_std().unwrap_or_default(),
        sync_period: opts
            .sync_period()
            .to_std()
            .unwrap_or(Duration::from_secs(30)),
        ..SyncTiming::default()
    };
    let recorder: Arc<dyn EventRecorder> = match client {
        Some(client) => Arc::new(ApiEvents::new(client, &opts.node_name)),
        None => Arc::new(LogEvents),
    };
    let serving = Serving::new(&opts, bound, &mut running, timing.sync_period, recorder);
    let events = futures::stream::select(events, host.events());
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;

    let engine = sync::run_observed(
        events,
        SourceState::with_node_settings(&opts.node_name, node_settings)
            .with_configured_service_cidrs(opts.ebpf.service_cidrs()),
        running.proxier,
        timing,
        std::future::pending(),
        Arc::new(serving.observers),
    );
    let config_changed = file_watch::watch(&opts);
    // Cancelling the engine is safe: a sync runs without awaiting, so it is
    // never cut half-way.
    let mut failure = None;
    tokio::select! {
        result = engine => result.context("the sync engine stopped")?,
        _ = host.run() => {}
        err = running.background => failure = Some(err),
        err = serving.servers => failure = Some(err),
        err = config_changed => failure = Some(err),
        _ = sigterm.recv() => info!("SIGTERM: shutting down"),
        _ = sigint.recv() => info!("SIGINT: shutting down"),
    }
    (running.stop)();
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Polls `events` on a task of its own from now on, keeping what it sends
/// until the returned stream is read. The events ready at once go over as
/// one message: sent one by one, a first listing of 100,000 events reached
/// the feed in hundreds of batches of one whenever the feed kept pace with
/// this task, and a batch is what the feed reduces on several threads.
fn read_ahead(events: Events) -> Events {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<SourceEvent>>();
    tokio::spawn(async move {
        let chunks = events.ready_chunks(sync::FEED_BATCH);
        futures::pin_mut!(chunks);
        while let Some(chunk) = chunks.next().await {
            if tx.send(chunk).is_err() {
                return;
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
        .flat_map(futures::stream::iter)
        .boxed()
}

async fn source(opts: &ProxyOptions) -> anyhow::Result<(Events, Option<kube::Client>)> {
    if let Some(dir) = &opts.manifests {
        info!(dir = %dir.display(), "source: manifests directory");
        let events = manifests::events(dir.clone(), opts.node_name.clone(), POLL_INTERVAL).boxed();
        return Ok((events, None));
    }
    let cc = &opts.config.client_connection;
    let client = api::build_client(&api::ClientOptions {
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
    Ok((
        api::events(client.clone(), &opts.node_name).boxed(),
        Some(client),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_read_ahead_reaches_the_feed_in_whole_batches() {
        let listing: Vec<SourceEvent> = (0..20_000).map(|_| SourceEvent::ServicesSynced).collect();
        let events = read_ahead(futures::stream::iter(listing).boxed());
        // As the sync driver takes its batches.
        let batches: Vec<usize> = events
            .ready_chunks(sync::FEED_BATCH)
            .map(|batch| batch.len())
            .collect()
            .await;
        assert_eq!(
            batches,
            [
                sync::FEED_BATCH,
                sync::FEED_BATCH,
                20_000 - 2 * sync::FEED_BATCH
            ]
        );
    }
}
