//! What the agent serves beside the datapath: the proxy health server, the
//! metrics server and the service health-check ports, with the sync-engine
//! observers that feed them. Addresses are bound before the mode starts
//! when `bindAddressHardFail` is set, so a server that cannot listen stops
//! the agent before it touches the datapath.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::FutureExt as _;
use tokio::net::TcpListener;
use tracing::info;

use crate::{
    events::EventRecorder,
    health::{ProxyHealth, ServiceHealthPorts, SystemClock, proxy_server},
    httpserve,
    metrics::{ProxyMetrics, server::MetricsEndpoints},
    modes::Running,
    options::{NodePortAddresses, ProxyOptions, write::ConfigDocument},
    sync::Observers,
};

const DEFAULT_HEALTHZ_PORT: u16 = 10256;
const DEFAULT_METRICS_PORT: u16 = 10249;

/// The server addresses, parsed, and under `bindAddressHardFail` already
/// listening.
pub struct Bound {
    healthz: Option<(SocketAddr, Option<TcpListener>)>,
    metrics: Option<(SocketAddr, Option<TcpListener>)>,
}

impl Bound {
    pub fn listen(opts: &ProxyOptions) -> anyhow::Result<Self> {
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
pub struct Serving {
    pub observers: Observers,
    /// Returns only when a server cannot listen under `bindAddressHardFail`.
    pub servers: futures::future::BoxFuture<'static, anyhow::Error>,
}

impl Serving {
    pub fn new(
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
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register_collector(Box::new(crate::metrics::ProcessMetrics));
            let kube_proxy = registry.sub_registry_with_prefix("kubeproxy");
            metrics.register(kube_proxy, opts.mode);
            for collector in running.metrics.drain(..) {
                kube_proxy.register_collector(collector);
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
