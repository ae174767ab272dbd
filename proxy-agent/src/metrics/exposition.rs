//! `/metrics` in the Prometheus text format 0.0.4, as upstream serves it
//! (component-base's `legacyregistry.Handler`: promhttp without OpenMetrics).
//!
//! prometheus-client encodes OpenMetrics only, so the 0.0.4 text is derived
//! from it here. The two differ in a few lines: a counter's family is named
//! with its `_total` (OpenMetrics names it without), an info metric is a
//! gauge named with its `_info`, `unknown` is `untyped`, and there is no
//! `# EOF`, `# UNIT` or `_created` sample.

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (as prometheus-client encodes it) in the Prometheus text format.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut counter: Option<&str> = None;
    // A family's HELP line comes before its TYPE, which decides its name.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), "");
            help = rest.split_once(' ').or(Some((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            counter = (kind == "counter").then_some(name);
            flush_help(&mut out, help.take(), suffix);
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
            continue;
        }
        flush_help(&mut out, help.take(), "");
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(family) = counter
            && line
                .strip_prefix(family)
                .is_some_and(|rest| rest.starts_with("_created"))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    flush_help(&mut out, help, "");
    out
}

fn flush_help(out: &mut String, help: Option<(&str, &str)>, suffix: &str) {
    if let Some((name, text)) = help {
        out.push_str(&format!("# HELP {name}{suffix} {text}\n"));
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{
        metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
        registry::Registry,
    };

    use super::*;

    #[test]
    fn counters_take_their_total_name_and_the_openmetrics_lines_go() {
        let mut registry = Registry::with_prefix("kubeproxy");
        let changes = Counter::<u64>::default();
        changes.inc_by(3);
        registry.register(
            "sync_proxy_rules_endpoint_changes",
            "[ALPHA] Cumulative proxy rules Endpoint changes",
            changes,
        );
        let pending = Gauge::<i64>::default();
        pending.set(2);
        registry.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "[ALPHA] Pending proxy rules Endpoint changes",
            pending,
        );
        let histogram = Histogram::new([0.5]);
        histogram.observe(0.25);
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "[ALPHA] SyncProxyRules latency in seconds",
            histogram,
        );
        let mut openmetrics = String::new();
        prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();

        let text = prometheus_text(&openmetrics);
        assert_eq!(
            text,
            "# HELP kubeproxy_sync_proxy_rules_endpoint_changes_total [ALPHA] Cumulative proxy rules Endpoint changes.\n\
             # TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter\n\
             kubeproxy_sync_proxy_rules_endpoint_changes_total 3\n\
             # HELP kubeproxy_sync_proxy_rules_endpoint_changes_pending [ALPHA] Pending proxy rules Endpoint changes.\n\
             # TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge\n\
             kubeproxy_sync_proxy_rules_endpoint_changes_pending 2\n\
             # HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds.\n\
             # TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n\
             kubeproxy_sync_proxy_rules_duration_seconds_sum 0.25\n\
             kubeproxy_sync_proxy_rules_duration_seconds_count 1\n\
             kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.5\"} 1\n\
             kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 1\n",
            "from:\n{openmetrics}"
        );
    }

    #[test]
    fn an_info_metric_is_a_gauge_named_with_its_info() {
        let openmetrics = "# HELP build Build information.\n# TYPE build info\nbuild_info{version=\"1\"} 1\n# EOF\n";
        assert_eq!(
            prometheus_text(openmetrics),
            "# HELP build_info Build information.\n# TYPE build_info gauge\nbuild_info{version=\"1\"} 1\n"
        );
    }
}
