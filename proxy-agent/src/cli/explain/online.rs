//! The online form: the running agent's pinned maps ([`PinnedMaps`])
//! copied into a private load of the same programs, so test runs see exactly what the agent
//! programmed (conntrack included) while the live maps are only read.
//! Packets run in the current network namespace, the agent's, so FIB
//! lookups and interface indexes are the node's own.

use std::{ffi::CStr, net::IpAddr, path::Path, process::Command};

use anyhow::Context as _;
use aya::{
    Pod,
    maps::{HashMap, LpmTrie, MapData},
};
use proxy_common::{
    IfaceInfo, Scope, ServiceKeyOf, ServiceValue, V4, V6,
    config::iface,
    maglev::{MAGLEV_SLOT, chunks_per_table},
    maps as names,
};

use super::{
    probe::{Origin, Probe},
    trace::Datapath,
};
use crate::{
    cli::pins::PinnedMaps,
    modes::ebpf::{self, KernelMaps, family::AgentFamily as _, mapped_array::MappedArray},
};

/// XDP's filter as the agent wrote it; pins of an agent before the filter
/// have none, and its XDP looked every packet up: every bit set.
fn copy_filter(from: Option<&MappedArray<u64>>, to: Option<&mut MappedArray<u64>>) {
    let Some(to) = to else {
        return;
    };
    match from {
        Some(from) => to.copy_from(from),
        None => to.fill(u64::MAX),
    }
}

pub fn prepare(pin_dir: &Path, probe: &Probe) -> anyhow::Result<Datapath> {
    let pinned = PinnedMaps::open(pin_dir)?;
    let mut ebpf = ebpf::load_with(pinned.sizes)?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    copy(&pinned.maps, &mut maps)?;
    copy_maglev_tables(&pinned.maps, &mut maps, probe)?;
    let (ifindex, xdp) = arrival_interface(probe, &pinned.maps.ifaces)?;
    Ok(Datapath {
        ebpf,
        maps,
        stats,
        pod_ifindex: ifindex,
        external_ifindex: ifindex,
        xdp,
    })
}

fn copy(from: &KernelMaps, to: &mut KernelMaps) -> anyhow::Result<()> {
    copy_hash(&from.backends, &mut to.backends, names::BACKENDS)?;
    copy_hash(&from.services, &mut to.services, names::SERVICES)?;
    to.slots.copy_from(&from.slots);
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
    copy_trie(
        &from.service_cidrs,
        &mut to.service_cidrs,
        names::SERVICE_CIDRS,
    )?;
    copy_hash(&from.conntrack, &mut to.conntrack, names::CONNTRACK)?;
    copy_hash(&from.affinity, &mut to.affinity, names::AFFINITY)?;
    copy_filter(from.filter.as_ref(), to.filter.as_mut());
    let config = from
        .config
        .get(&0, 0)
        .with_context(|| format!("reading {}", names::CONFIG))?;
    to.config
        .set(0, config, 0)
        .with_context(|| format!("writing {}", names::CONFIG))?;

    let (from, to) = (&from.v6, &mut to.v6);
    copy_hash(&from.backends, &mut to.backends, names::BACKENDS6)?;
    copy_hash(&from.services, &mut to.services, names::SERVICES6)?;
    to.slots.copy_from(&from.slots);
    copy_filter(from.filter.as_ref(), to.filter.as_mut());
    copy_trie(
        &from.local_pod_cidrs,
        &mut to.local_pod_cidrs,
        names::LOCAL_POD_CIDRS6,
    )?;
    copy_trie(
        &from.source_ranges,
        &mut to.source_ranges,
        names::SOURCE_RANGES6,
    )?;
    copy_trie(
        &from.service_cidrs,
        &mut to.service_cidrs,
        names::SERVICE_CIDRS6,
    )?;
    copy_hash(&from.conntrack, &mut to.conntrack, names::CONNTRACK6)?;
    copy_hash(&from.affinity, &mut to.affinity, names::AFFINITY6)?;
    let config = from
        .config
        .get(&0, 0)
        .with_context(|| format!("reading {}", names::CONFIG6))?;
    to.config
        .set(0, config, 0)
        .with_context(|| format!("writing {}", names::CONFIG6))?;
    Ok(())
}

/// The Maglev tables the probe's frontend names (both of its scopes): the
/// arrays hold every service's, far more than one probe reads.
fn copy_maglev_tables(from: &KernelMaps, to: &mut KernelMaps, probe: &Probe) -> anyhow::Result<()> {
    let (port_be, proto) = (probe.dport.to_be(), probe.proto.number());
    let refs: Vec<ServiceValue> = match probe.dst {
        IpAddr::V4(ip) => {
            let key = ServiceKeyOf::<V4>::frontend(V4::to_be(ip), port_be, proto);
            [Scope::Primary, Scope::ClusterWide]
                .into_iter()
                .filter_map(|s| {
                    from.services
                        .get(&key.with_scope(s).with_slot(MAGLEV_SLOT), 0)
                        .ok()
                })
                .collect()
        }
        IpAddr::V6(ip) => {
            let key = ServiceKeyOf::<V6>::frontend(V6::to_be(ip), port_be, proto);
            [Scope::Primary, Scope::ClusterWide]
                .into_iter()
                .filter_map(|s| {
                    from.v6
                        .services
                        .get(&key.with_scope(s).with_slot(MAGLEV_SLOT), 0)
                        .ok()
                })
                .collect()
        }
    };
    let (source, target, name) = match probe.dst {
        IpAddr::V4(_) => (&from.maglev, &mut to.maglev, names::MAGLEV),
        IpAddr::V6(_) => (&from.v6.maglev, &mut to.v6.maglev, names::MAGLEV6),
    };
    for table in refs {
        let (first, m) = table.maglev_table();
        for element in first..first + chunks_per_table(m) {
            let chunk = source
                .get(&element, 0)
                .with_context(|| format!("reading {name}[{element}]"))?;
            target
                .set(element, chunk, 0)
                .with_context(|| format!("copying {name}[{element}]"))?;
        }
    }
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
        // The node's own connections meet the socket hook, no interface.
        Origin::Pod | Origin::Host => routed.unwrap_or(1),
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
fn route_device(addr: std::net::IpAddr) -> anyhow::Result<Option<u32>> {
    let family = if addr.is_ipv4() { "-4" } else { "-6" };
    let out = Command::new("ip")
        .args(["-o", family, "route", "get", &addr.to_string()])
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
