//! The backend-neutral service model: what every proxy mode programs.
//!
//! Kubernetes objects go in; a [`DesiredState`] keyed by [`ServicePortName`]
//! comes out. Modes (ebpf today) only translate this, never the API objects,
//! so all of them make the same decisions.
//!
//! Layout, following upstream `pkg/proxy`:
//! - [`service`]: Service -> per-port [`ServicePortInfo`] (`serviceport.go`).
//! - [`endpoint_slice`]: the EndpointSlice as read from the API or manifests.
//! - [`slice`]: EndpointSlice -> compact slice info -> [`Endpoint`]s (`endpointslicecache.go`).
//! - [`topology`]: [`categorize_endpoints`] (`topology.go`).
//! - [`trackers`]: change trackers that record only what changed.
//! - [`desired`]: one [`DesiredService`] per service port.
//! - [`service_cidrs`]: the cluster's service CIDRs (ServiceCIDR objects).

mod build;
mod construct;
pub mod desired;
pub mod endpoint_slice;
mod interner;
mod node;
pub mod service;
pub mod service_cidrs;
pub mod slice;
pub mod topology;
pub mod trackers;
mod types;

pub use build::{build_desired_state, build_desired_state_for};
pub use desired::{
    DesiredService, DesiredState, FamilySet, NodeTopology, ZONE_LABEL, desired_service,
};
pub use node::{NodeModel, NodeSettings, node_pod_cidrs};
pub use service::{
    BALANCING_ANNOTATION, Balancing, ServicePortInfo, ServicePorts, SessionAffinity, service_ports,
};
pub use service_cidrs::ServiceCidrs;
pub use topology::{Categorized, categorize_endpoints};
pub use trackers::{EndpointsChangeTracker, ServiceChangeTracker};
pub use types::{Endpoint, IpFamily, NamespacedName, Placement, Protocol, ServicePortName};
