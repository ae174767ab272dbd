//! A running agent's maps, opened from the pins it leaves under a BPF
//! filesystem ([`crate::modes::ebpf::pin`]), for the subcommands that read
//! them (`explain --online` today). Opening a pin never changes the map.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use aya::maps::{Map, MapData, MapError};
use proxy_common::maps as names;

use crate::{
    cli::values::nonempty_path,
    modes::ebpf::{
        KernelMaps, MapSizes, mapped_array::MappedArray, maps::Maps6, pin, slot_table::SlotTable,
    },
};

/// `--pin-dir`, for any subcommand that reads the agent's pins.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct PinDirArg {
    /// Where the agent pins its maps [default: $KUBE_EBPF_PROXY_PIN_DIR,
    /// else /sys/fs/bpf/kube-ebpf-proxy/v<ABI>/maps]
    #[arg(long, value_name = "DIR", value_parser = nonempty_path)]
    pub pin_dir: Option<PathBuf>,
}

impl PinDirArg {
    /// The directory given, else the agent's ([`pin::pin_dir`]).
    pub fn dir(&self) -> PathBuf {
        self.pin_dir.clone().unwrap_or_else(pin::pin_dir)
    }
}

/// Every map the agent pins, typed as the agent holds them, with the sizes
/// it loaded them with. The subcommands only read them.
pub struct PinnedMaps {
    pub maps: KernelMaps,
    /// The capacities of the sized maps, as pinned.
    pub sizes: MapSizes,
}

impl PinnedMaps {
    /// Opens every pinned map under `dir` by name. Errors name `--pin-dir`.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            bail!(
                "--pin-dir: {} holds no pinned maps (is the agent running? it pins its maps at start-up when a BPF filesystem is mounted there)",
                dir.display()
            );
        }
        let (services, services_max) = open(dir, names::SERVICES)?;
        let (backends, backends_max) = open(dir, names::BACKENDS)?;
        let (conntrack, conntrack_max) = open(dir, names::CONNTRACK)?;
        let (maglev, maglev_max) = open(dir, names::MAGLEV)?;
        let maps = KernelMaps {
            services,
            backends,
            conntrack,
            config: open(dir, names::CONFIG)?.0,
            ifaces: open(dir, names::IFACES)?.0,
            local_pod_cidrs: open(dir, names::LOCAL_POD_CIDRS)?.0,
            service_cidrs: open(dir, names::SERVICE_CIDRS)?.0,
            source_ranges: open(dir, names::SOURCE_RANGES)?.0,
            sockets: open(dir, names::SOCKETS)?.0,
            affinity: open(dir, names::AFFINITY)?.0,
            maglev,
            slots: SlotTable::new(open(dir, names::SLOTS)?.0)?,
            // Pinned since the filter exists; an older agent's pins lack it.
            filter: open(dir, names::FILTER)
                .ok()
                .and_then(|(m, _)| MappedArray::new(m, names::FILTER).ok()),
            v6: Maps6 {
                services: open(dir, names::SERVICES6)?.0,
                backends: open(dir, names::BACKENDS6)?.0,
                conntrack: open(dir, names::CONNTRACK6)?.0,
                config: open(dir, names::CONFIG6)?.0,
                local_pod_cidrs: open(dir, names::LOCAL_POD_CIDRS6)?.0,
                service_cidrs: open(dir, names::SERVICE_CIDRS6)?.0,
                source_ranges: open(dir, names::SOURCE_RANGES6)?.0,
                sockets: open(dir, names::SOCKETS6)?.0,
                affinity: open(dir, names::AFFINITY6)?.0,
                maglev: open(dir, names::MAGLEV6)?.0,
                slots: SlotTable::new(open(dir, names::SLOTS6)?.0)?,
                filter: open(dir, names::FILTER6)
                    .ok()
                    .and_then(|(m, _)| MappedArray::new(m, names::FILTER6).ok()),
            },
            deferred: None,
            flusher: None,
        };
        let slots = maps.slots.capacity();
        Ok(PinnedMaps {
            maps,
            sizes: MapSizes {
                services: services_max,
                backends: backends_max,
                conntrack: conntrack_max,
                maglev: maglev_max,
                slots,
            },
        })
    }
}

/// The map pinned at `dir/name`, typed, with its capacity (`max_entries`).
pub fn open<M>(dir: &Path, name: &str) -> anyhow::Result<(M, u32)>
where
    M: TryFrom<Map, Error = MapError>,
{
    let path = dir.join(name);
    let data = MapData::from_pin(&path)
        .with_context(|| format!("--pin-dir: opening the pinned map {}", path.display()))?;
    let max_entries = data
        .info()
        .with_context(|| format!("reading the map info of {}", path.display()))?
        .max_entries();
    let map = Map::from_map_data(data)
        .and_then(M::try_from)
        .with_context(|| {
            format!(
                "{}: unexpected map type or layout (pinned by an agent of another version?)",
                path.display()
            )
        })?;
    Ok((map, max_entries))
}
