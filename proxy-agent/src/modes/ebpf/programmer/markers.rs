use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use proxy_common::{ServiceKeyOf, ServiceValue, service::flags};

use super::{SyncStats, small_set::SmallSet};
use crate::modes::ebpf::{
    family::AgentFamily,
    maps::{MapError, ServiceMaps},
};

/// The [`ServiceKeyOf::cluster_ip`] markers: one per cluster IP while any
/// service port on it is programmed (several ports share one VIP).
#[derive(Debug)]
pub(super) struct ClusterIpMarkers<F: AgentFamily> {
    /// VIP -> the ClusterIP frontends on it.
    users: HashMap<F::Addr, SmallSet<ServiceKeyOf<F>>>,
    written: HashSet<F::Addr>,
    /// Markers found in adopted maps that no frontend uses: deleted by the next sync.
    unused: Vec<F::Addr>,
}

impl<F: AgentFamily> Default for ClusterIpMarkers<F> {
    fn default() -> Self {
        ClusterIpMarkers {
            users: HashMap::new(),
            written: HashSet::new(),
            unused: Vec::new(),
        }
    }
}

impl<F: AgentFamily> ClusterIpMarkers<F> {
    /// Markers written.
    pub(super) fn len(&self) -> usize {
        self.written.len()
    }

    pub(super) fn has(&self, vip: F::Addr) -> bool {
        self.written.contains(&vip)
    }

    /// A marker found in adopted maps.
    pub(super) fn adopt_written(&mut self, vip: F::Addr) {
        self.written.insert(vip);
    }

    /// A ClusterIP frontend found in adopted maps.
    pub(super) fn adopt_user(&mut self, frontend: ServiceKeyOf<F>) {
        self.users
            .entry(frontend.addr_be)
            .or_default()
            .insert(frontend);
    }

    /// After adoption: remembers the markers nothing uses.
    pub(super) fn note_unused(&mut self) {
        self.unused = self
            .written
            .iter()
            .filter(|vip| !self.users.contains_key(vip))
            .copied()
            .collect();
    }

    /// Deletes the unused markers adoption found.
    pub(super) fn delete_unused(
        &mut self,
        maps: &mut impl ServiceMaps<F>,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        while let Some(vip) = self.unused.last().copied() {
            if !self.users.contains_key(&vip) && self.written.contains(&vip) {
                maps.delete_service(&ServiceKeyOf::<F>::cluster_ip(vip))?;
                stats.deletes += 1;
                self.written.remove(&vip);
            }
            self.unused.pop();
        }
        Ok(())
    }

    pub(super) fn add(
        &mut self,
        frontend: ServiceKeyOf<F>,
        maps: &mut impl ServiceMaps<F>,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        let vip = frontend.addr_be;
        self.users.entry(vip).or_default().insert(frontend);
        if !self.written.contains(&vip) {
            maps.put_service(
                &ServiceKeyOf::<F>::cluster_ip(vip),
                &ServiceValue::frontend(0, 0, flags::CLUSTER_IP_MARKER),
            )?;
            stats.writes += 1;
            self.written.insert(vip);
        }
        Ok(())
    }

    /// Forgets `frontend` (a no-op unless it was added); deletes the marker with the last one.
    pub(super) fn remove(
        &mut self,
        frontend: ServiceKeyOf<F>,
        maps: &mut impl ServiceMaps<F>,
        stats: &mut SyncStats,
    ) -> Result<(), MapError> {
        let vip = frontend.addr_be;
        let Some(users) = self.users.get(&vip) else {
            return Ok(());
        };
        if !users.contains(&frontend) {
            return Ok(());
        }
        if users.len() == 1 && self.written.contains(&vip) {
            maps.delete_service(&ServiceKeyOf::<F>::cluster_ip(vip))?;
            stats.deletes += 1;
            self.written.remove(&vip);
        }
        if let Some(users) = self.users.get_mut(&vip) {
            users.remove(&frontend);
            if users.is_empty() {
                self.users.remove(&vip);
            }
        }
        Ok(())
    }
}
