//! Publishes, after each successful sync, what the maps' service and
//! backend ids stand for ([`introspect::names`]), in the state directory
//! (`pinning.stateDir`). A directory that cannot be written costs one
//! warning; the datapath keeps serving.

use std::{
    net::IpAddr,
    path::PathBuf,
    time::{SystemTime, UNIX_EPOCH},
};

use foldhash::{HashMap, HashMapExt};

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

/// Writes the names file of one agent, on a thread of its own. The sync
/// only takes a snapshot of the ids and names (copies of ids and shared
/// names, a few milliseconds at 50,000 services); turning it into megabytes
/// of JSON (about 100 ms there) would hold the next sync back. Only the
/// newest snapshot is written when several are waiting.
#[derive(Debug)]
pub struct NamesPublisher {
    writer: std::sync::mpsc::Sender<NamesSnapshot>,
}

impl NamesPublisher {
    pub fn new(dir: PathBuf, node: String, pin_root: String) -> Self {
        let (writer, pending) = std::sync::mpsc::channel::<NamesSnapshot>();
        std::thread::Builder::new()
            .name("names-writer".into())
            .spawn(move || write_loop(&dir, &node, &pin_root, &pending))
            .expect("spawning the names writer thread");
        Self { writer }
    }

    pub fn publish(&mut self, programmer: &Programmer, desired: &DesiredState) {
        // The writer ends only with the process.
        let _ = self.writer.send(NamesSnapshot::take(programmer, desired));
    }
}

fn write_loop(
    dir: &std::path::Path,
    node: &str,
    pin_root: &str,
    pending: &std::sync::mpsc::Receiver<NamesSnapshot>,
) {
    yield_to_everything_else();
    // Whether the last write failed (warned once until one succeeds).
    let mut failing = false;
    while let Ok(mut snapshot) = pending.recv() {
        while let Ok(newer) = pending.try_recv() {
            snapshot = newer;
        }
        let names = snapshot.into_names(node, pin_root);
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

/// Runs this thread under SCHED_IDLE: turning names into JSON (about 100
/// ms of CPU at 50,000 services, after every sync that changed a service)
/// is bookkeeping, and must not take a CPU from the node's workloads, nor
/// from the syncs, when the node is busy. On a two-CPU node it delayed the
/// first connections after an endpoint change by milliseconds.
fn yield_to_everything_else() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "the names writer keeps its normal CPU priority"
        );
    }
}

/// What the names file is made of, as the sync leaves the programmer.
#[derive(Debug, Default)]
pub struct NamesSnapshot {
    written_unix_ms: u64,
    services: Vec<ServiceIdName>,
    backends: Vec<(u32, IpAddr, u16, u8)>,
    /// Every endpoint of every service, for the backends' state.
    /// (Endpoints are 32 bytes with a shared placement: cheap to copy.)
    endpoints: Vec<((IpAddr, u16, u8), Endpoint)>,
}

#[derive(Debug)]
struct ServiceIdName {
    id: u32,
    name: ServicePortName,
    internal_local: bool,
    external_local: bool,
    client_ip_affinity: bool,
}

impl NamesSnapshot {
    /// Walks the desired services once, looking their ids up in the
    /// programmer (ids of a service the desired state no longer has, which
    /// a sync does not leave behind, are still named).
    pub fn take(programmer: &Programmer, desired: &DesiredState) -> Self {
        let mut services = Vec::with_capacity(desired.services.len());
        // Sized at once: grown by doubling, the half-million endpoints of
        // 50,000 services were copied and faulted in again at every step.
        let mut endpoints = Vec::with_capacity(
            (desired.services.values())
                .map(|s| s.cluster_endpoints.len() + s.local_endpoints.len())
                .sum(),
        );
        for svc in desired.services.values() {
            for id in [
                programmer.v4.programmed_service_id(&svc.name),
                programmer.v6.programmed_service_id(&svc.name),
            ]
            .into_iter()
            .flatten()
            {
                services.push(ServiceIdName::of(id, svc.name.clone(), Some(svc)));
            }
            let proto = svc.name.protocol.ip_proto();
            for ep in svc.cluster_endpoints.iter().chain(&svc.local_endpoints) {
                endpoints.push(((ep.ip, ep.port, proto), ep.clone()));
            }
        }
        if services.len() != programmer.service_ids().count() {
            services.extend(
                programmer
                    .service_ids()
                    .filter(|(name, _)| !desired.services.contains_key(*name))
                    .map(|(name, id)| ServiceIdName::of(id, name.clone(), None)),
            );
        }
        let v4 = programmer
            .v4
            .backend_ids()
            .map(|(id, b)| (id, IpAddr::from(V4::from_be(b.addr_be)), b.port_be, b.proto));
        let v6 = programmer
            .v6
            .backend_ids()
            .map(|(id, b)| (id, IpAddr::from(V6::from_be(b.addr_be)), b.port_be, b.proto));
        NamesSnapshot {
            written_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            services,
            backends: v4.chain(v6).collect(),
            endpoints,
        }
    }

    /// The file's content: services and backends by id, each backend with
    /// the state of the first endpoint found at its address, port and protocol.
    pub fn into_names(self, node: &str, pin_root: &str) -> PublishedNames {
        let policy = |local: bool| if local { "Local" } else { "Cluster" }.to_owned();
        let mut services: Vec<PublishedService> = self
            .services
            .into_iter()
            .map(|s| PublishedService {
                id: s.id,
                namespace: s.name.namespace.to_string(),
                name: s.name.name.to_string(),
                port_name: s.name.port_name.to_string(),
                protocol: s.name.protocol.to_string(),
                internal_traffic_policy: policy(s.internal_local),
                external_traffic_policy: policy(s.external_local),
                session_affinity: if s.client_ip_affinity {
                    "ClientIP"
                } else {
                    "None"
                }
                .to_owned(),
            })
            .collect();
        services.sort_by_key(|s| s.id);

        let mut endpoints: HashMap<(IpAddr, u16, u8), Endpoint> =
            HashMap::with_capacity(self.endpoints.len());
        for (key, state) in self.endpoints {
            endpoints.entry(key).or_insert(state);
        }
        let mut backends: Vec<PublishedBackend> = self
            .backends
            .into_iter()
            .map(|(id, address, port_be, proto)| {
                let port = u16::from_be(port_be);
                let ep = endpoints.get(&(address, port, proto));
                PublishedBackend {
                    id,
                    address: address.to_string(),
                    port,
                    protocol: protocol_name(proto).to_owned(),
                    node: ep.and_then(|e| e.node_name()).map(str::to_owned),
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
            written_unix_ms: self.written_unix_ms,
            services,
            backends,
        }
    }
}

impl ServiceIdName {
    fn of(id: u32, name: ServicePortName, svc: Option<&DesiredService>) -> Self {
        ServiceIdName {
            id,
            name,
            internal_local: svc.is_some_and(|s| s.internal_policy_local),
            external_local: svc.is_some_and(|s| s.external_policy_local),
            client_ip_affinity: svc
                .is_some_and(|s| matches!(s.session_affinity, SessionAffinity::ClientIp { .. })),
        }
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

#[cfg(test)]
mod tests {
    use super::yield_to_everything_else;

    /// The names writer runs under SCHED_IDLE, and only it: the thread that
    /// spawned it keeps its policy.
    #[test]
    fn the_names_writer_thread_runs_at_idle_priority() {
        // SAFETY: pid 0 is the calling thread.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let writer = std::thread::spawn(move || {
            yield_to_everything_else();
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(writer, libc::SCHED_IDLE);
        assert_eq!(policy(), before);
    }
}
