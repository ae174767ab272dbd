//! The service maps as the programmer sees them: real aya maps, or a fake in tests.

use aya::maps::{HashMap, MapData};
use proxy_common::{Backend, BackendId, CtKey, CtValue, ServiceKey, ServiceValue};

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("writing {map} failed: {source}")]
    Write {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("too many backends ({count}): a frontend addresses at most 65535 slots")]
    TooManyBackends { count: usize },
    #[error("more than 65535 service ports: no service id left")]
    TooManyServices,
}

pub trait ServiceMaps {
    fn put_backend(&mut self, id: BackendId, backend: &Backend) -> Result<(), MapError>;
    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError>;
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError>;
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError>;
    /// Deletes every conntrack entry matching `matches`, returning how many.
    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError>;
}

/// The kernel maps of a loaded datapath.
pub struct KernelMaps {
    pub services: HashMap<MapData, ServiceKey, ServiceValue>,
    pub backends: HashMap<MapData, BackendId, Backend>,
    pub conntrack: HashMap<MapData, CtKey, CtValue>,
}

fn write_error(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> MapError {
    move |source| MapError::Write { map, source }
}

/// Deleting an entry that is already gone is success: the goal state holds.
fn ignore_missing(result: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}

impl ServiceMaps for KernelMaps {
    fn put_backend(&mut self, id: BackendId, backend: &Backend) -> Result<(), MapError> {
        self.backends
            .insert(id, backend, 0)
            .map_err(write_error(proxy_common::maps::BACKENDS))
    }

    fn delete_backend(&mut self, id: BackendId) -> Result<(), MapError> {
        ignore_missing(self.backends.remove(&id)).map_err(write_error(proxy_common::maps::BACKENDS))
    }

    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services
            .insert(key, value, 0)
            .map_err(write_error(proxy_common::maps::SERVICES))
    }

    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        ignore_missing(self.services.remove(key)).map_err(write_error(proxy_common::maps::SERVICES))
    }

    fn flush_flows(
        &mut self,
        matches: &dyn Fn(&CtKey, &CtValue) -> bool,
    ) -> Result<usize, MapError> {
        let doomed: Vec<CtKey> = self
            .conntrack
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| matches(k, v))
            .map(|(k, _)| k)
            .collect();
        for key in &doomed {
            ignore_missing(self.conntrack.remove(key))
                .map_err(write_error(proxy_common::maps::CONNTRACK))?;
        }
        Ok(doomed.len())
    }
}
