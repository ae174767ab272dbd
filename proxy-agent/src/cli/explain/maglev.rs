//! Maglev consistent hashing as the probe meets it: the bucket of the
//! client tuple, the backend slot the frontend's table gives it, and that
//! slot's endpoint (`MAGLEV*` and the service maps, private copies).

use std::net::{IpAddr, SocketAddr};

use proxy_common::{
    ServiceKeyOf, ServiceValue, V4, V6,
    maglev::{MAGLEV_SLOT, locate},
    service::flags,
};
use serde::Serialize;

use super::probe::{Origin, Probe};
use crate::modes::ebpf::{KernelMaps, family::AgentFamily, maglev::bucket, slot_table::SlotTable};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    pub table_size: u32,
    /// The client tuple's bucket; `None` for the node's own connections,
    /// which get a random one (their source port is not chosen at connect).
    pub bucket: Option<u32>,
    /// The backend slot of the frontend's table at that bucket.
    pub slot: Option<u16>,
    pub endpoint: Option<String>,
}

/// The bucket of `probe` at its frontend, when that frontend is balanced by
/// a Maglev table. The frontend's primary set's table: a local client of a
/// Local-policy external frontend is balanced over the cluster-wide set's.
pub fn read(maps: &KernelMaps, probe: &Probe) -> Option<Bucket> {
    let (port_be, proto) = (probe.dport.to_be(), probe.proto.number());
    match probe.dst {
        IpAddr::V4(ip) => read_family::<V4>(
            &maps.services,
            &maps.maglev,
            &maps.slots,
            &maps.backends,
            ServiceKeyOf::frontend(V4::to_be(ip), port_be, proto),
            probe,
        ),
        IpAddr::V6(ip) => read_family::<V6>(
            &maps.v6.services,
            &maps.v6.maglev,
            &maps.v6.slots,
            &maps.v6.backends,
            ServiceKeyOf::frontend(V6::to_be(ip), port_be, proto),
            probe,
        ),
    }
}

fn read_family<F: AgentFamily>(
    services: &aya::maps::HashMap<aya::maps::MapData, ServiceKeyOf<F>, ServiceValue>,
    tables: &aya::maps::Array<aya::maps::MapData, proxy_common::maglev::MaglevChunk>,
    slots: &SlotTable,
    backends: &aya::maps::HashMap<
        aya::maps::MapData,
        proxy_common::BackendId,
        proxy_common::BackendOf<F>,
    >,
    key: ServiceKeyOf<F>,
    probe: &Probe,
) -> Option<Bucket>
where
    ServiceKeyOf<F>: aya::Pod,
    proxy_common::BackendOf<F>: aya::Pod,
{
    let frontend = services.get(&key, 0).ok()?;
    if !frontend.has(flags::MAGLEV) {
        return None;
    }
    let (first, m) = services
        .get(&key.with_slot(MAGLEV_SLOT), 0)
        .ok()?
        .maglev_table();
    if probe.origin == Origin::Host {
        return Some(Bucket {
            table_size: m,
            bucket: None,
            slot: None,
            endpoint: None,
        });
    }
    let b = bucket(
        SocketAddr::new(probe.src, probe.sport),
        probe.dport,
        probe.proto.number(),
        m,
    );
    let (element, at) = locate(first, b);
    let slot = tables
        .get(&element, 0)
        .ok()
        .map(|c| c.slots[at])
        .filter(|s| *s != 0 && *s <= frontend.count);
    let endpoint = slot
        .and_then(|s| slots.read(frontend.slot_index(s), 1).first().copied())
        .and_then(|id| backends.get(&id, 0).ok())
        .map(|b| {
            SocketAddr::new(F::from_be(b.addr_be).into(), u16::from_be(b.port_be)).to_string()
        });
    Some(Bucket {
        table_size: m,
        bucket: Some(b),
        slot,
        endpoint,
    })
}

/// The report's line for a bucket.
pub fn text(b: &Bucket) -> String {
    match (b.bucket, b.slot, &b.endpoint) {
        (None, _, _) => format!(
            "table of {} buckets; the node's own connections take a random bucket",
            b.table_size
        ),
        (Some(bucket), Some(slot), Some(endpoint)) => format!(
            "bucket {bucket} of {}: slot {slot}, endpoint {endpoint}",
            b.table_size
        ),
        (Some(bucket), _, _) => format!(
            "bucket {bucket} of {}: no slot (balanced at random while the table is rewritten)",
            b.table_size
        ),
    }
}
