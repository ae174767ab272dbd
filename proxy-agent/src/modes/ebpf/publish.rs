//! Publishes, after each successful sync, what the maps' service and
//! backend ids stand for ([`introspect::names`]), in the state directory
//! (`pinning.stateDir`). A directory that cannot be written costs one
//! warning; the datapath keeps serving.

use std::{
    net::IpAddr,
    path::PathBuf,
    time::{SystemTime, UNIX_EPOCH},
};

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet};

use proxy_common::{ABI_VERSION, BackendId, V4, V6};
use tracing::{info, warn};

use super::{
    Programmer,
    family::AgentFamily,
    introspect::names::{
        NAMES_FORMAT, PublishedBackend, PublishedNames, PublishedService, write_names,
    },
    programmer::Touched,
};
use crate::{
    model::{DesiredService, DesiredState, Endpoint, ServicePortName, SessionAffinity},
    sync::SyncChanges,
};

/// Writes the names file of one agent, on a thread of its own. After a
/// full sync the sync hands it every service port's ids and endpoints;
/// after a partial one only the ports and backends that changed since the
/// last publication (at 50,000 services a whole copy took about 40 ms of
/// the sync thread). The writer keeps the whole picture and turns it into
/// megabytes of JSON (about 100 ms there), which would hold the next sync
/// back. Only the newest picture is written when several updates are waiting.
#[derive(Debug)]
pub struct NamesPublisher {
    writer: std::sync::mpsc::Sender<NamesUpdate>,
    pending: PendingNames,
}

impl NamesPublisher {
    pub fn new(dir: PathBuf, node: String, pin_root: String) -> Self {
        let (writer, pending) = std::sync::mpsc::channel::<NamesUpdate>();
        std::thread::Builder::new()
            .name("names-writer".into())
            .spawn(move || write_loop(&dir, &node, &pin_root, &pending))
            .expect("spawning the names writer thread");
        Self {
            writer,
            pending: PendingNames::default(),
        }
    }

    /// See [`PendingNames::note`].
    pub fn note(&mut self, changes: &SyncChanges, touched: Touched) {
        self.pending.note(changes, touched);
    }

    /// The programmer was replaced or rebuilt from the maps: its ids are
    /// published whole next time.
    pub fn start_over(&mut self) {
        self.pending = PendingNames::default();
    }

    /// Whether anything changed since the last publication.
    pub fn has_news(&self) -> bool {
        self.pending.has_news()
    }

    pub fn publish(&mut self, programmer: &Programmer, desired: &DesiredState) {
        let started = std::time::Instant::now();
        let update = self.pending.take_update(programmer, desired);
        tracing::debug!(
            whole = update.whole,
            ports = update.ports.len(),
            backends = update.backends.len(),
            took = ?started.elapsed(),
            "names update handed to the writer"
        );
        // The writer ends only with the process.
        let _ = self.writer.send(update);
    }
}

/// What the next update must carry.
#[derive(Debug)]
struct PendingNames {
    /// Everything: none sent yet, a full sync, or a programmer whose ids
    /// the writer has not seen.
    whole: bool,
    /// Service ports changed since the last update.
    ports: BTreeSet<ServicePortName>,
    /// Backends added or deleted since the last update.
    backends: HashSet<BackendId>,
}

impl Default for PendingNames {
    fn default() -> Self {
        PendingNames {
            whole: true,
            ports: BTreeSet::new(),
            backends: HashSet::default(),
        }
    }
}

impl PendingNames {
    /// What a successful sync changed: the ports it synced, and those whose
    /// ids and the backends whose ids the programmer gave or took back.
    fn note(&mut self, changes: &SyncChanges, touched: Touched) {
        if changes.full {
            *self = PendingNames::default();
        }
        if !self.whole {
            self.ports.extend(changes.changed.iter().cloned());
            self.ports.extend(touched.ports);
            self.backends.extend(touched.backends);
        }
    }

    fn has_news(&self) -> bool {
        self.whole || !self.ports.is_empty() || !self.backends.is_empty()
    }

    fn take_update(&mut self, programmer: &Programmer, desired: &DesiredState) -> NamesUpdate {
        let pending = std::mem::replace(
            self,
            PendingNames {
                whole: false,
                ..PendingNames::default()
            },
        );
        if pending.whole {
            NamesUpdate::whole(programmer, desired)
        } else {
            NamesUpdate::changes(programmer, desired, &pending.ports, &pending.backends)
        }
    }
}

