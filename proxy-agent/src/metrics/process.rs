//! The process metrics every Kubernetes component serves (client_golang's
//! process collector, which upstream's registry includes): CPU, memory,
//! file descriptors and start time, read from `/proc` at each scrape by
//! `metrics-process` (a port of that collector). Dashboards such as the
//! kubernetes-mixin's "Kubernetes / Proxy" plot them.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        TypedMetric as _,
        counter::{ConstCounter, Counter},
        gauge::{ConstGauge, Gauge},
    },
};

/// Registered without a prefix: the names are `process_*`.
#[derive(Debug, Default)]
pub struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let now = metrics_process::collector::collect();
        if let Some(seconds) = now.cpu_seconds_total {
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                Counter::<f64>::TYPE,
            )?;
            ConstCounter::new(seconds).encode(metric)?;
        }
        let gauges = [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                now.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                now.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                now.virtual_memory_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                now.virtual_memory_max_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                now.resident_memory_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                now.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let metric = encoder.encode_descriptor(name, help, None, Gauge::<i64>::TYPE)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{encoding::text::encode, registry::Registry};

    use super::ProcessMetrics;

    fn value(text: &str, name: &str) -> f64 {
        let line = (text.lines())
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in\n{text}"));
        line[name.len() + 1..].parse().unwrap()
    }

    /// The values are this test process's own, read at the scrape.
    #[test]
    fn process_metrics_are_this_process_at_the_scrape() {
        // CPU time is counted in ticks: spend a few first.
        let spinning = std::time::Instant::now();
        while spinning.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(spinning.elapsed());
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessMetrics));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(value(&text, "process_cpu_seconds_total") > 0.0, "{text}");
        let rss = value(&text, "process_resident_memory_bytes");
        assert!(rss > 1e6, "{rss}");
        assert!(value(&text, "process_virtual_memory_bytes") >= rss);
        let fds = value(&text, "process_open_fds");
        assert!(fds >= 3.0 && fds <= value(&text, "process_max_fds"));
        let started = value(&text, "process_start_time_seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            started <= now && started > now - 3600.0,
            "{started} vs {now}"
        );
    }
}
