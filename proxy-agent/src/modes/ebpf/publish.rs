//! Publishes, after each successful sync, what the maps' service and
//! backend ids stand for ([`introspect::names`]), in the state directory
//! (`pinning.stateDir`). A directory that cannot be written costs one
//! warning; the datapath keeps serving.

use std::{
    collections::HashMap,
    net::IpAddr,
    path::PathBuf,
    time::{SystemTime, UNIX_EPOCH},
};

use proxy_common::{ABI_VERSION, V4, V6};
use tracing::{info, warn};

use super::{
    Programmer,
    family::AgentFamily,
    introspect::names::{
        NAMES_FORMAT, PublishedBackend, PublishedNames, PublishedService, write_names,
    },
};
use crate::model::{DesiredService, DesiredState, Endpoint, ServicePortName, SessionAffinity};

/// Writes the names file of one agent, on a thread of its own: at 50,000
/// services the file is megabytes of JSON, and the sync that changed the
/// maps (already written) should not wait for it. Only the newest names
/// are written when several are waiting.
#[derive(Debug)]
pub struct NamesPublisher {
    node: String,
    pin_root: String,
    writer: std::sync::mpsc::Sender<PublishedNames>,
}

impl NamesPublisher {
    pub fn new(dir: PathBuf, node: String, pin_root: String) -> Self {
        let (writer, pending) = std::sync::mpsc::channel::<PublishedNames>();
        std::thread::Builder::new()
            .name("names-writer".into())
            .spawn(move || write_loop(&dir, &pending))
            .expect("spawning the names writer thread");
        Self {
            node,
            pin_root,
            writer,
        }
    }

    pub fn publish(&mut self, programmer: &Programmer, desired: &DesiredState) {
        let names = published_names(programmer, desired, &self.node, &self.pin_root);
        // The writer ends only with the process.
        let _ = self.writer.send(names);
    }
}

fn write_loop(dir: &std::path::Path, pending: &std::sync::mpsc::Receiver<PublishedNames>) {
    // Whether the last write failed (warned once until one succeeds).
    let mut failing = false;
    while let Ok(mut names) = pending.recv() {
        while let Ok(newer) = pending.try_recv() {
            names = newer;
        }
        let written = write_names(dir, &names);
        drop(names);
        // Megabytes of JSON and names at 50,000 services, in this thread's arena.
        crate::memory::release_freed();
        match written {
            Ok(()) if failing => {
                failing = false;
                info!(state_dir = %dir.display(), "publishing the datapath's names works again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                warn!(
                    state_dir = %dir.display(),
                    error = %e,
                    "cannot publish the datapath's names (`proxy-agent inspect` shows ids only); \
                     the datapath is not affected"
                );
            }
            Err(_) => {}
        }
    }
}

/// What every id of `programmer` stands for, with the endpoints' state from `desired`.
pub fn published_names(
    programmer: &Programmer,
    desired: &DesiredState,
    node: &str,
    pin_root: &str,
) -> PublishedNames {
    let policy = |local: bool| if local { "Local" } else { "Cluster" }.to_owned();
    // By hash: a BTreeMap lookup per id compared names byte by byte (most of
    // the 130 ms this took at 50,000 services).
    let by_name: HashMap<&ServicePortName, &DesiredService> = desired.services.iter().collect();
    let mut services: Vec<PublishedService> = programmer
        .service_ids()
        .map(|(name, id)| {
            let svc = by_name.get(name).copied();
            PublishedService {
                id,
                namespace: name.namespace.to_string(),
                name: name.name.to_string(),
                port_name: name.port_name.to_string(),
                protocol: name.protocol.to_string(),
                internal_traffic_policy: policy(svc.is_some_and(|s| s.internal_policy_local)),
                external_traffic_policy: policy(svc.is_some_and(|s| s.external_policy_local)),
                session_affinity: match svc.map(|s| &s.session_affinity) {
                    Some(SessionAffinity::ClientIp { .. }) => "ClientIP",
                    _ => "None",
                }
                .to_owned(),
            }
        })
        .collect();
    services.sort_by_key(|s| s.id);

    let mut endpoints: HashMap<(IpAddr, u16, u8), &Endpoint> = HashMap::new();
    for svc in desired.services.values() {
        let proto = svc.name.protocol.ip_proto();
        for ep in svc.cluster_endpoints.iter().chain(&svc.local_endpoints) {
            endpoints.entry((ep.ip, ep.port, proto)).or_insert(ep);
        }
    }
    let v4 = programmer
        .v4
        .backend_ids()
        .map(|(id, b)| (id, IpAddr::from(V4::from_be(b.addr_be)), b.port_be, b.proto));
    let v6 = programmer
        .v6
        .backend_ids()
        .map(|(id, b)| (id, IpAddr::from(V6::from_be(b.addr_be)), b.port_be, b.proto));
    let mut backends: Vec<PublishedBackend> = v4
        .chain(v6)
        .map(|(id, address, port_be, proto)| {
            let port = u16::from_be(port_be);
            let ep = endpoints.get(&(address, port, proto));
            PublishedBackend {
                id,
                address: address.to_string(),
                port,
                protocol: protocol_name(proto).to_owned(),
                node: ep.and_then(|e| e.node_name.as_deref()).map(str::to_owned),
                ready: ep.is_some_and(|e| e.ready),
                serving: ep.is_some_and(|e| e.serving),
                terminating: ep.is_some_and(|e| e.terminating),
                local: ep.is_some_and(|e| e.is_local),
            }
        })
        .collect();
    backends.sort_by_key(|b| b.id);

    PublishedNames {
        format: NAMES_FORMAT,
        abi: ABI_VERSION,
        node: node.to_owned(),
        pin_root: pin_root.to_owned(),
        written_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        services,
        backends,
    }
}

/// The name of an IP protocol number as Kubernetes spells it.
pub fn protocol_name(proto: u8) -> &'static str {
    match proto {
        proxy_common::proto::TCP => "TCP",
        proxy_common::proto::UDP => "UDP",
        proxy_common::proto::SCTP => "SCTP",
        proxy_common::proto::ICMP => "ICMP",
        _ => "other",
    }
}
