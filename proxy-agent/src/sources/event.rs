use k8s_openapi::api::{
    core::v1::{Node, Service},
    networking::v1::ServiceCIDR,
};

use std::sync::Arc;

use super::host::HostNetwork;
use crate::model::{NamespacedName, endpoint_slice::EndpointSlice};

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
    ServiceCidrApplied(Box<ServiceCIDR>),
    /// A ServiceCIDR object (cluster-scoped: its name) was deleted.
    ServiceCidrDeleted(String),
    /// The host's interfaces or addresses changed (the host source).
    HostChanged(Arc<HostNetwork>),
}
