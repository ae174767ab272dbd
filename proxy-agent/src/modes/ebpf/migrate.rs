//! Upgrades across map-layout changes. A new agent that finds maps pinned by
//! an older ABI version copies their entries into its own (new) maps,
//! converting the ones whose layout changed, before its programs take the
//! links over: established flows keep their conntrack entries, services and
//! backends keep their ids. Entries the old programs create between the copy
//! and the link update (new flows of those few milliseconds) are not copied.
//!
//! Every layout change adds its version here, with the old types kept below.

use std::path::Path;

use anyhow::Context as _;
use aya::{
    Pod,
    maps::{Array, HashMap, LpmTrie, Map, MapData, PerCpuArray, PerCpuValues},
};
use proxy_common::{
    BackendId, CtKeyOf, CtValueOf, DatapathConfig, Family, ServiceKeyOf, ServiceValue,
    maglev::MAGLEV_SLOT, maps as names, service::flags,
};
use std::collections::BTreeMap;
use tracing::info;

use super::{KernelMaps, slot_table::SlotTable};

/// The versions this agent migrates from.
const FROM: &[u32] = &[3, 4, 5, 6, 7];

pub fn can_migrate(version: u32) -> bool {
    FROM.contains(&version)
}

/// What was copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    pub entries: usize,
    pub conntrack: usize,
}

