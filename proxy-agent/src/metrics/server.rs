//! The metrics server's paths.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::httpserve::{self, Handler, Response};

/// What the metrics mux serves.
pub struct MetricsEndpoints {
    pub registry: Registry,
    /// `/proxyMode`: the active mode's name.
    pub mode: String,
    /// `/configz`: the effective configuration as JSON.
    pub configz: String,
}

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl MetricsEndpoints {
    pub fn answer(&self, path: &str) -> Response {
        let text_headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("X-Content-Type-Options", "nosniff"),
        ];
        match path {
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
                    Ok(()) => httpserve::respond(200, &[("Content-Type", OPENMETRICS)], body),
                    Err(e) => httpserve::respond(500, &text_headers, format!("encoding: {e}\n")),
                }
            }
            "/healthz" => httpserve::respond(200, &text_headers, "ok"),
            "/proxyMode" => httpserve::respond(200, &text_headers, self.mode.clone()),
            "/configz" => httpserve::respond(
                200,
                &[
                    ("Content-Type", "application/json"),
                    ("X-Content-Type-Options", "nosniff"),
                ],
                self.configz.clone(),
            ),
            _ => httpserve::not_found(),
        }
    }
}

pub fn handler(endpoints: Arc<MetricsEndpoints>) -> Handler {
    Arc::new(move |req| endpoints.answer(req.uri().path()))
}
