//! The agent's runtime, the same for every mode: starts the host source and
//! the chosen mode, feeds the API server (or a manifests directory) and the
//! host through the sync engine into the mode's proxier, serves health and
//! metrics, and stops on SIGTERM/SIGINT or when the configuration file changes.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::{FutureExt as _, Stream, StreamExt};
use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
};
use tracing::info;

use crate::{
    events::{ApiEvents, EventRecorder, LogEvents},
    health::{ProxyHealth, ServiceHealthPorts, SystemClock, proxy_server},
    httpserve,
    metrics::{ProxyMetrics, server::MetricsEndpoints},
    model::{NodeModel, NodeSettings, NodeTopology},
    modes::{self, HostFeed, Running},
    options::{NodePortAddresses, ProxyOptions, file_watch, write::ConfigDocument},
    sources::{SourceEvent, api, host::HostSource, manifests},
    sync::{self, Observers, SourceState, SyncTiming},
};

/// How often the manifests directory is looked at (the host source follows netlink).
const POLL_INTERVAL: Duration = Duration::from_millis(200);
const DEFAULT_HEALTHZ_PORT: u16 = 10256;
const DEFAULT_METRICS_PORT: u16 = 10249;

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
    let (events, client) = source(&opts).await?;
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
        SourceState::with_node_settings(&opts.node_name, node_settings),
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
        _ = running.background => {}
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

/// The server addresses, parsed, and under `bindAddressHardFail` already
/// listening.
struct Bound {
    healthz: Option<(SocketAddr, Option<TcpListener>)>,
    metrics: Option<(SocketAddr, Option<TcpListener>)>,
}

impl Bound {
    fn listen(opts: &ProxyOptions) -> anyhow::Result<Self> {
        let config = &opts.config;
        let one = |field: &str, text: &str, port: u16| -> anyhow::Result<_> {
            if text.is_empty() {
                info!("{field} is empty: that server is off");
                return Ok(None);
            }
            let addr =
                httpserve::bind_address(text, port).map_err(|e| anyhow::anyhow!("{field}: {e}"))?;
            if !config.bind_address_hard_fail {
                return Ok(Some((addr, None)));
            }
            let listener = httpserve::listen(addr).with_context(|| {
                format!("{field}: cannot listen on {addr} (bindAddressHardFail is set)")
            })?;
            Ok(Some((addr, Some(listener))))
        };
        Ok(Bound {
            healthz: one(
                "healthzBindAddress",
                &config.healthz_bind_address,
                DEFAULT_HEALTHZ_PORT,
            )?,
            metrics: one(
                "metricsBindAddress",
                &config.metrics_bind_address,
                DEFAULT_METRICS_PORT,
            )?,
        })
    }
}

/// Health, metrics and the service health-check ports: what the sync engine
/// reports to, and the servers that answer from it.
struct Serving {
    observers: Observers,
    /// Returns only when a server cannot listen under `bindAddressHardFail`.
    servers: futures::future::BoxFuture<'static, anyhow::Error>,
}

impl Serving {
    fn new(
        opts: &ProxyOptions,
        bound: Bound,
        running: &mut Running,
        sync_period: Duration,
        recorder: Arc<dyn EventRecorder>,
    ) -> Self {
        let config = &opts.config;
        let families = running.families.clone();
        let health = Arc::new(ProxyHealth::new(
            families.clone(),
            2 * sync_period,
            Arc::new(SystemClock),
        ));
        let metrics = Arc::new(ProxyMetrics::new(families));
        let service_ports = Arc::new(ServiceHealthPorts::new(
            &opts.node_name,
            opts.node_port_addresses() == NodePortAddresses::All,
            health.clone(),
            recorder.clone(),
        ));
        let mut servers = Vec::new();
        let hard_fail = config.bind_address_hard_fail;
        if let Some((addr, listener)) = bound.healthz {
            servers.push(
                httpserve::serve_with_retry(
                    "proxy health server",
                    addr,
                    listener,
                    proxy_server::handler(health.clone(), metrics.clone()),
                    hard_fail,
                    recorder.clone(),
                    "FailedToStartProxierHealthcheck",
                )
                .boxed(),
            );
        }
        if let Some((addr, listener)) = bound.metrics {
            let mut registry = prometheus_client::registry::Registry::with_prefix("kubeproxy");
            metrics.register(&mut registry, opts.mode);
            if let Some(collector) = running.metrics.take() {
                registry.register_collector(collector);
            }
            let endpoints = Arc::new(MetricsEndpoints {
                registry,
                mode: opts.mode.to_string(),
                configz: configz(opts),
            });
            servers.push(
                httpserve::serve_with_retry(
                    "metrics server",
                    addr,
                    listener,
                    crate::metrics::server::handler(endpoints),
                    hard_fail,
                    recorder,
                    "FailedToStartMetricServer",
                )
                .boxed(),
            );
        }
        let servers = async move {
            if servers.is_empty() {
                return std::future::pending().await;
            }
            futures::future::select_all(servers).await.0
        }
        .boxed();
        Serving {
            observers: Observers::new(vec![health, metrics, service_ports]),
            servers,
        }
    }
}

/// `/configz`: the effective configuration under its group name, as upstream's
/// configz serves its internal (untyped) configuration.
fn configz(opts: &ProxyOptions) -> String {
    let mut config = serde_json::to_value(opts.config.written()).unwrap_or_default();
    if let Some(map) = config.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
    }
    serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string()
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