/// Copies the maps of ABI `version` pinned in `old_dir` into `maps` and `stats`.
pub fn migrate(
    version: u32,
    old_dir: &Path,
    maps: &mut KernelMaps,
    stats: &mut PerCpuArray<MapData, u64>,
) -> anyhow::Result<Migrated> {
    anyhow::ensure!(can_migrate(version), "no migration from map ABI {version}");
    // Version 3 -> 4: DatapathConfig gained the SYN_SENT, TIME_WAIT and CLOSE
    // timeouts. Version 4 -> 5: DatapathConfig gained the host's netns
    // cookie, Backend's padding became flags (0: none), and the SOCKETS map
    // appeared (it starts empty: no socket was translated before). Version
    // 5 -> 6: the conntrack key lost its direction byte (both halves of a
    // flow in one tuple space, the reply half marked in its value), and the
    // value gained the next-hop cache (empty until a packet fills it).
    // Version 6 -> 7: backend slots moved from service-map entries to the
    // SLOTS arrays, named by the frontend's `first_slot`. Version 7 -> 8:
    // the conntrack tables became plain hashes swept by CT_COLLECTOR (LRU
    // hashes before; same keys and values). Maps added without a bump are
    // copied when the old version has them.
    let mut done = Migrated::default();
    done.entries += if version >= 7 {
        copy_hash(old_dir, names::SERVICES, &mut maps.services)?
            + copy_slots(old_dir, names::SLOTS, &mut maps.slots)?
    } else {
        copy_services(
            old_dir,
            names::SERVICES,
            &mut maps.services,
            &mut maps.slots,
        )?
    };
    done.entries += copy_hash(old_dir, names::BACKENDS, &mut maps.backends)?;
    done.conntrack = if version >= 6 {
        copy_hash(old_dir, names::CONNTRACK, &mut maps.conntrack)?
    } else {
        copy_conntrack(old_dir, names::CONNTRACK, &mut maps.conntrack)?
    };
    done.entries += copy_hash(old_dir, names::IFACES, &mut maps.ifaces)?;
    done.entries += copy_lpm(old_dir, names::LOCAL_POD_CIDRS, &mut maps.local_pod_cidrs)?;
    done.entries += copy_lpm(old_dir, names::SOURCE_RANGES, &mut maps.source_ranges)?;
    if version >= 5 {
        done.entries += copy_hash(old_dir, names::SOCKETS, &mut maps.sockets)?;
        done.entries += copy_if_pinned(old_dir, names::SERVICE_CIDRS, |d, n| {
            copy_lpm(d, n, &mut maps.service_cidrs)
        })?;
        done.entries += copy_if_pinned(old_dir, names::AFFINITY, |d, n| {
            copy_hash(d, n, &mut maps.affinity)
        })?;
        done.entries += copy_if_pinned(old_dir, names::MAGLEV, |d, n| {
            copy_array(d, n, &mut maps.maglev)
        })?;
        done.conntrack += copy_if_pinned(old_dir, names::CONNTRACK6, |d, n| {
            if version >= 6 {
                copy_hash(d, n, &mut maps.v6.conntrack)
            } else {
                copy_conntrack(d, n, &mut maps.v6.conntrack)
            }
        })?;
        let v6 = &mut maps.v6;
        done.entries += copy_if_pinned(old_dir, names::SERVICES6, |d, n| {
            if version >= 7 {
                Ok(copy_hash(d, n, &mut v6.services)?
                    + copy_slots(d, names::SLOTS6, &mut v6.slots)?)
            } else {
                copy_services(d, n, &mut v6.services, &mut v6.slots)
            }
        })?;
        done.entries += copy_if_pinned(old_dir, names::BACKENDS6, |d, n| {
            copy_hash(d, n, &mut v6.backends)
        })?;
        done.entries += copy_if_pinned(old_dir, names::CONFIG6, |d, n| {
            copy_array(d, n, &mut v6.config)
        })?;
        done.entries += copy_if_pinned(old_dir, names::LOCAL_POD_CIDRS6, |d, n| {
            copy_lpm(d, n, &mut v6.local_pod_cidrs)
        })?;
        done.entries += copy_if_pinned(old_dir, names::SERVICE_CIDRS6, |d, n| {
            copy_lpm(d, n, &mut v6.service_cidrs)
        })?;
        done.entries += copy_if_pinned(old_dir, names::SOURCE_RANGES6, |d, n| {
            copy_lpm(d, n, &mut v6.source_ranges)
        })?;
        done.entries += copy_if_pinned(old_dir, names::SOCKETS6, |d, n| {
            copy_hash(d, n, &mut v6.sockets)
        })?;
        done.entries += copy_if_pinned(old_dir, names::AFFINITY6, |d, n| {
            copy_hash(d, n, &mut v6.affinity)
        })?;
        done.entries += copy_if_pinned(old_dir, names::MAGLEV6, |d, n| {
            copy_array(d, n, &mut v6.maglev)
        })?;
    }
    let config = match version {
        3 => {
            let old: Array<MapData, v3::DatapathConfig> = open(old_dir, names::CONFIG)?;
            old.get(&0, 0).context("reading the v3 CONFIG")?.upgrade()
        }
        4 => {
            let old: Array<MapData, v4::DatapathConfig> = open(old_dir, names::CONFIG)?;
            old.get(&0, 0).context("reading the v4 CONFIG")?.upgrade()
        }
        _ => {
            let old: Array<MapData, DatapathConfig> = open(old_dir, names::CONFIG)?;
            old.get(&0, 0).context("reading the CONFIG")?
        }
    };
    maps.config.set(0, config, 0).context("writing CONFIG")?;
    done.entries += 1;
    let old_stats: PerCpuArray<MapData, u64> = open(old_dir, names::STATS)?;
    for index in 0..old_stats.len() {
        let values = old_stats.get(&index, 0)?;
        let values = PerCpuValues::try_from(values.iter().copied().collect::<Vec<u64>>())?;
        stats.set(index, values, 0)?;
    }
    done.entries += done.conntrack;
    info!(
        from = version,
        entries = done.entries,
        conntrack = done.conntrack,
        "migrated the pinned maps to this agent's layout"
    );
    Ok(done)
}

fn open<M>(dir: &Path, name: &str) -> anyhow::Result<M>
where
    M: TryFrom<Map, Error = aya::maps::MapError>,
{
    let path = dir.join(name);
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    let map = Map::from_map_data(data).with_context(|| format!("opening {}", path.display()))?;
    M::try_from(map).with_context(|| format!("{} has an unexpected layout", path.display()))
}