fn write_loop(
    dir: &std::path::Path,
    node: &str,
    pin_root: &str,
    pending: &std::sync::mpsc::Receiver<NamesUpdate>,
) {
    yield_to_everything_else();
    let mut state = NamesState::default();
    // Whether the last write failed (warned once until one succeeds).
    let mut failing = false;
    while let Ok(update) = pending.recv() {
        state.apply(update);
        while let Ok(newer) = pending.try_recv() {
            state.apply(newer);
        }
        let names = state.names(node, pin_root);
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

/// A backend's address, port and IP protocol.
type BackendAddr = (IpAddr, u16, u8);

/// What the sync hands the writer: every port and backend (`whole`), or
/// those that changed. A port with nothing to name is gone; so is a
/// backend without an address.
#[derive(Debug, Default)]
struct NamesUpdate {
    whole: bool,
    written_unix_ms: u64,
    ports: Vec<(ServicePortName, PortNames)>,
    backends: Vec<(BackendId, Option<BackendAddr>)>,
}

/// What one service port contributes to the names file.
#[derive(Debug, Default, PartialEq)]
struct PortNames {
    /// Its id in each family it is programmed in.
    ids: Vec<ServiceIdName>,
    /// Its IP protocol and endpoints, for the backends' state. (Endpoints
    /// are 32 bytes with a shared placement: cheap to copy. The writer keeps
    /// them, about 16 MB at 50,000 services x 10 endpoints.)
    proto: u8,
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, PartialEq)]
struct ServiceIdName {
    id: u32,
    internal_local: bool,
    external_local: bool,
    client_ip_affinity: bool,
}

impl NamesUpdate {
    /// Every port of the desired state, and every port and backend the
    /// programmer holds (ids of a port the desired state no longer has,
    /// which a sync does not leave behind, are still named).
    fn whole(programmer: &Programmer, desired: &DesiredState) -> Self {
        let mut ports = Vec::with_capacity(desired.services.len());
        for svc in desired.services.values() {
            ports.push((
                svc.name.clone(),
                PortNames::of(programmer, &svc.name, Some(svc)),
            ));
        }
        let named: usize = ports.iter().map(|(_, p)| p.ids.len()).sum();
        if named != programmer.service_ids().count() {
            let leftover: BTreeSet<&ServicePortName> = programmer
                .service_ids()
                .map(|(name, _)| name)
                .filter(|name| !desired.services.contains_key(*name))
                .collect();
            ports.extend(
                leftover
                    .into_iter()
                    .map(|name| (name.clone(), PortNames::of(programmer, name, None))),
            );
        }
        let v4 = programmer
            .v4
            .backend_ids()
            .map(|(id, b)| (id, Some(backend_addr::<V4>(b))));
        let v6 = programmer
            .v6
            .backend_ids()
            .map(|(id, b)| (id, Some(backend_addr::<V6>(b))));
        NamesUpdate {
            whole: true,
            written_unix_ms: now_unix_ms(),
            ports,
            backends: v4.chain(v6).collect(),
        }
    }

    /// The ports and backends named, as they are now.
    fn changes(
        programmer: &Programmer,
        desired: &DesiredState,
        ports: &BTreeSet<ServicePortName>,
        backends: &HashSet<BackendId>,
    ) -> Self {
        let ports = ports
            .iter()
            .map(|name| {
                let names = PortNames::of(programmer, name, desired.services.get(name));
                (name.clone(), names)
            })
            .collect();
        let backends = backends
            .iter()
            .map(|&id| {
                let addr = (programmer.v4.backend(id).map(backend_addr::<V4>))
                    .or_else(|| programmer.v6.backend(id).map(backend_addr::<V6>));
                (id, addr)
            })
            .collect();
        NamesUpdate {
            whole: false,
            written_unix_ms: now_unix_ms(),
            ports,
            backends,
        }
    }
}

impl PortNames {
    fn of(programmer: &Programmer, name: &ServicePortName, svc: Option<&DesiredService>) -> Self {
        let ids = [
            programmer.v4.programmed_service_id(name),
            programmer.v6.programmed_service_id(name),
        ]
        .into_iter()
        .flatten()
        .map(|id| ServiceIdName::of(id, svc))
        .collect();
        let endpoints = svc.map_or_else(Vec::new, |svc| {
            (svc.cluster_endpoints.iter().chain(&svc.local_endpoints))
                .cloned()
                .collect()
        });
        PortNames {
            ids,
            proto: name.protocol.ip_proto(),
            endpoints,
        }
    }

    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.endpoints.is_empty()
    }
}

