//! The ebpf mode's own metrics, read from the kernel at each scrape with the
//! introspection library: every datapath counter by reason, the exact fill
//! (counted at most every [`MAP_COUNT_MAX_AGE`]) and capacity of every map, which program runs on which interface in which
//! mode, and each program's run time when the kernel keeps BPF statistics.
//!
//! Names (all prefixed `kubeproxy_`): `ebpf_datapath_events_total{event}`,
//! `ebpf_map_entries{map}`, `ebpf_map_capacity{map}`,
//! `ebpf_interface_attached{interface,program,mode}`,
//! `ebpf_program_run_seconds_total{program}`, `ebpf_program_runs_total{program}`,
//! `ebpf_conntrack_collector_events_total{event}` (sweeps, entries removed
//! as expired and as unanswered under pressure) and
//! `ebpf_conntrack_collector_last_sweep_seconds`.

use std::{
    collections::BTreeSet,
    sync::Mutex,
    time::{Duration, Instant},
};

use aya::maps::{Map, MapData, PerCpuArray};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};
use proxy_common::maps as names;
use tracing::debug;

use super::{introspect, stats};

/// The metric families this collector emits, as registered (before the
/// `kubeproxy_` prefix; counters gain `_total` on their samples).
pub mod family {
    pub const EVENTS: &str = "ebpf_datapath_events";
    pub const MAP_ENTRIES: &str = "ebpf_map_entries";
    pub const MAP_CAPACITY: &str = "ebpf_map_capacity";
    pub const INTERFACE_ATTACHED: &str = "ebpf_interface_attached";
    pub const PROGRAM_RUN_SECONDS: &str = "ebpf_program_run_seconds";
    pub const PROGRAM_RUNS: &str = "ebpf_program_runs";
    pub const COLLECTOR_EVENTS: &str = "ebpf_conntrack_collector_events";
    pub const COLLECTOR_LAST_SWEEP: &str = "ebpf_conntrack_collector_last_sweep_seconds";
}

/// Every sample name a scrape can show, prefixed (for dashboards and alerts).
pub fn sample_names() -> Vec<String> {
    use family::*;
    let counters = [EVENTS, PROGRAM_RUN_SECONDS, PROGRAM_RUNS, COLLECTOR_EVENTS]
        .map(|c| format!("kubeproxy_{c}_total"));
    let gauges = [MAP_ENTRIES, MAP_CAPACITY, INTERFACE_ATTACHED].map(|g| format!("kubeproxy_{g}"));
    counters.into_iter().chain(gauges).collect()
}

/// How long a scrape reuses the last count of the maps' entries. An exact
/// count copies every entry out of the kernel: at 50,000 services of 10
/// endpoints, scrapes every 10 ms piled up and took the agent's threads
/// from its first sync; now they wait for one count and share it.
pub const MAP_COUNT_MAX_AGE: Duration = Duration::from_secs(5);

/// Handles on the maps the loaded programs use, taken once at start.
pub struct DatapathMetrics {
    maps: Vec<(String, MapData)>,
    counters: Option<PerCpuArray<MapData, u64>>,
    map_ids: BTreeSet<u32>,
    /// The last count of the maps and when it was taken.
    usage: Mutex<Option<(Instant, Vec<introspect::MapUsage>)>>,
}

impl std::fmt::Debug for DatapathMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatapathMetrics")
            .field("map_ids", &self.map_ids)
            .finish()
    }
}

/// The datapath's metrics once its programs are loaded (set then), none before.
#[derive(Debug)]
pub struct Deferred(pub std::sync::Arc<std::sync::OnceLock<DatapathMetrics>>);

impl Collector for Deferred {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        match self.0.get() {
            Some(metrics) => metrics.encode(encoder),
            None => Ok(()),
        }
    }
}

