//! The ebpf mode: loads the programs, attaches them to pod-facing interfaces
//! and programs the service maps from the desired state.

mod interfaces;
pub mod maps;
mod object;
mod programmer;
pub mod stats;
pub mod test_run;

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray},
    programs::{SchedClassifier, TcAttachType, tc::SchedClassifierLinkId},
};
use tracing::{info, warn};

pub use maps::{KernelMaps, MapError, ServiceMaps};
pub use object::{OBJECT, PROG_FROM_POD};
pub use programmer::{Programmer, SyncStats};

use crate::model::DesiredState;

/// Loads the embedded object into the kernel without attaching anything.
pub fn load() -> anyhow::Result<Ebpf> {
    if OBJECT.is_empty() {
        bail!(
            "this binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it"
        );
    }
    let mut ebpf = EbpfLoader::new()
        .load(OBJECT)
        .context("loading the eBPF object into the kernel")?;
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROG_FROM_POD)
        .context("program tc_from_pod missing from the object")?
        .try_into()?;
    prog.load()
        .context("the kernel verifier rejected tc_from_pod")?;
    Ok(ebpf)
}

/// Takes the service maps out of a loaded object.
pub fn kernel_maps(ebpf: &mut Ebpf) -> anyhow::Result<(KernelMaps, PerCpuArray<MapData, u64>)> {
    use proxy_common::maps as names;
    let take = |ebpf: &mut Ebpf, name: &str| {
        ebpf.take_map(name)
            .with_context(|| format!("map {name} missing"))
    };
    let services = HashMap::try_from(take(ebpf, names::SERVICES)?)?;
    let backends = HashMap::try_from(take(ebpf, names::BACKENDS)?)?;
    let conntrack = HashMap::try_from(take(ebpf, names::CONNTRACK)?)?;
    let stats = PerCpuArray::try_from(take(ebpf, names::STATS)?)?;
    Ok((
        KernelMaps {
            services,
            backends,
            conntrack,
        },
        stats,
    ))
}

/// A loaded and attached datapath. Dropping it detaches every program
/// (TCX links are owned by this process) and frees the maps.
pub struct Datapath {
    ebpf: Ebpf,
    maps: KernelMaps,
    stats: PerCpuArray<MapData, u64>,
    programmer: Programmer,
    interface_prefixes: Vec<String>,
    attached: BTreeMap<String, (u32, SchedClassifierLinkId)>,
}

impl Datapath {
    pub fn new(interface_prefixes: Vec<String>) -> anyhow::Result<Self> {
        let mut ebpf = load()?;
        let (maps, stats) = kernel_maps(&mut ebpf)?;
        Ok(Self {
            ebpf,
            maps,
            stats,
            programmer: Programmer::new(),
            interface_prefixes,
            attached: BTreeMap::new(),
        })
    }

    pub fn sync(&mut self, state: &DesiredState) -> Result<SyncStats, MapError> {
        self.programmer.sync(state, &mut self.maps)
    }

    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        stats::read(&self.stats)
    }

    /// Attaches to pod interfaces that appeared and forgets ones that went
    /// away (the kernel drops their links with them).
    pub fn reconcile_interfaces(&mut self) -> anyhow::Result<()> {
        let present =
            interfaces::matching(&self.interface_prefixes).context("listing /sys/class/net")?;
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(PROG_FROM_POD)
            .context("program missing")?
            .try_into()?;

        let stale: Vec<String> = self
            .attached
            .iter()
            .filter(|(name, (index, _))| present.get(*name) != Some(index))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some((_, link)) = self.attached.remove(&name) {
                // The interface is gone (or was recreated): its link went with it.
                let _ = prog.detach(link);
                info!(interface = %name, "pod interface gone, link released");
            }
        }
        for (name, index) in present {
            if self.attached.contains_key(&name) {
                continue;
            }
            match prog.attach(&name, TcAttachType::Ingress) {
                Ok(link) => {
                    info!(interface = %name, ifindex = index, "attached tc_from_pod at ingress");
                    self.attached.insert(name, (index, link));
                }
                // Typically the interface vanished mid-way; the next pass retries.
                Err(e) => warn!(interface = %name, error = %e, "attaching tc_from_pod failed"),
            }
        }
        Ok(())
    }

    pub fn attached_interfaces(&self) -> impl Iterator<Item = &str> {
        self.attached.keys().map(String::as_str)
    }
}
