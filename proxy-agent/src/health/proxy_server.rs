//! The proxy health server on `healthzBindAddress`: `/healthz` (for load
//! balancers and readiness: also false while the node is being removed) and
//! `/livez` (for the liveness probe), exactly as upstream answers them.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tracing::{error, info};

use super::ProxyHealth;
use crate::{
    events::{EventRecorder, Regarding},
    httpserve::{self, Handler, Response},
    metrics::ProxyMetrics,
};

/// How long a failed listen waits before the next try (upstream's `wait.Until` period).
pub const LISTEN_RETRY: Duration = Duration::from_secs(5);

const JSON_HEADERS: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("X-Content-Type-Options", "nosniff"),
];

/// The answer to one request for `path`.
pub fn answer(path: &str, health: &ProxyHealth, metrics: &ProxyMetrics) -> Response {
    let livez = match path {
        "/healthz" => false,
        "/livez" => true,
        _ => return httpserve::not_found(),
    };
    let mut report = health.health();
    let healthy = if livez {
        report.healthy
    } else {
        let eligible = health.node_eligible();
        report.node_eligible = Some(eligible);
        report.healthy && eligible
    };
    let status = if healthy {
        // Older releases' lastUpdated was the last sync loop run: a healthy
        // server keeps it "recent".
        report.last_updated = Some(health.now());
        200
    } else {
        503
    };
    metrics.health_answered(livez, status);
    let body = serde_json::to_vec(&report).unwrap_or_default();
    httpserve::respond(status, &JSON_HEADERS, body)
}

pub fn handler(health: Arc<ProxyHealth>, metrics: Arc<ProxyMetrics>) -> Handler {
    Arc::new(move |req| answer(req.uri().path(), &health, &metrics))
}

/// Listens on `addr` (or starts with `bound`, already listening there) and
/// serves `handler`, retrying a failed listen every [`LISTEN_RETRY`] with a
/// Warning event `reason` on this node; with `hard_fail`
/// (`bindAddressHardFail`) the first failure is returned instead. Never
/// returns otherwise.
pub async fn serve_with_retry(
    what: &'static str,
    addr: SocketAddr,
    mut bound: Option<tokio::net::TcpListener>,
    handler: Handler,
    hard_fail: bool,
    events: Arc<dyn EventRecorder>,
    reason: &'static str,
) -> anyhow::Error {
    loop {
        let listening = match bound.take() {
            Some(listener) => Ok(listener),
            None => httpserve::listen(addr),
        };
        match listening {
            Ok(listener) => {
                info!(address = %addr, "{what} server listening");
                httpserve::serve(listener, handler.clone()).await;
            }
            Err(e) => {
                let message = format!("failed to start {what} on {addr}: {e}");
                events.warning(Regarding::ThisNode, reason, "StartKubeProxy", &message);
                if hard_fail {
                    return anyhow::anyhow!("{message} (bindAddressHardFail is set)");
                }
                error!(retry_in = ?LISTEN_RETRY, "{message}");
            }
        }
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}
