//! The metrics server's paths.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::exposition;
use crate::httpserve::{self, Handler, Response};

/// What the metrics mux serves.
pub struct MetricsEndpoints {
    pub registry: Registry,
    /// `/proxyMode`: the active mode's name.
    pub mode: String,
    /// `/configz`: the effective configuration as JSON.
    pub configz: String,
}

impl MetricsEndpoints {
    /// The answer to a GET of `path`.
    pub fn answer(&self, path: &str) -> Response {
        let text_headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("X-Content-Type-Options", "nosniff"),
        ];
        match path {
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
                    Ok(()) => httpserve::respond(
                        200,
                        &[("Content-Type", exposition::PROMETHEUS_TEXT)],
                        exposition::prometheus_text(&body),
                    ),
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

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;
    use crate::{metrics::ProxyMetrics, model::IpFamily, options::ProxyMode};

    fn scrape() -> (String, String) {
        let metrics = ProxyMetrics::new(vec![IpFamily::V4]);
        let mut registry = Registry::default();
        metrics.register(
            registry.sub_registry_with_prefix("kubeproxy"),
            ProxyMode::Iptables,
        );
        let endpoints = MetricsEndpoints {
            registry,
            mode: "iptables".into(),
            configz: "{}".into(),
        };
        let response = endpoints.answer("/metrics");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        (content_type, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn metrics_are_prometheus_text_as_upstream_serves_them() {
        let (content_type, body) = scrape();
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        let failures = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total";
        assert!(
            body.contains(&format!(
                "# HELP {failures} [ALPHA] Cumulative proxy iptables restore failures"
            )),
            "{body}"
        );
        assert!(
            body.contains(&format!("# TYPE {failures} counter\n")),
            "{body}"
        );
        assert!(
            body.contains(&format!("{failures}{{ip_family=\"IPv4\"}} 0\n")),
            "{body}"
        );
        assert!(!body.contains("# EOF"), "{body}");
    }
}
