//! The proxy health server on `healthzBindAddress`: `/healthz` (for load
//! balancers and readiness: also false while the node is being removed) and
//! `/livez` (for the liveness probe), exactly as upstream answers them.

use std::sync::Arc;

use super::ProxyHealth;
use crate::{
    httpserve::{self, Handler, Response},
    metrics::ProxyMetrics,
};

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
