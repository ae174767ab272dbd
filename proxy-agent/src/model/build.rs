//! One-shot build from object lists (the manifests source), through the same
//! trackers and categorisation as the API source.

use k8s_openapi::api::core::v1::Service;

use super::{
    DesiredState, EndpointsChangeTracker, NodeTopology, ServiceChangeTracker,
    endpoint_slice::EndpointSlice,
};

/// Builds the desired state from the current objects. `node_name` decides
/// which endpoints are local; no zone is known, so zone hints are ignored.
pub fn build_desired_state(
    services: &[Service],
    slices: &[EndpointSlice],
    node_name: &str,
) -> DesiredState {
    build_desired_state_for(services, slices, &NodeTopology::new(node_name))
}

/// As [`build_desired_state`], with this node's labels for topology.
pub fn build_desired_state_for<S, E>(
    services: &[S],
    slices: &[E],
    node: &NodeTopology,
) -> DesiredState
where
    S: std::borrow::Borrow<Service>,
    E: std::borrow::Borrow<EndpointSlice>,
{
    let mut svc_tracker = ServiceChangeTracker::default();
    let mut ep_tracker = EndpointsChangeTracker::new(node.node_name.clone());
    for svc in services {
        svc_tracker.update(svc.borrow());
    }
    for slice in slices {
        ep_tracker.update(slice.borrow());
    }
    svc_tracker.apply();
    ep_tracker.apply();
    DesiredState::rebuild(&svc_tracker, &ep_tracker, node)
}
