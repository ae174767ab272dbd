//! `inspect services` and `inspect backends`: the frontends the service map
//! holds with the backends of their slots, and the backend map, named.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use aya::maps::{HashMap, MapData};
use proxy_common::{
    BackendId, BackendOf, Scope, ServiceKeyOf, ServiceValue, V4, V6, maglev::MAGLEV_SLOT,
    maps as names, service::flags,
};
use serde::Serialize;

use super::{args::EndpointFilter, names::Naming, table::Table};
use crate::modes::ebpf::{
    KernelMaps, family::AgentFamily, maps::with_slots, publish::protocol_name,
};

/// A service map key of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendKey {
    pub addr: IpAddr,
    pub port_be: u16,
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
}

/// A backend map entry of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendEntry {
    pub addr: IpAddr,
    pub port_be: u16,
    pub proto: u8,
    pub flags: u8,
}

fn key_of<F: AgentFamily>(k: &ServiceKeyOf<F>) -> FrontendKey {
    FrontendKey {
        addr: F::from_be(k.addr_be).into(),
        port_be: k.port_be,
        slot: k.slot,
        proto: k.proto,
        scope: k.scope,
    }
}

fn backend_of<F: AgentFamily>(b: &BackendOf<F>) -> BackendEntry {
    BackendEntry {
        addr: F::from_be(b.addr_be).into(),
        port_be: b.port_be,
        proto: b.proto,
        flags: b.flags,
    }
}

/// What both families' service and backend maps hold, read once.
pub struct ServiceTables {
    pub entries: Vec<(FrontendKey, ServiceValue)>,
    pub backends: BTreeMap<BackendId, BackendEntry>,
}

impl ServiceTables {
    pub fn read(maps: &KernelMaps) -> anyhow::Result<Self> {
        let entries4 = with_slots(read_all(&maps.services, names::SERVICES)?, &maps.slots);
        let entries6 = with_slots(
            read_all(&maps.v6.services, names::SERVICES6)?,
            &maps.v6.slots,
        );
        let backends4 = read_all(&maps.backends, names::BACKENDS)?;
        let backends6 = read_all(&maps.v6.backends, names::BACKENDS6)?;
        Ok(ServiceTables {
            entries: (entries4.iter().map(|(k, v)| (key_of::<V4>(k), *v)))
                .chain(entries6.iter().map(|(k, v)| (key_of::<V6>(k), *v)))
                .collect(),
            backends: (backends4.iter().map(|(id, b)| (*id, backend_of::<V4>(b))))
                .chain(backends6.iter().map(|(id, b)| (*id, backend_of::<V6>(b))))
                .collect(),
        })
    }

    /// The service ids of the frontends.
    pub fn service_ids(&self) -> BTreeSet<u32> {
        self.entries
            .iter()
            .filter(|(k, v)| k.slot == 0 && !v.has(flags::CLUSTER_IP_MARKER))
            .map(|(_, v)| v.service_id)
            .collect()
    }
}

fn read_all<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &str,
) -> anyhow::Result<Vec<(K, V)>> {
    use anyhow::Context as _;
    map.iter()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the pinned map {name}"))
}

/// A backend as reported.
#[derive(Clone, Debug, Serialize)]
pub struct BackendView {
    pub backend_id: u32,
    pub address: String,
    pub port: u16,
    pub protocol: &'static str,
    /// The node itself (a hostNetwork endpoint here).
    pub host_local: bool,
    /// From the published names; `null` when unknown.
    pub node: Option<String>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub local: Option<bool>,
}

impl BackendView {
    pub fn new(id: BackendId, b: Option<&BackendEntry>, naming: &Naming) -> Self {
        let named = naming.backend(id);
        BackendView {
            backend_id: id,
            address: b.map_or_else(|| "?".into(), |b| b.addr.to_string()),
            port: b.map_or(0, |b| u16::from_be(b.port_be)),
            protocol: b.map_or("?", |b| protocol_name(b.proto)),
            host_local: b.is_some_and(|b| b.flags & proxy_common::backend::flags::HOST_LOCAL != 0),
            node: named.and_then(|n| n.node.clone()),
            ready: named.map(|n| n.ready),
            serving: named.map(|n| n.serving),
            terminating: named.map(|n| n.terminating),
            local: named.map(|n| n.local),
        }
    }

