use k8s_openapi::api::core::v1::Node;

use crate::model::{EndpointsChangeTracker, NodeTopology, ServiceChangeTracker};
use crate::sources::SourceEvent;

/// Everything fed by the sources, shared between the event handler and the syncer.
#[derive(Debug)]
pub struct SourceState {
    pub(crate) services: ServiceChangeTracker,
    pub(crate) endpoints: EndpointsChangeTracker,
    pub(crate) node: NodeTopology,
    services_synced: bool,
    slices_synced: bool,
}

impl SourceState {
    pub fn new(node_name: &str) -> Self {
        SourceState {
            services: ServiceChangeTracker::default(),
            endpoints: EndpointsChangeTracker::new(node_name),
            node: NodeTopology::new(node_name),
            services_synced: false,
            slices_synced: false,
        }
    }

    /// Upstream's `isInitialized`: nothing is programmed before both kinds
    /// were listed once, so a restart never programs a partial view.
    pub fn is_initialized(&self) -> bool {
        self.services_synced && self.slices_synced
    }

    /// Records the event; returns whether a sync should be requested.
    pub fn handle(&mut self, event: SourceEvent) -> bool {
        let was_initialized = self.is_initialized();
        let changed = match event {
            SourceEvent::ServiceApplied(svc) => self.services.update(&svc),
            SourceEvent::ServiceDeleted(nn) => self.services.delete(&nn),
            SourceEvent::ServicesSynced => {
                self.services_synced = true;
                false
            }
            SourceEvent::SliceApplied(slice) => self.endpoints.update(&slice),
            SourceEvent::SliceDeleted(key) => self.endpoints.delete(&key.namespace, &key.name),
            SourceEvent::SlicesSynced => {
                self.slices_synced = true;
                false
            }
            SourceEvent::NodeApplied(node) => self.set_node(&node),
            SourceEvent::NodeDeleted => self.set_labels(Default::default()),
            SourceEvent::Resync => true,
        };
        self.is_initialized() && (changed || !was_initialized)
    }

    fn set_node(&mut self, node: &Node) -> bool {
        if node.metadata.name.as_deref() != Some(self.node.node_name.as_str()) {
            return false;
        }
        self.set_labels(node.metadata.labels.clone().unwrap_or_default())
    }

    /// Only a topology-relevant label change asks for a (full) sync.
    fn set_labels(&mut self, labels: std::collections::BTreeMap<String, String>) -> bool {
        let next = NodeTopology {
            node_name: self.node.node_name.clone(),
            labels,
        };
        let relevant = next.topology_differs(&self.node);
        self.node = next;
        relevant
    }
}