fn copy_hash<K: Pod, V: Pod>(
    dir: &Path,
    name: &str,
    into: &mut HashMap<MapData, K, V>,
) -> anyhow::Result<usize> {
    let from: HashMap<MapData, K, V> = open(dir, name)?;
    let mut copied = 0;
    for entry in from.iter() {
        // An entry deleted while iterating is simply gone.
        let Ok((key, value)) = entry else { continue };
        into.insert(key, value, 0)
            .with_context(|| format!("copying {name}"))?;
        copied += 1;
    }
    Ok(copied)
}

/// Copies a service map of ABI 6 or older, whose frontends' backend slots
/// were entries of their own, into this ABI's map and slots array: each
/// frontend's slots in a range of their own, in key order.
fn copy_services<F: Family>(
    dir: &Path,
    name: &str,
    into: &mut HashMap<MapData, ServiceKeyOf<F>, ServiceValue>,
    slots: &mut SlotTable,
) -> anyhow::Result<usize>
where
    ServiceKeyOf<F>: Pod,
{
    let from: HashMap<MapData, ServiceKeyOf<F>, v6::ServiceValue> = open(dir, name)?;
    let entries: BTreeMap<ServiceKeyOf<F>, v6::ServiceValue> =
        from.iter().filter_map(Result::ok).collect();
    let mut next = 0u32;
    let mut copied = 0;
    for (key, old) in &entries {
        let mut value = old.upgrade();
        if key.slot == MAGLEV_SLOT {
            into.insert(key, value, 0)
                .with_context(|| format!("copying {name}"))?;
            copied += 1;
            continue;
        }
        if key.slot != 0 {
            continue;
        }
        if !old.has(flags::CLUSTER_IP_MARKER) && old.count > 0 {
            let ids: Vec<BackendId> = (1..=old.count)
                .map(|slot| {
                    entries
                        .get(&key.with_slot(slot))
                        .map_or(0, |v| v.backend_id)
                })
                .collect();
            anyhow::ensure!(
                slots.write(next, &ids),
                "copying {name}: its backend slots do not fit in the {} slots of the new array",
                slots.capacity()
            );
            value.first_slot = next;
            next += u32::from(old.count);
        }
        into.insert(key, value, 0)
            .with_context(|| format!("copying {name}"))?;
        copied += 1;
    }
    Ok(copied)
}

/// Copies a slots array of ABI 7 or newer (as many slots as both hold);
/// returns the slots copied.
fn copy_slots(dir: &Path, name: &str, into: &mut SlotTable) -> anyhow::Result<usize> {
    let from = SlotTable::new(open(dir, name)?).with_context(|| format!("mapping {name}"))?;
    into.copy_from(&from);
    Ok(from.capacity().min(into.capacity()) as usize)
}

/// Runs `copy` on map `name` when `dir` has it: maps added without an ABI
/// bump are missing from pins an older agent of the same ABI left.
fn copy_if_pinned(
    dir: &Path,
    name: &str,
    copy: impl FnOnce(&Path, &str) -> anyhow::Result<usize>,
) -> anyhow::Result<usize> {
    if dir.join(name).exists() {
        copy(dir, name)
    } else {
        Ok(0)
    }
}

/// Copies the elements both arrays have (the new one may be sized
/// differently; the agent's first sync rewrites what it needs).
fn copy_array<V: Pod>(
    dir: &Path,
    name: &str,
    into: &mut Array<MapData, V>,
) -> anyhow::Result<usize> {
    let from: Array<MapData, V> = open(dir, name)?;
    let len = from.len().min(into.len());
    for index in 0..len {
        let value = from.get(&index, 0)?;
        into.set(index, value, 0)
            .with_context(|| format!("copying {name}"))?;
    }
    Ok(len as usize)
}