    fn state(&self) -> String {
        match (self.ready, self.serving, self.terminating) {
            (Some(true), _, _) => "ready".into(),
            (Some(false), Some(true), Some(true)) => "serving,terminating".into(),
            (Some(false), Some(false), Some(true)) => "terminating".into(),
            (Some(false), _, _) => "not-ready".into(),
            _ => "-".into(),
        }
    }
}

/// One frontend (one scope of it) with its slots.
#[derive(Clone, Debug, Serialize)]
pub struct FrontendView {
    pub address: String,
    pub port: u16,
    pub protocol: &'static str,
    /// ClusterIP, NodePort, ExternalIP or LoadBalancer.
    pub kind: &'static str,
    /// `primary`, or `cluster_wide` (the backends a Local-policy frontend
    /// gives this node's own pods).
    pub scope: &'static str,
    pub service_id: u32,
    /// `namespace/name:port/PROTOCOL`, when named.
    pub service: Option<String>,
    pub internal_traffic_policy: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub session_affinity: Option<String>,
    /// The datapath's own flags: externally reached, only local backends,
    /// source ranges checked, reject when empty, host only.
    pub external: bool,
    pub policy_local: bool,
    pub source_ranges: bool,
    pub reject_when_empty: bool,
    pub host_only: bool,
    /// Balanced by a Maglev table of this many buckets; `None`: at random.
    pub maglev_table_size: Option<u32>,
    pub backends: Vec<BackendView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServicesReport {
    pub names: super::names::NamesStatus,
    pub frontends: Vec<FrontendView>,
    /// Cluster IPs whose other ports are rejected.
    pub cluster_ip_markers: usize,
}

pub fn services(
    tables: &ServiceTables,
    naming: &Naming,
    only: Option<&BTreeSet<u32>>,
) -> ServicesReport {
    let mut slots: BTreeMap<(IpAddr, u16, u8, u8), BTreeMap<u16, BackendId>> = BTreeMap::new();
    for (k, v) in tables.entries.iter().filter(|(k, _)| k.slot != 0) {
        slots
            .entry((k.addr, k.port_be, k.proto, k.scope))
            .or_default()
            .insert(k.slot, v.backend_id);
    }
    let mut markers = 0;
    let mut frontends = Vec::new();
    for (k, v) in tables.entries.iter().filter(|(k, _)| k.slot == 0) {
        if v.has(flags::CLUSTER_IP_MARKER) {
            markers += 1;
            continue;
        }
        if only.is_some_and(|ids| !ids.contains(&v.service_id)) {
            continue;
        }
        let named = naming.service(v.service_id);
        let own_slots = slots.get(&(k.addr, k.port_be, k.proto, k.scope));
        let backends = (1..=v.count)
            .map(|slot| {
                let id = own_slots.and_then(|s| s.get(&slot)).copied().unwrap_or(0);
                BackendView::new(id, tables.backends.get(&id), naming)
            })
            .collect();
        frontends.push(FrontendView {
            address: k.addr.to_string(),
            port: u16::from_be(k.port_be),
            protocol: protocol_name(k.proto),
            kind: v.kind().name(),
            scope: if k.scope == Scope::ClusterWide as u8 {
                "cluster_wide"
            } else {
                "primary"
            },
            service_id: v.service_id,
            service: named.map(|s| s.port_name()),
            internal_traffic_policy: named.map(|s| s.internal_traffic_policy.clone()),
            external_traffic_policy: named.map(|s| s.external_traffic_policy.clone()),
            session_affinity: named.map(|s| s.session_affinity.clone()),
            external: v.has(flags::EXTERNAL),
            policy_local: v.has(flags::POLICY_LOCAL),
            source_ranges: v.has(flags::SOURCE_RANGES),
            reject_when_empty: v.has(flags::REJECT_WHEN_EMPTY),
            host_only: v.has(flags::HOST_ONLY),
            maglev_table_size: v
                .has(flags::MAGLEV)
                .then(|| {
                    let at = FrontendKey {
                        slot: MAGLEV_SLOT,
                        ..*k
                    };
                    tables
                        .entries
                        .iter()
                        .find(|(key, _)| *key == at)
                        .map(|(_, r)| r.maglev_table().1)
                })
                .flatten(),
            backends,
        });
    }
    frontends.sort_by(|a, b| {
        (
            &a.service,
            a.service_id,
            a.kind,
            &a.address,
            a.port,
            a.scope,
        )
            .cmp(&(
                &b.service,
                b.service_id,
                b.kind,
                &b.address,
                b.port,
                b.scope,
            ))
    });
    ServicesReport {
        names: naming.status.clone(),
        frontends,
        cluster_ip_markers: markers,
    }
}

impl ServicesReport {
    pub fn text(&self) -> String {
        let mut t = Table::new(&["SERVICE", "KIND", "FRONTEND", "POLICY", "BACKENDS"]);
        for f in &self.frontends {
            let service = f
                .service
                .clone()
                .unwrap_or_else(|| format!("id {}", f.service_id));
            let policy = match (
                f.kind,
                &f.internal_traffic_policy,
                &f.external_traffic_policy,
            ) {
                ("ClusterIP", Some(itp), _) => format!("internal={itp}"),
                (_, _, Some(etp)) if f.external => format!("external={etp}"),
                _ if f.policy_local => "local".into(),
                _ => "-".into(),
            };
            let mut kind = f.kind.to_owned();
            if f.scope == "cluster_wide" {
                kind.push_str(" (for local pods)");
            }
            if let Some(m) = f.maglev_table_size {
                kind.push_str(&format!(" maglev/{m}"));
            }
            let backends = if f.backends.is_empty() {
                if f.reject_when_empty {
                    "none: rejected"
                } else {
                    "none: dropped"
                }
                .to_owned()
            } else {
                f.backends
                    .iter()
                    .map(|b| format!("{}:{}", b.address, b.port))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            t.row(vec![
                service,
                kind,
                format!("{}:{}/{}", f.address, f.port, f.protocol),
                policy,
                backends,
            ]);
        }
        format!(
            "{}{} frontends, {} cluster IP markers\n{}",
            naming_line(&self.names),
            self.frontends.len(),
            self.cluster_ip_markers,
            t.render()
        )
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct BackendsReport {
    pub names: super::names::NamesStatus,
    pub backends: Vec<BackendView>,
}

pub fn backends(
    tables: &ServiceTables,
    naming: &Naming,
    only: Option<&EndpointFilter>,
) -> BackendsReport {
    let backends = tables
        .backends
        .iter()
        .filter(|(_, b)| only.is_none_or(|f| f.matches(b.addr, u16::from_be(b.port_be))))
        .map(|(id, b)| BackendView::new(*id, Some(b), naming))
        .collect();
    BackendsReport {
        names: naming.status.clone(),
        backends,
    }
}

impl BackendsReport {
    pub fn text(&self) -> String {
        let mut t = Table::new(&["ID", "ENDPOINT", "NODE", "STATE", "LOCAL"]);
        for b in &self.backends {
            let local = match (b.local, b.host_local) {
                (_, true) => "host",
                (Some(true), _) => "yes",
                (Some(false), _) => "no",
                (None, _) => "-",
            };
            t.row(vec![
                b.backend_id.to_string(),
                format!("{}:{}/{}", b.address, b.port, b.protocol),
                b.node.clone().unwrap_or_else(|| "-".into()),
                b.state(),
                local.into(),
            ]);
        }
        format!(
            "{}{} backends\n{}",
            naming_line(&self.names),
            self.backends.len(),
            t.render()
        )
    }
}

pub fn naming_line(status: &super::names::NamesStatus) -> String {
    match &status.note {
        Some(note) => format!("names: {note}\n"),
        None => format!("names: {}\n", status.file),
    }
}
