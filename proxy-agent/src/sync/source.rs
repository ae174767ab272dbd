use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::ObjectMeta};

use super::{SyncObserver, TrackerEvent};
use crate::model::{
    EndpointsChangeTracker, NamespacedName, NodeModel, NodeSettings, NodeTopology,
    ServiceChangeTracker, ServiceCidrs, ServicePorts,
    slice::{SliceInfo, slice_info},
    trackers::reduce_service,
};
use crate::sources::{SourceEvent, host::HostNetwork};

/// Everything fed by the sources, shared between the event handler and the syncer.
#[derive(Debug)]
pub struct SourceState {
    pub(crate) services: ServiceChangeTracker,
    pub(crate) endpoints: EndpointsChangeTracker,
    pub(crate) node: NodeTopology,
    node_settings: NodeSettings,
    node_object: Option<Node>,
    host: Arc<HostNetwork>,
    node_model: NodeModel,
    service_cidrs: ServiceCidrs,
    services_synced: bool,
    slices_synced: bool,
}

/// A source event with the work that needs no tracker state done ahead
/// (a Service or an EndpointSlice reduced to what the proxy uses), possibly
/// on another thread: a first listing of 50,000 of each spent 0.2 s feeding
/// the slices one by one, and 70 ms reducing the Services.
pub struct PreparedEvent {
    event: SourceEvent,
    reduced: Reduced,
}

enum Reduced {
    Not,
    Service(Option<(NamespacedName, ServicePorts)>),
    Slice(Option<SliceInfo>),
}

impl PreparedEvent {
    pub fn plain(event: SourceEvent) -> Self {
        PreparedEvent {
            event,
            reduced: Reduced::Not,
        }
    }

    /// Reduces an applied Service or slice now, and frees what nothing reads
    /// once it is reduced (all of a Service; a slice's endpoints, ports and
    /// metadata but its name and annotations): on the preparing threads, not
    /// on the one that feeds the trackers (at 50,000 slices of 10 endpoints,
    /// the endpoints' drops were about 50 ms of a cold start's serial part,
    /// and the rest of both objects' about 25 ms).
    pub fn prepare(&mut self) {
        match &mut self.event {
            SourceEvent::ServiceApplied(svc) => {
                self.reduced = Reduced::Service(reduce_service(svc));
                drop(std::mem::take(&mut **svc));
            }
            SourceEvent::SliceApplied(slice) => {
                self.reduced = Reduced::Slice(slice_info(slice));
                let meta = &mut slice.metadata;
                let read = ObjectMeta {
                    name: meta.name.take(),
                    namespace: meta.namespace.take(),
                    annotations: meta.annotations.take(),
                    ..ObjectMeta::default()
                };
                drop(std::mem::replace(meta, read));
                drop(slice.endpoints.take());
                drop(slice.ports.take());
            }
            _ => {}
        }
    }
}

impl SourceState {
    pub fn new(node_name: &str) -> Self {
        Self::with_node_settings(node_name, NodeSettings::default())
    }

    pub fn with_node_settings(node_name: &str, node_settings: NodeSettings) -> Self {
        let node = NodeTopology::new(node_name);
        let host = Arc::new(HostNetwork::default());
        let node_model = NodeModel::build(&node_settings, node.clone(), None, host.clone());
        SourceState {
            services: ServiceChangeTracker::default(),
            endpoints: EndpointsChangeTracker::new(node_name),
            node,
            node_settings,
            node_object: None,
            host,
            node_model,
            service_cidrs: ServiceCidrs::default(),
            services_synced: false,
            slices_synced: false,
        }
    }

    /// Service CIDRs to guard while the cluster has no ServiceCIDR objects.
    pub fn with_configured_service_cidrs(mut self, cidrs: Vec<ipnet::IpNet>) -> Self {
        self.service_cidrs = ServiceCidrs::with_configured(cidrs);
        self
    }

    /// The service CIDRs to guard now.
    pub fn service_cidrs(&self) -> std::collections::BTreeSet<ipnet::IpNet> {
        self.service_cidrs.effective()
    }

    /// Upstream's `isInitialized`: nothing is programmed before both kinds
    /// were listed once, so a restart never programs a partial view.
    pub fn is_initialized(&self) -> bool {
        self.services_synced && self.slices_synced
    }

    /// This node as of the latest Node object and host snapshot.
    pub fn node_model(&self) -> &NodeModel {
        &self.node_model
    }

    /// This node's Node object, once received.
    pub fn node_object(&self) -> Option<&Node> {
        self.node_object.as_ref()
    }

    /// Records the event; returns whether a sync should be requested.
    pub fn handle(&mut self, event: SourceEvent) -> bool {
        self.handle_observed(event, &())
    }

    /// [`Self::handle`], telling `observer` about tracker and Node changes.
    pub fn handle_observed(&mut self, event: SourceEvent, observer: &dyn SyncObserver) -> bool {
        self.handle_prepared(PreparedEvent::plain(event), observer)
    }

