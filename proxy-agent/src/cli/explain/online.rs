//! The online form: the running agent's pinned maps copied into a private
//! load of the same programs, so test runs see exactly what the agent
//! programmed (conntrack included) while the live maps are only read.
//! Packets run in the current network namespace, the agent's, so FIB
//! lookups and interface indexes are the node's own.

use std::{ffi::CStr, path::Path, process::Command};

use anyhow::{Context as _, bail};
use aya::{
    Pod,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError},
};
use proxy_common::{
    Backend, BackendId, CtKey, CtValue, DatapathConfig, IfaceInfo, Ipv4Prefix, ServiceKey,
    ServiceValue, SourceRange, config::iface, maps as names,
};

use super::{
    probe::{Origin, Probe},
    trace::Datapath,
};
use crate::modes::ebpf::{self, KernelMaps, MapSizes};

/// The agent's maps, opened from their pins.
struct Pinned {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, BackendId, Backend>,
    conntrack: HashMap<MapData, CtKey, CtValue>,
    config: Array<MapData, DatapathConfig>,
    ifaces: HashMap<MapData, u32, IfaceInfo>,
    local_pod_cidrs: LpmTrie<MapData, Ipv4Prefix, u8>,
    source_ranges: LpmTrie<MapData, SourceRange, u8>,
    sizes: MapSizes,
}

pub fn prepare(pin_dir: &Path, probe: &Probe) -> anyhow::Result<Datapath> {
    if !pin_dir.is_dir() {
        bail!(
            "--pin-dir: {} holds no pinned maps (is the agent running? it pins its maps at start-up when a BPF filesystem is mounted there)",
            pin_dir.display()
        );
    }
    let pinned = open_all(pin_dir)?;
    let mut ebpf = ebpf::load_with(pinned.sizes)?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    copy(&pinned, &mut maps)?;
    let (ifindex, xdp) = arrival_interface(probe, &pinned.ifaces)?;
    Ok(Datapath {
        ebpf,
        maps,
        stats,
        pod_ifindex: ifindex,
        external_ifindex: ifindex,
        xdp,
    })
}

fn open_all(dir: &Path) -> anyhow::Result<Pinned> {
    let (services, services_max) = open(dir, names::SERVICES)?;
    let (backends, backends_max) = open(dir, names::BACKENDS)?;
    let (conntrack, conntrack_max) = open(dir, names::CONNTRACK)?;
    Ok(Pinned {
        services,
        backends,
        conntrack,
        config: open(dir, names::CONFIG)?.0,
        ifaces: open(dir, names::IFACES)?.0,
        local_pod_cidrs: open(dir, names::LOCAL_POD_CIDRS)?.0,
        source_ranges: open(dir, names::SOURCE_RANGES)?.0,
        sizes: MapSizes {
            services: services_max,
            backends: backends_max,
            conntrack: conntrack_max,
        },
    })
}

/// A pinned map, typed, with its capacity.
fn open<M>(dir: &Path, name: &str) -> anyhow::Result<(M, u32)>
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

fn copy(from: &Pinned, to: &mut KernelMaps) -> anyhow::Result<()> {
    copy_hash(&from.backends, &mut to.backends, names::BACKENDS)?;
    copy_hash(&from.services, &mut to.services, names::SERVICES)?;
    copy_hash(&from.ifaces, &mut to.ifaces, names::IFACES)?;
    copy_trie(
        &from.local_pod_cidrs,
        &mut to.local_pod_cidrs,
        names::LOCAL_POD_CIDRS,
    )?;
    copy_trie(
        &from.source_ranges,
        &mut to.source_ranges,
        names::SOURCE_RANGES,
    )?;
    copy_hash(&from.conntrack, &mut to.conntrack, names::CONNTRACK)?;
    let config = from
        .config
        .get(&0, 0)
        .with_context(|| format!("reading {}", names::CONFIG))?;
    to.config
        .set(0, config, 0)
        .with_context(|| format!("writing {}", names::CONFIG))?;
    Ok(())
}

fn copy_hash<K: Pod, V: Pod>(
    from: &HashMap<MapData, K, V>,
    to: &mut HashMap<MapData, K, V>,
    name: &str,
) -> anyhow::Result<()> {
    for entry in from.iter() {
        let (key, value) = entry.with_context(|| format!("reading {name}"))?;
        to.insert(key, value, 0)
            .with_context(|| format!("copying {name}"))?;
    }
    Ok(())
}

fn copy_trie<K: Pod, V: Pod>(
    from: &LpmTrie<MapData, K, V>,
    to: &mut LpmTrie<MapData, K, V>,
    name: &str,
) -> anyhow::Result<()> {
    for entry in from.iter() {
        let (key, value) = entry.with_context(|| format!("reading {name}"))?;
        to.insert(&key, value, 0)
            .with_context(|| format!("copying {name}"))?;
    }
    Ok(())
}

/// The interface the packet arrives on, and whether XDP sees it first there.
///
/// From a pod: the interface this namespace routes the source to (the pod's
/// veth, or its bridge). From outside: the external interface (as the agent
/// flagged them in `IFACES`) the source is routed through, else the first one.
fn arrival_interface(
    probe: &Probe,
    ifaces: &HashMap<MapData, u32, IfaceInfo>,
) -> anyhow::Result<(u32, bool)> {
    let routed = route_device(probe.src)?;
    let index = match probe.origin {
        Origin::Pod => routed.unwrap_or(1),
        Origin::Outside => {
            let mut external: Vec<u32> = ifaces
                .iter()
                .filter_map(Result::ok)
                .filter(|(_, info)| info.flags & iface::EXTERNAL != 0)
                .map(|(index, _)| index)
                .collect();
            external.sort_unstable();
            match routed.filter(|r| external.contains(r)) {
                Some(index) => index,
                None => external.first().copied().or(routed).context(
                    "the agent flagged no external interface, and no route leads to --src",
                )?,
            }
        }
    };
    let xdp = probe.origin == Origin::Outside && xdp_attached(index);
    Ok((index, xdp))
}

/// The ifindex of the device `ip route get` names for `addr`, if any.
fn route_device(addr: std::net::Ipv4Addr) -> anyhow::Result<Option<u32>> {
    let out = Command::new("ip")
        .args(["-o", "-4", "route", "get", &addr.to_string()])
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let Some(dev) = words.by_ref().find(|w| *w == "dev").and(words.next()) else {
        return Ok(None);
    };
    let Ok(name) = std::ffi::CString::new(dev) else {
        return Ok(None);
    };
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    Ok((index != 0).then_some(index))
}

/// Whether an XDP program is attached to interface `index`.
fn xdp_attached(index: u32) -> bool {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
    if unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) }.is_null() {
        return false;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Command::new("ip")
        .args(["-d", "-j", "link", "show", "dev", &name])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v.get(0).and_then(|l| l.get("xdp")).cloned())
        .is_some()
}
