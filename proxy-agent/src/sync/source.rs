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
/// on another thread: in a first listing of 50,000 of each, the slices took
/// 0.2 s fed one by one, and the Services 65-73 ms of the serial feed.
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

/// From this many Service and slice events in a batch, their trackers are
/// fed on two threads: at 50,000 of each, the Services took 65 ms and the
/// slices 105 ms on one.
const PARALLEL_FEED: usize = 1_024;

/// Feeds a Service event to its tracker; whether anything is pending.
fn feed_service(
    tracker: &mut ServiceChangeTracker,
    prepared: PreparedEvent,
    observer: &dyn SyncObserver,
) -> bool {
    let pending = match (prepared.event, prepared.reduced) {
        (SourceEvent::ServiceApplied(_), Reduced::Service(reduced)) => tracker.update_with(reduced),
        (SourceEvent::ServiceApplied(svc), _) => tracker.update(&svc),
        (SourceEvent::ServiceDeleted(nn), _) => tracker.delete(&nn),
        _ => return false,
    };
    observer.tracker(TrackerEvent::Service {
        pending: tracker.pending_len(),
    });
    pending
}

/// Feeds a slice event to its tracker; whether it changed anything.
fn feed_slice(
    tracker: &mut EndpointsChangeTracker,
    prepared: PreparedEvent,
    observer: &dyn SyncObserver,
) -> bool {
    let changed = match (prepared.event, prepared.reduced) {
        (SourceEvent::SliceApplied(slice), Reduced::Slice(info)) => {
            tracker.update_with(&slice, info)
        }
        (SourceEvent::SliceApplied(slice), _) => tracker.update(&slice),
        (SourceEvent::SliceDeleted(key), _) => tracker.delete(&key.namespace, &key.name),
        _ => return false,
    };
    observer.tracker(TrackerEvent::Slice { changed });
    changed
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
            SourceEvent::ServiceApplied(_) | SourceEvent::ServiceDeleted(_) => {
                feed_service(&mut self.services, prepared, observer)
            }
            SourceEvent::ServicesSynced => {
                self.services_synced = true;
                false
            }
            SourceEvent::SliceApplied(_) | SourceEvent::SliceDeleted(_) => {
                feed_slice(&mut self.endpoints, prepared, observer)
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

    /// [`Self::handle_prepared`] for each of `batch`. The Service and the
    /// slice events of a long batch (a first listing) feed their trackers,
    /// which share nothing, on two threads, each kind in its order; the
    /// other events follow, in theirs. Whether a sync is wanted does not
    /// depend on that order: only on whether the sources are initialised at
    /// the end, whether they became so in the batch, and what changed.
    pub fn handle_batch(&mut self, batch: Vec<PreparedEvent>, observer: &dyn SyncObserver) -> bool {
        let kind = |e: &PreparedEvent| match e.event {
            SourceEvent::ServiceApplied(_) | SourceEvent::ServiceDeleted(_) => 0,
            SourceEvent::SliceApplied(_) | SourceEvent::SliceDeleted(_) => 1,
            _ => 2,
        };
        let tracked = batch.iter().filter(|e| kind(e) < 2).count();
        if tracked < PARALLEL_FEED {
            return (batch.into_iter())
                .fold(false, |wants, e| self.handle_prepared(e, observer) | wants);
        }
        let was_initialized = self.is_initialized();
        let (mut services, mut slices, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        for event in batch {
            match kind(&event) {
                0 => services.push(event),
                1 => slices.push(event),
                _ => rest.push(event),
            }
        }
        let (service_tracker, endpoint_tracker) = (&mut self.services, &mut self.endpoints);
        let changed = std::thread::scope(|scope| {
            let feeding = scope.spawn(|| {
                (services.into_iter())
                    .fold(false, |c, e| feed_service(service_tracker, e, observer) | c)
            });
            let slices_changed = (slices.into_iter())
                .fold(false, |c, e| feed_slice(endpoint_tracker, e, observer) | c);
            let services_changed = feeding
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            services_changed | slices_changed
        });
        let wants =
            (rest.into_iter()).fold(false, |wants, e| self.handle_prepared(e, observer) | wants);
        wants || (self.is_initialized() && (changed || !was_initialized))
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
