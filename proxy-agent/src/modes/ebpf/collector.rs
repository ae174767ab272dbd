//! Arms the datapath's conntrack collector (`proxy_common::collector`) and
//! reads what its sweeps did.

use anyhow::{Context as _, ensure};
use aya::{
    Ebpf,
    maps::{Array, Map, MapData},
    programs::Xdp,
};
use proxy_common::{
    action::XDP_PASS,
    collector::{CollectorStats, CollectorValue, SWEEP_INTERVAL_NS},
    maps::CT_COLLECTOR,
};

/// The program that arms the timer.
pub const PROG_ARM: &str = "ct_collector_arm";

/// `CollectorValue` as a map value.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Value(pub CollectorValue);

// SAFETY: plain data of fixed layout (proxy_common's layout checks).
unsafe impl aya::Pod for Value {}

/// Runs the arming program (loaded with the packet programs): the collector
/// then sweeps on its own for as long as `CT_COLLECTOR` lives (pinned: past
/// this process). Arming a pinned collector again hands it this object's
/// programs.
pub fn arm(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_ARM)
        .with_context(|| format!("program {PROG_ARM} missing from the object"))?
        .try_into()
        .with_context(|| format!("{PROG_ARM} is not an XDP program"))?;
    // Any frame will do: the program reads nothing of it.
    let out = super::test_run::xdp(prog, &[0u8; 64], 0, 1)
        .context("running the collector's arming program")?;
    ensure!(
        out.verdict == XDP_PASS,
        "the kernel refused the conntrack collector's timer (BPF timers need Linux 5.15)"
    );
    tracing::info!(
        every = ?std::time::Duration::from_nanos(SWEEP_INTERVAL_NS),
        "conntrack collector armed: the datapath sweeps expired flows itself, agent or no agent"
    );
    Ok(())
}

/// What the collector's sweeps did so far.
pub fn stats(ebpf: &Ebpf) -> anyhow::Result<CollectorStats> {
    let map = ebpf
        .map(CT_COLLECTOR)
        .with_context(|| format!("map {CT_COLLECTOR} missing from the object"))?;
    match map {
        Map::Array(data) => read(data),
        _ => anyhow::bail!("{CT_COLLECTOR} is not an array"),
    }
}

/// The same from a handle on the `CT_COLLECTOR` map.
pub fn read(map: &MapData) -> anyhow::Result<CollectorStats> {
    let data = MapData::from_id(map.info()?.id())?;
    let array: Array<MapData, Value> = Map::from_map_data(data)?.try_into()?;
    Ok(array.get(&0, 0)?.0.stats)
}
