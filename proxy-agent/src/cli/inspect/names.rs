//! The names of the maps' ids, from the file the agent publishes, checked
//! against what the maps hold: a missing or stale file degrades to ids,
//! and the reports say so.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
};

use serde::Serialize;

use super::services::BackendEntry;
use crate::modes::ebpf::introspect::names::{
    PublishedBackend, PublishedNames, PublishedService, names_path, read_names,
};

/// Whether names could be given, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NamesStatus {
    /// `current`, `stale` (some ids of the maps are not in the file, or name
    /// something else), `missing` or `unreadable`.
    pub state: &'static str,
    pub file: String,
    pub written_unix_ms: Option<u64>,
    pub note: Option<String>,
}

pub struct Naming {
    pub status: NamesStatus,
    services: HashMap<u32, PublishedService>,
    backends: HashMap<u32, PublishedBackend>,
}

impl Naming {
    /// Reads the file of `state_dir` and checks it against the service ids
    /// and backends the maps hold.
    pub fn load(
        state_dir: &Path,
        service_ids: &BTreeSet<u32>,
        backends: &BTreeMap<u32, BackendEntry>,
    ) -> Self {
        let file = names_path(state_dir).display().to_string();
        let published = match read_names(state_dir) {
            Ok(Some(names)) => names,
            Ok(None) => {
                return Self::without(NamesStatus {
                    state: "missing",
                    note: Some(format!(
                        "no {file}: showing ids only (is the agent's --ebpf-state-dir elsewhere? pass it as --state-dir)"
                    )),
                    file,
                    written_unix_ms: None,
                });
            }
            Err(e) => {
                return Self::without(NamesStatus {
                    state: "unreadable",
                    note: Some(format!("{e}: showing ids only")),
                    file,
                    written_unix_ms: None,
                });
            }
        };
        let naming = Self::from_published(published, file);
        naming.checked(service_ids, backends)
    }

    fn without(status: NamesStatus) -> Self {
        Naming {
            status,
            services: HashMap::new(),
            backends: HashMap::new(),
        }
    }

    fn from_published(published: PublishedNames, file: String) -> Self {
        Naming {
            status: NamesStatus {
                state: "current",
                file,
                written_unix_ms: Some(published.written_unix_ms),
                note: None,
            },
            services: published.services.into_iter().map(|s| (s.id, s)).collect(),
            backends: published.backends.into_iter().map(|b| (b.id, b)).collect(),
        }
    }

    /// Drops the backend names that no longer match the map, and marks the
    /// file stale when the maps hold ids it does not know.
    fn checked(
        mut self,
        service_ids: &BTreeSet<u32>,
        backends: &BTreeMap<u32, BackendEntry>,
    ) -> Self {
        let unknown_services = service_ids
            .iter()
            .filter(|id| !self.services.contains_key(id))
            .count();
        self.backends
            .retain(|id, b| backends.get(id).is_none_or(|m| describes(b, m)));
        let unknown_backends = backends
            .keys()
            .filter(|id| !self.backends.contains_key(id))
            .count();
        if unknown_services + unknown_backends > 0 {
            self.status.state = "stale";
            self.status.note = Some(format!(
                "{} is older than the maps ({unknown_services} service ids and {unknown_backends} \
                 backend ids unknown): those show as ids",
                self.status.file
            ));
        }
        self
    }

    pub fn service(&self, id: u32) -> Option<&PublishedService> {
        self.services.get(&id)
    }

    pub fn backend(&self, id: u32) -> Option<&PublishedBackend> {
        self.backends.get(&id)
    }

    /// The ids of the service ports `pred` accepts.
    pub fn service_ids_where(&self, pred: impl Fn(&PublishedService) -> bool) -> BTreeSet<u32> {
        self.services
            .values()
            .filter(|s| pred(s))
            .map(|s| s.id)
            .collect()
    }
}

fn describes(published: &PublishedBackend, backend: &BackendEntry) -> bool {
    published.address == backend.addr.to_string() && published.port == u16::from_be(backend.port_be)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> PublishedNames {
        PublishedNames {
            services: vec![PublishedService {
                id: 1,
                namespace: "e2e".into(),
                name: "web".into(),
                ..Default::default()
            }],
            backends: vec![PublishedBackend {
                id: 7,
                address: "198.18.2.10".into(),
                port: 8080,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn backend(ip: [u8; 4], port: u16) -> BackendEntry {
        BackendEntry {
            addr: std::net::Ipv4Addr::from(ip).into(),
            port_be: port.to_be(),
            proto: 6,
            flags: 0,
        }
    }

    #[test]
    fn a_file_naming_every_id_is_current() {
        let n = Naming::from_published(published(), "f".into()).checked(
            &BTreeSet::from([1]),
            &BTreeMap::from([(7, backend([198, 18, 2, 10], 8080))]),
        );
        assert_eq!(n.status.state, "current");
        assert_eq!(n.service(1).unwrap().name, "web");
        assert!(n.backend(7).is_some());
    }

    #[test]
    fn ids_the_file_does_not_know_or_names_otherwise_make_it_stale() {
        let n = Naming::from_published(published(), "f".into()).checked(
            &BTreeSet::from([1, 2]),
            &BTreeMap::from([(7, backend([198, 18, 2, 11], 8080))]),
        );
        assert_eq!(n.status.state, "stale");
        assert!(n.backend(7).is_none(), "a reused id is not misnamed");
        assert!(
            n.status
                .note
                .unwrap()
                .contains("1 service ids and 1 backend ids")
        );
    }
}