/// Copies a conntrack map of ABI 5 or older, whose keys carried the half
/// of the flow they belong to, into this ABI's single tuple space.
fn copy_conntrack<F: Family>(
    dir: &Path,
    name: &str,
    into: &mut HashMap<MapData, CtKeyOf<F>, CtValueOf<F>>,
) -> anyhow::Result<usize>
where
    v5::CtKeyOf<F>: Pod,
    v5::CtValueOf<F>: Pod,
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let from: HashMap<MapData, v5::CtKeyOf<F>, v5::CtValueOf<F>> = open(dir, name)?;
    let mut copied = 0;
    for entry in from.iter() {
        let Ok((key, value)) = entry else { continue };
        let (key, value) = key.upgrade(value);
        into.insert(key, value, 0)
            .with_context(|| format!("copying {name}"))?;
        copied += 1;
    }
    Ok(copied)
}

fn copy_lpm<K: Pod>(
    dir: &Path,
    name: &str,
    into: &mut LpmTrie<MapData, K, u8>,
) -> anyhow::Result<usize> {
    let from: LpmTrie<MapData, K, u8> = open(dir, name)?;
    let mut copied = 0;
    for entry in from.iter() {
        let Ok((key, value)) = entry else { continue };
        into.insert(&key, value, 0)
            .with_context(|| format!("copying {name}"))?;
        copied += 1;
    }
    Ok(copied)
}

/// The layouts of ABI version 3 that changed in version 4.
pub mod v3 {
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
    pub struct DatapathConfig {
        pub tcp_established_ns: u64,
        pub tcp_closing_ns: u64,
        pub udp_ns: u64,
        pub udp_stream_ns: u64,
        pub masquerade_addr_be: u32,
        pub flags: u32,
        pub snat_port_min: u16,
        pub snat_port_max: u16,
        pub _pad: u32,
    }

    const _: () = assert!(core::mem::size_of::<DatapathConfig>() == 48);

    // SAFETY: plain old data with explicit padding, as the v3 programs wrote it.
    unsafe impl aya::Pod for DatapathConfig {}

    impl DatapathConfig {
        /// The new timeouts start at 0: the datapath's built-in (the kernel's)
        /// defaults, until the agent's first sync writes its settings.
        pub fn upgrade(&self) -> super::DatapathConfig {
            super::DatapathConfig {
                tcp_established_ns: self.tcp_established_ns,
                tcp_closing_ns: self.tcp_closing_ns,
                udp_ns: self.udp_ns,
                udp_stream_ns: self.udp_stream_ns,
                masquerade_addr_be: self.masquerade_addr_be,
                flags: self.flags,
                snat_port_min: self.snat_port_min,
                snat_port_max: self.snat_port_max,
                ..super::DatapathConfig::default()
            }
        }
    }
}

/// The layouts of ABI version 4 that changed in version 5.
pub mod v4 {
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
    pub struct DatapathConfig {
        pub tcp_established_ns: u64,
        pub tcp_closing_ns: u64,
        pub udp_ns: u64,
        pub udp_stream_ns: u64,
        pub tcp_syn_sent_ns: u64,
        pub tcp_time_wait_ns: u64,
        pub tcp_close_ns: u64,
        pub masquerade_addr_be: u32,
        pub flags: u32,
        pub snat_port_min: u16,
        pub snat_port_max: u16,
        pub _pad: u32,
    }

    const _: () = assert!(core::mem::size_of::<DatapathConfig>() == 72);

    // SAFETY: plain old data with explicit padding, as the v4 programs wrote it.
    unsafe impl aya::Pod for DatapathConfig {}

    impl DatapathConfig {
        /// The host's netns cookie starts at 0 (the socket hooks serve no
        /// namespace as the host's) until the agent's first sync writes it.
        pub fn upgrade(&self) -> super::DatapathConfig {
            super::DatapathConfig {
                tcp_established_ns: self.tcp_established_ns,
                tcp_closing_ns: self.tcp_closing_ns,
                udp_ns: self.udp_ns,
                udp_stream_ns: self.udp_stream_ns,
                tcp_syn_sent_ns: self.tcp_syn_sent_ns,
                tcp_time_wait_ns: self.tcp_time_wait_ns,
                tcp_close_ns: self.tcp_close_ns,
                masquerade_addr_be: self.masquerade_addr_be,
                flags: self.flags,
                snat_port_min: self.snat_port_min,
                snat_port_max: self.snat_port_max,
                ..super::DatapathConfig::default()
            }
        }
    }
}

