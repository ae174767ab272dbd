use tracing::{debug, info};

use super::{
    EbpfNodeSettings, KernelMaps, MapError, NodeFacts, NodeProgrammer, Programmer, node_facts,
};
use crate::{
    model::{DesiredState, NodeModel},
    sync::{Proxier, SyncChanges},
};

/// The ebpf mode's [`Proxier`]: programs the service maps from the desired
/// state, and the node maps from the node model it carries.
pub struct EbpfProxier {
    maps: KernelMaps,
    programmer: Programmer,
    node_programmer: NodeProgrammer,
    settings: EbpfNodeSettings,
    /// `None` before the first sync of adopted maps.
    applied: Option<NodeFacts>,
    /// The maps were pinned by an earlier agent: the first sync takes them over.
    adopting: bool,
}

impl EbpfProxier {
    /// Writes the node facts of `node` right away, so the datapath knows the
    /// node before any program is attached.
    pub fn new(
        mut maps: KernelMaps,
        settings: EbpfNodeSettings,
        node: &NodeModel,
    ) -> Result<Self, MapError> {
        let mut node_programmer = NodeProgrammer::new();
        let mut programmer = Programmer::new();
        let facts = node_facts(&settings, node);
        node_programmer.apply(&facts, &mut maps)?;
        programmer.set_node_addresses(&facts.addresses, &DesiredState::default(), &mut maps)?;
        Ok(Self {
            maps,
            programmer,
            node_programmer,
            settings,
            applied: Some(facts),
            adopting: false,
        })
    }

    /// Over maps an earlier agent pinned: nothing is written before the first
    /// sync (which runs once Services and EndpointSlices were listed), which
    /// then takes over what they hold and writes only what differs.
    pub fn adopting(maps: KernelMaps, settings: EbpfNodeSettings) -> Self {
        Self {
            maps,
            programmer: Programmer::new(),
            node_programmer: NodeProgrammer::new(),
            settings,
            applied: None,
            adopting: true,
        }
    }

    fn adopt(&mut self, desired: &DesiredState) -> Result<(), MapError> {
        let facts = node_facts(&self.settings, &desired.node);
        let services = self.maps.service_snapshot()?;
        self.node_programmer = NodeProgrammer::adopt(&self.maps.node_snapshot()?);
        let stats = self.programmer.adopt(&services, desired, &facts.addresses);
        info!(
            frontends = stats.frontends,
            backends = stats.backends,
            stale_frontends = stats.stale_frontends,
            "took over the pinned service maps"
        );
        self.adopting = false;
        Ok(())
    }

    fn apply_node_facts(&mut self, desired: &DesiredState) -> Result<(), MapError> {
        let facts = node_facts(&self.settings, &desired.node);
        if self.applied.as_ref() == Some(&facts) {
            return Ok(());
        }
        let writes = self.node_programmer.apply(&facts, &mut self.maps)?;
        let stats =
            self.programmer
                .set_node_addresses(&facts.addresses, desired, &mut self.maps)?;
        info!(
            node_writes = writes,
            node_port_addresses = ?facts.addresses.node_ports,
            external_interfaces = ?facts.external_interfaces.keys().collect::<Vec<_>>(),
            frontend_writes = stats.writes,
            "node facts applied"
        );
        self.applied = Some(facts);
        Ok(())
    }
}

impl Proxier for EbpfProxier {
    type Error = MapError;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), MapError> {
        if self.adopting {
            self.adopt(desired)?;
        }
        self.apply_node_facts(desired)?;
        let stats = if changes.full {
            self.programmer.sync(desired, &mut self.maps)?
        } else {
            self.programmer
                .sync_changed(desired, &changes.changed, &mut self.maps)?
        };
        if !changes.full && changes.changed.is_empty() {
            debug!("datapath synced: no service changed");
            return Ok(());
        }
        info!(
            full = changes.full,
            changed = changes.changed.len(),
            frontends = stats.frontends,
            backends = stats.backends,
            writes = stats.writes,
            deletes = stats.deletes,
            flushed_flows = stats.flushed_flows,
            "datapath synced"
        );
        Ok(())
    }
}