fn backend_addr<F: AgentFamily>(b: &proxy_common::BackendOf<F>) -> BackendAddr {
    (F::from_be(b.addr_be).into(), b.port_be, b.proto)
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The writer's picture of the names, kept up to date by the updates.
#[derive(Debug, Default)]
struct NamesState {
    written_unix_ms: u64,
    /// In name order, as the desired state's: a backend takes the state of
    /// the first endpoint found at its address, port and protocol.
    ports: BTreeMap<ServicePortName, PortNames>,
    backends: HashMap<BackendId, BackendAddr>,
}

impl NamesState {
    fn apply(&mut self, update: NamesUpdate) {
        if update.whole {
            self.ports.clear();
            self.backends.clear();
        }
        self.written_unix_ms = update.written_unix_ms;
        for (name, port) in update.ports {
            if port.is_empty() {
                self.ports.remove(&name);
            } else {
                self.ports.insert(name, port);
            }
        }
        for (id, addr) in update.backends {
            match addr {
                Some(addr) => self.backends.insert(id, addr),
                None => self.backends.remove(&id),
            };
        }
    }

    /// The file's content: services and backends by id, each backend with
    /// the state of the first endpoint found at its address, port and protocol.
    fn names(&self, node: &str, pin_root: &str) -> PublishedNames {
        let policy = |local: bool| if local { "Local" } else { "Cluster" }.to_owned();
        let mut services: Vec<PublishedService> = (self.ports.iter())
            .flat_map(|(name, port)| port.ids.iter().map(move |s| (name, s)))
            .map(|(name, s)| PublishedService {
                id: s.id,
                namespace: name.namespace.to_string(),
                name: name.name.to_string(),
                port_name: name.port_name.to_string(),
                protocol: name.protocol.to_string(),
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

        let mut endpoints: HashMap<BackendAddr, &Endpoint> =
            HashMap::with_capacity(self.ports.values().map(|p| p.endpoints.len()).sum());
        for port in self.ports.values() {
            for ep in &port.endpoints {
                endpoints.entry((ep.ip, ep.port, port.proto)).or_insert(ep);
            }
        }
        let mut backends: Vec<PublishedBackend> = (self.backends.iter())
            .map(|(&id, &(address, port_be, proto))| {
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
    fn of(id: u32, svc: Option<&DesiredService>) -> Self {
        ServiceIdName {
            id,
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
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use proxy_common::{
        BackendId, BackendOf, CtKeyOf, CtValueOf, ServiceKeyOf, ServiceValue, maglev::MaglevChunk,
    };

    use super::{NamesState, PendingNames, yield_to_everything_else};
    use crate::model::{
        DesiredService, DesiredState, Endpoint, NamespacedName, Protocol, ServicePortName,
    };
    use crate::modes::ebpf::{
        MapError, Programmer, ServiceMaps, family::AgentFamily, programmer::Touched,
    };
    use crate::sync::SyncChanges;

    /// Maps that take every write: the programmer's ids are what is tested.
    struct AnyMaps;

    impl<F: AgentFamily> ServiceMaps<F> for AnyMaps {
        fn put_backend(&mut self, _: BackendId, _: &BackendOf<F>) -> Result<(), MapError> {
            Ok(())
        }
        fn delete_backend(&mut self, _: BackendId) -> Result<(), MapError> {
            Ok(())
        }
        fn put_service(&mut self, _: &ServiceKeyOf<F>, _: &ServiceValue) -> Result<(), MapError> {
            Ok(())
        }
        fn delete_service(&mut self, _: &ServiceKeyOf<F>) -> Result<(), MapError> {
            Ok(())
        }
        fn put_slots(&mut self, _: u32, _: &[BackendId]) -> Result<(), MapError> {
            Ok(())
        }
        fn put_source_range(&mut self, _: u32, _: F::Net) -> Result<(), MapError> {
            Ok(())
        }
        fn delete_source_range(&mut self, _: u32, _: F::Net) -> Result<(), MapError> {
            Ok(())
        }
        fn put_maglev(&mut self, _: u32, _: &MaglevChunk) -> Result<(), MapError> {
            Ok(())
        }
        fn flush_flows(
            &mut self,
            _: &dyn Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool,
        ) -> Result<usize, MapError> {
            Ok(0)
        }
        fn put_filter_word(&mut self, _: u32, _: u64) -> Result<(), MapError> {
            Ok(())
        }
    }

    fn port(name: &str) -> ServicePortName {
        ServicePortName::new(&NamespacedName::new("default", name), "", Protocol::Tcp)
    }

    fn service(name: &str, vips: &[&str], endpoints: &[&str]) -> DesiredService {
        DesiredService::cluster_ip(
            port(name),
            vips.iter().map(|v| v.parse().unwrap()).collect(),
            80,
            (endpoints.iter())
                .map(|e| Endpoint::new(e.parse::<IpAddr>().unwrap(), 8080))
                .collect(),
        )
    }

    fn state(services: Vec<DesiredService>) -> DesiredState {
        DesiredState {
            services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
            ..DesiredState::default()
        }
    }

    /// What the writer would publish after the updates taken so far.
    fn published(writer: &NamesState) -> super::PublishedNames {
        let mut names = writer.names("node-a", "/sys/fs/bpf/kube-proxy");
        names.written_unix_ms = 0;
        names
    }

    /// After a partial sync, the writer's picture updated with only what
    /// changed is the picture a whole copy gives: ids given and taken back,
    /// backends gone (with the ports that held them), a port gone, a family
    /// added to a port, and an endpoint's state.
    #[test]
    fn names_updated_with_the_changes_alone_are_the_whole_names() {
        let before = state(vec![
            service("web", &["198.18.0.10"], &["198.18.1.1", "198.18.1.2"]),
            service("db", &["198.18.0.11"], &["198.18.1.3"]),
            service("dual", &["198.18.0.12"], &["198.18.1.4"]),
            service("calm", &["198.18.0.13"], &["198.18.1.5"]),
        ]);
        let mut after = state(vec![
            service("web", &["198.18.0.10"], &["198.18.1.2", "198.18.1.9"]),
            service(
                "dual",
                &["198.18.0.12", "2001:db8::12"],
                &["198.18.1.4", "2001:db8:1::4"],
            ),
            service("new", &["2001:db8::20"], &["2001:db8:1::20"]),
            service("calm", &["198.18.0.13"], &["198.18.1.5"]),
        ]);
        let dual = after.services.get_mut(&port("dual")).unwrap();
        dual.cluster_endpoints[0].ready = false;
        let changed: BTreeSet<ServicePortName> =
            ["web", "db", "dual", "new"].into_iter().map(port).collect();

        let mut programmer = Programmer::new();
        let mut pending = PendingNames::default();
        let mut writer = NamesState::default();
        let full = SyncChanges {
            full: true,
            changed: BTreeSet::new(),
        };
        programmer.sync(&before, &mut AnyMaps).unwrap();
        pending.note(&full, programmer.take_touched());
        writer.apply(pending.take_update(&programmer, &before));
        assert!(!pending.has_news());

        programmer
            .sync_changed(&after, &changed, &mut AnyMaps)
            .unwrap();
        let partial = SyncChanges {
            full: false,
            changed,
        };
        pending.note(&partial, programmer.take_touched());
        let update = pending.take_update(&programmer, &after);
        assert!(!update.whole, "a partial sync sends its changes only");
        assert_eq!(update.ports.len(), 4, "{:?}", update.ports);
        writer.apply(update);

        let mut whole = NamesState::default();
        whole.apply(PendingNames::default().take_update(&programmer, &after));
        let got = published(&writer);
        assert_eq!(got, published(&whole));
        assert_eq!(got.services.len(), 5, "web, calm, dual twice, new");
        assert!(
            !got.backends
                .iter()
                .any(|b| b.address == "198.18.1.1" || b.address == "198.18.1.3"),
            "backends gone: {:?}",
            got.backends
        );
        let dual_v4 = got.backends.iter().find(|b| b.address == "198.18.1.4");
        assert!(dual_v4.is_some_and(|b| !b.ready), "{dual_v4:?}");
    }

    /// Ids the programmer gives or takes back outside the ports a sync
    /// names are published too; a full sync sends everything.
    #[test]
    fn touched_ids_are_published_and_a_full_sync_sends_everything() {
        let mut pending = PendingNames {
            whole: false,
            ..PendingNames::default()
        };
        let partial = SyncChanges {
            full: false,
            changed: BTreeSet::new(),
        };
        pending.note(&partial, Touched::default());
        assert!(!pending.has_news());
        pending.note(
            &partial,
            Touched {
                ports: vec![port("web")],
                backends: vec![7, 7],
            },
        );
        assert!(pending.has_news());
        assert_eq!(pending.ports.len(), 1);
        assert_eq!(pending.backends.len(), 1);
        let full = SyncChanges {
            full: true,
            changed: BTreeSet::new(),
        };
        pending.note(&full, Touched::default());
        assert!(pending.whole && pending.ports.is_empty() && pending.backends.is_empty());
    }

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
