//! What a sync programmed and why, in the agent's log, whatever the mode:
//! at info, each service port a partial sync changed (with the verdict for
//! its traffic) and a summary of full syncs; at debug (`-v=2` and up) every
//! service port of a full sync too.

use tracing::{Level, debug, enabled, info};

use super::SyncChanges;
use crate::model::{DesiredService, DesiredState};

/// What traffic to a service port meets, in upstream's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Balanced,
    Rejected,
    InternalDropped,
    ExternalDropped,
}

impl Verdict {
    pub fn of(svc: &DesiredService) -> Self {
        let no_local = svc.local_endpoints.is_empty();
        if !(svc.has_any_endpoints.v4 || svc.has_any_endpoints.v6) {
            Verdict::Rejected
        } else if svc.internal_policy_local && no_local {
            Verdict::InternalDropped
        } else if svc.external_policy_local && svc.externally_accessible() && no_local {
            Verdict::ExternalDropped
        } else {
            Verdict::Balanced
        }
    }

    fn text(self) -> &'static str {
        match self {
            Verdict::Balanced => "balanced",
            Verdict::Rejected => "no endpoints: connections are rejected",
            Verdict::InternalDropped => {
                "internalTrafficPolicy Local without endpoints on this node: traffic from this node is dropped"
            }
            Verdict::ExternalDropped => {
                "externalTrafficPolicy Local without endpoints on this node: external traffic is dropped"
            }
        }
    }
}

fn log_service(svc: &DesiredService, at_info: bool) {
    let cluster_ips: Vec<String> = svc.cluster_ips.iter().map(ToString::to_string).collect();
    let (cluster, local) = (svc.cluster_endpoints.len(), svc.local_endpoints.len());
    let verdict = Verdict::of(svc).text();
    if at_info {
        info!(service = %svc.name, ?cluster_ips, node_port = ?svc.node_port, cluster_endpoints = cluster, local_endpoints = local, "service port programmed: {verdict}");
    } else {
        debug!(service = %svc.name, ?cluster_ips, node_port = ?svc.node_port, cluster_endpoints = cluster, local_endpoints = local, "service port programmed: {verdict}");
    }
}

/// Logs a successful sync of `desired`.
pub fn log_sync(desired: &DesiredState, changes: &SyncChanges) {
    if !changes.full {
        for name in &changes.changed {
            match desired.services.get(name) {
                Some(svc) => log_service(svc, true),
                None => info!(service = %name, "service port removed"),
            }
        }
        return;
    }
    let verdicts: Vec<Verdict> = desired.services.values().map(Verdict::of).collect();
    let count = |v: &[Verdict]| verdicts.iter().filter(|x| v.contains(x)).count();
    let rejected = count(&[Verdict::Rejected]);
    let dropped = count(&[Verdict::InternalDropped, Verdict::ExternalDropped]);
    info!(
        service_ports = desired.services.len(),
        without_endpoints = rejected,
        local_policy_without_local_endpoints = dropped,
        "full sync programmed"
    );
    if enabled!(Level::DEBUG) {
        desired
            .services
            .values()
            .for_each(|s| log_service(s, false));
    }
}