impl DatapathMetrics {
    /// The maps of every program in `ebpf`, by the kernel's ids (so pinned
    /// and unpinned datapaths alike).
    pub fn of(ebpf: &aya::Ebpf) -> Self {
        let map_ids: BTreeSet<u32> = ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok())
            .filter_map(|info| info.map_ids().ok().flatten())
            .flatten()
            .collect();
        let mut maps = super::maps::named_maps(map_ids.iter().copied());
        // The loader's own maps (.rodata, .bss) are not the datapath's.
        maps.retain(|(name, _)| !name.contains('.'));
        maps.sort_by(|a, b| a.0.cmp(&b.0));
        let counters = maps
            .iter()
            .find(|(n, _)| n == names::STATS)
            .and_then(|(_, data)| MapData::from_id(data.info().ok()?.id()).ok())
            .and_then(|data| Map::from_map_data(data).ok())
            .and_then(|map| PerCpuArray::try_from(map).ok());
        DatapathMetrics {
            maps,
            counters,
            map_ids,
            usage: Mutex::new(None),
        }
    }

    fn encode_counters(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let Some(counters) = &self.counters else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            family::EVENTS,
            "Datapath outcomes by reason, summed over CPUs (new flows, NAT, every drop and reject)",
            None,
            MetricType::Counter,
        )?;
        for (event, total) in stats::read(counters) {
            ConstCounter::new(total).encode(family.encode_family(&[("event", event)])?)?;
        }
        Ok(())
    }

    /// The maps' usage, counted again when the last count is older than
    /// [`MAP_COUNT_MAX_AGE`].
    fn map_usage(&self) -> Vec<introspect::MapUsage> {
        let mut last = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, usage)) = last.as_ref()
            && at.elapsed() < MAP_COUNT_MAX_AGE
        {
            return usage.clone();
        }
        let usage: Vec<introspect::MapUsage> = self
            .maps
            .iter()
            .filter_map(|(name, map)| {
                introspect::map_usage(name, map)
                    .inspect_err(|e| debug!(error = %e, "map fill"))
                    .ok()
            })
            .collect();
        *last = Some((Instant::now(), usage.clone()));
        usage
    }

    fn encode_maps(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let usage = self.map_usage();
        let mut entries = encoder.encode_descriptor(
            family::MAP_ENTRIES,
            "Entries each map holds, counted exactly, at most every 5 s (arrays: every slot)",
            None,
            MetricType::Gauge,
        )?;
        for u in usage.iter().filter(|u| u.entries.is_some()) {
            let value = i64::try_from(u.entries.unwrap_or(0)).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(entries.encode_family(&[("map", u.name.as_str())])?)?;
        }
        let mut capacity = encoder.encode_descriptor(
            family::MAP_CAPACITY,
            "Capacity of each map (max_entries; bytes for a ring buffer)",
            None,
            MetricType::Gauge,
        )?;
        for u in &usage {
            ConstGauge::new(i64::from(u.capacity))
                .encode(capacity.encode_family(&[("map", u.name.as_str())])?)?;
        }
        Ok(())
    }

    fn encode_programs(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let programs = match introspect::our_programs(&self.map_ids) {
            Ok(p) => p,
            Err(e) => {
                debug!(error = %e, "listing our programs");
                return Ok(());
            }
        };
        if let Ok(found) = introspect::interfaces(&programs) {
            let mut attached = encoder.encode_descriptor(
                family::INTERFACE_ATTACHED,
                "1 for each program attached to an interface, with its mode (xdp_native, xdp_generic, tc_ingress, tc_egress)",
                None,
                MetricType::Gauge,
            )?;
            for iface in &found.interfaces {
                for a in &iface.attachments {
                    let labels = [
                        ("interface", iface.name.as_str()),
                        ("program", a.program.as_str()),
                        ("mode", a.hook.name()),
                    ];
                    ConstGauge::new(1i64).encode(attached.encode_family(&labels)?)?;
                }
            }
        }
        // Run time and count only move while the kernel keeps BPF statistics.
        if programs.iter().all(|p| p.run_count == 0) {
            return Ok(());
        }
        let mut seconds = encoder.encode_descriptor(
            family::PROGRAM_RUN_SECONDS,
            "Time the kernel spent running each program (kernel.bpf_stats_enabled)",
            None,
            MetricType::Counter,
        )?;
        for p in &programs {
            ConstCounter::new(p.run_time_ns as f64 / 1e9)
                .encode(seconds.encode_family(&[("program", p.name.as_str())])?)?;
        }
        let mut runs = encoder.encode_descriptor(
            family::PROGRAM_RUNS,
            "Runs of each program (kernel.bpf_stats_enabled)",
            None,
            MetricType::Counter,
        )?;
        for p in &programs {
            ConstCounter::new(p.run_count)
                .encode(runs.encode_family(&[("program", p.name.as_str())])?)?;
        }
        Ok(())
    }
}

impl DatapathMetrics {
    fn encode_collector(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let Some((_, map)) = self.maps.iter().find(|(n, _)| n == names::CT_COLLECTOR) else {
            return Ok(());
        };
        let stats = match super::collector::read(map) {
            Ok(stats) => stats,
            Err(e) => {
                debug!(error = %format!("{e:#}"), "reading the conntrack collector");
                return Ok(());
            }
        };
        let mut events = encoder.encode_descriptor(
            family::COLLECTOR_EVENTS,
            "The conntrack collector's sweeps and the entries they removed: expired, or unanswered while a table was full",
            None,
            MetricType::Counter,
        )?;
        for (event, total) in [
            ("sweep", stats.sweeps),
            ("expired", stats.removed - stats.removed_under_pressure),
            ("unanswered_under_pressure", stats.removed_under_pressure),
        ] {
            ConstCounter::new(total).encode(events.encode_family(&[("event", event)])?)?;
        }
        let last = encoder.encode_descriptor(
            family::COLLECTOR_LAST_SWEEP,
            "How long the conntrack collector's last sweep held its CPU",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(stats.last_sweep_took_ns as f64 / 1e9).encode(last)
    }
}

impl Collector for DatapathMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.encode_counters(&mut encoder)?;
        self.encode_collector(&mut encoder)?;
        self.encode_maps(&mut encoder)?;
        self.encode_programs(&mut encoder)
    }
}