    /// [`Self::handle_observed`] for an event whose stateless work is done.
    pub fn handle_prepared(
        &mut self,
        prepared: PreparedEvent,
        observer: &dyn SyncObserver,
    ) -> bool {
        let was_initialized = self.is_initialized();
        let changed = match prepared.event {
            SourceEvent::ServiceApplied(svc) => match prepared.reduced {
                Reduced::Service(reduced) => {
                    self.service_changed(observer, |t| t.update_with(reduced))
                }
                _ => self.service_changed(observer, |t| t.update(&svc)),
            },
            SourceEvent::ServiceDeleted(nn) => self.service_changed(observer, |t| t.delete(&nn)),
            SourceEvent::ServicesSynced => {
                self.services_synced = true;
                false
            }
            SourceEvent::SliceApplied(slice) => {
                let changed = match prepared.reduced {
                    Reduced::Slice(info) => self.endpoints.update_with(&slice, info),
                    _ => self.endpoints.update(&slice),
                };
                observer.tracker(TrackerEvent::Slice { changed });
                changed
            }
            SourceEvent::SliceDeleted(key) => {
                let changed = self.endpoints.delete(&key.namespace, &key.name);
                observer.tracker(TrackerEvent::Slice { changed });
                changed
            }
            SourceEvent::SlicesSynced => {
                self.slices_synced = true;
                false
            }
            SourceEvent::NodeApplied(node) => {
                let changed = self.set_node(Some(*node));
                observer.node(self.node_object.as_ref());
                changed
            }
            SourceEvent::NodeDeleted => {
                let changed = self.set_node(None);
                observer.node(None);
                changed
            }
            SourceEvent::ServiceCidrApplied(obj) => self.service_cidrs.apply(&obj),
            SourceEvent::ServiceCidrDeleted(name) => self.service_cidrs.delete(&name),
            SourceEvent::HostChanged(host) => {
                self.host = host;
                self.rebuild_node_model()
            }
        };
        self.is_initialized() && (changed || !was_initialized)
    }

    fn service_changed(
        &mut self,
        observer: &dyn SyncObserver,
        update: impl FnOnce(&mut ServiceChangeTracker) -> bool,
    ) -> bool {
        let pending = update(&mut self.services);
        observer.tracker(TrackerEvent::Service {
            pending: self.services.pending_len(),
        });
        pending
    }

    fn set_node(&mut self, node: Option<Node>) -> bool {
        if let Some(n) = &node
            && n.metadata.name.as_deref() != Some(self.node.node_name.as_str())
        {
            return false;
        }
        let labels = node
            .as_ref()
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        let relevant = self.set_labels(labels);
        self.node_object = node;
        self.rebuild_node_model() || relevant
    }

    /// Only a topology-relevant label change asks for a (full) sync.
    fn set_labels(&mut self, labels: BTreeMap<String, String>) -> bool {
        let next = NodeTopology {
            node_name: self.node.node_name.clone(),
            labels,
        };
        let relevant = next.topology_differs(&self.node);
        self.node = next;
        relevant
    }

    /// Whether anything but the labels changed (those count through
    /// [`Self::set_labels`]).
    fn rebuild_node_model(&mut self) -> bool {
        let next = NodeModel::build(
            &self.node_settings,
            self.node.clone(),
            self.node_object.as_ref(),
            self.host.clone(),
        );
        let changed = !next.same_facts(&self.node_model);
        self.node_model = next;
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::sources::host::HostInterface;

    fn host(addresses: &[Ipv4Addr]) -> Arc<HostNetwork> {
        Arc::new(HostNetwork {
            interfaces: vec![HostInterface {
                name: "eth0".into(),
                index: 2,
                ipv4: addresses.to_vec(),
                ..HostInterface::default()
            }],
            default_route_interface: Some("eth0".into()),
            ..HostNetwork::default()
        })
    }

    fn initialized() -> SourceState {
        let mut state = SourceState::new("node-a");
        state.handle(SourceEvent::ServicesSynced);
        state.handle(SourceEvent::SlicesSynced);
        state
    }

    #[test]
    fn host_changes_reach_the_node_model_and_ask_for_a_sync_only_when_it_changed() {
        let mut state = initialized();
        let a = Ipv4Addr::new(198, 18, 0, 1);
        assert!(state.handle(SourceEvent::HostChanged(host(&[a]))));
        assert_eq!(state.node_model().primary_ipv4, Some(a));
        assert_eq!(state.node_model().node_port_addresses, vec![IpAddr::V4(a)]);
        assert!(
            !state.handle(SourceEvent::HostChanged(host(&[a]))),
            "the same snapshot again changes nothing"
        );
        let b = Ipv4Addr::new(198, 18, 0, 2);
        assert!(state.handle(SourceEvent::HostChanged(host(&[a, b]))));
        assert_eq!(
            state.node_model().node_port_addresses,
            vec![IpAddr::V4(a), IpAddr::V4(b)]
        );
    }

    #[test]
    fn the_node_object_feeds_the_model_and_other_nodes_are_ignored() {
        let mut state = initialized();
        state.handle(SourceEvent::HostChanged(host(&[Ipv4Addr::new(
            198, 18, 0, 1,
        )])));
        let node = |name: &str, cidr: &str| {
            Box::new(Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                    pod_cidr: Some(cidr.into()),
                    ..Default::default()
                }),
                ..Node::default()
            })
        };
        assert!(!state.handle(SourceEvent::NodeApplied(node("node-b", "198.19.1.0/24"))));
        assert!(state.node_model().pod_cidrs.is_empty());
        assert!(state.handle(SourceEvent::NodeApplied(node("node-a", "198.19.2.0/24"))));
        assert_eq!(
            state.node_model().pod_cidrs,
            vec!["198.19.2.0/24".parse().unwrap()]
        );
        assert!(state.handle(SourceEvent::NodeDeleted));
        assert!(state.node_model().pod_cidrs.is_empty());
    }

    #[test]
    fn nothing_asks_for_a_sync_before_both_kinds_were_listed() {
        let mut state = SourceState::new("node-a");
        assert!(!state.handle(SourceEvent::HostChanged(host(&[Ipv4Addr::new(
            198, 18, 0, 1
        )]))));
        assert_eq!(
            state.node_model().primary_ipv4,
            Some(Ipv4Addr::new(198, 18, 0, 1)),
            "but the model follows the host already"
        );
    }
}
