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
    applied: NodeFacts,
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
            applied: facts,
        })
    }

    fn apply_node_facts(&mut self, desired: &DesiredState) -> Result<(), MapError> {
        let facts = node_facts(&self.settings, &desired.node);
        if facts == self.applied {
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
        self.applied = facts;
        Ok(())
    }
}

impl Proxier for EbpfProxier {
    type Error = MapError;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), MapError> {
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
