use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

use crate::model::NamespacedName;

/// What a source (the API watches or the manifests) reports.
#[derive(Clone, Debug)]
pub enum SourceEvent {
    ServiceApplied(Box<Service>),
    ServiceDeleted(NamespacedName),
    /// Every Service has been listed (informer `HasSynced`).
    ServicesSynced,
    SliceApplied(Box<EndpointSlice>),
    /// `(namespace, slice name)`.
    SliceDeleted(NamespacedName),
    SlicesSynced,
    NodeApplied(Box<Node>),
    NodeDeleted,
    /// Something outside the API objects changed (node addresses,
    /// interfaces): ask for a sync without changing any state.
    Resync,
}