/// The layouts of ABI version 6 that changed in version 7.
pub mod v6 {
    /// A service-map value: a frontend (slot 0), a Maglev reference, or a
    /// backend slot (`backend_id`).
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
    pub struct ServiceValue {
        pub backend_id: u32,
        pub service_id: u32,
        pub count: u16,
        pub flags: u16,
    }

    const _: () = assert!(core::mem::size_of::<ServiceValue>() == 12);

    // SAFETY: plain old data without padding, as the v6 programs wrote it.
    unsafe impl aya::Pod for ServiceValue {}

    impl ServiceValue {
        pub fn has(&self, flag: u16) -> bool {
            self.flags & flag != 0
        }

        /// The same entry with no slots named yet.
        pub fn upgrade(&self) -> proxy_common::ServiceValue {
            proxy_common::ServiceValue {
                backend_id: self.backend_id,
                service_id: self.service_id,
                count: self.count,
                flags: self.flags,
                first_slot: 0,
            }
        }
    }
}

/// The layouts of ABI version 5 that changed in version 6.
pub mod v5 {
    use proxy_common::{Family, V4, V6, conntrack::flags};

    #[repr(C)]
    #[derive(Copy, Clone, Debug, PartialEq, Eq)]
    pub struct CtKeyOf<F: Family> {
        pub saddr_be: F::Addr,
        pub daddr_be: F::Addr,
        pub sport_be: u16,
        pub dport_be: u16,
        pub proto: u8,
        /// 0: the flow's forward half, 1: its reply half.
        pub direction: u8,
        pub _pad: [u8; 2],
    }

    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
    pub struct CtValueOf<F: Family> {
        pub nat_addr_be: F::Addr,
        pub nat_port_be: u16,
        pub flags: u16,
        pub service_id: u32,
        pub backend_id: u32,
        pub snat_addr_be: F::Addr,
        pub snat_port_be: u16,
        pub _pad: u16,
        pub last_seen_ns: u64,
        pub created_ns: u64,
    }

    const _: () = assert!(core::mem::size_of::<CtKeyOf<V4>>() == 16);
    const _: () = assert!(core::mem::size_of::<CtKeyOf<V6>>() == 40);
    const _: () = assert!(core::mem::size_of::<CtValueOf<V4>>() == 40);
    const _: () = assert!(core::mem::size_of::<CtValueOf<V6>>() == 64);

    // SAFETY: plain old data with explicit padding, as the v5 programs wrote it.
    unsafe impl aya::Pod for CtKeyOf<V4> {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CtKeyOf<V6> {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CtValueOf<V4> {}
    // SAFETY: as above.
    unsafe impl aya::Pod for CtValueOf<V6> {}

    impl<F: Family> CtKeyOf<F> {
        /// The entry in ABI 6's layout: the same tuple, the half in the
        /// value, no next hop cached.
        pub fn upgrade(
            &self,
            old: CtValueOf<F>,
        ) -> (proxy_common::CtKeyOf<F>, proxy_common::CtValueOf<F>) {
            let key = proxy_common::CtKeyOf::new(
                self.saddr_be,
                self.daddr_be,
                self.sport_be,
                self.dport_be,
                self.proto,
            );
            let reply = if self.direction != 0 { flags::REPLY } else { 0 };
            let value = proxy_common::CtValueOf {
                nat_addr_be: old.nat_addr_be,
                nat_port_be: old.nat_port_be,
                flags: old.flags | reply,
                service_id: old.service_id,
                backend_id: old.backend_id,
                snat_addr_be: old.snat_addr_be,
                snat_port_be: old.snat_port_be,
                _pad: 0,
                last_seen_ns: old.last_seen_ns,
                created_ns: old.created_ns,
                next_hop: Default::default(),
            };
            (key, value)
        }
    }
}
