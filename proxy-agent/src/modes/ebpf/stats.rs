//! Reading the per-CPU datapath counters.

use aya::maps::{MapData, PerCpuArray};
use proxy_common::Counter;

/// Counter name and its sum over all CPUs.
pub fn read(stats: &PerCpuArray<MapData, u64>) -> Vec<(&'static str, u64)> {
    Counter::ALL
        .iter()
        .map(|c| {
            let total = stats
                .get(&(*c as u32), 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0);
            (c.name(), total)
        })
        .collect()
}
