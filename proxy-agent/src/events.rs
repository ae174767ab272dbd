//! Kubernetes Events an operator sees in `kubectl describe` (upstream's
//! Warning events such as `FailedToStartServiceHealthcheck`), published
//! through events.k8s.io as kube-proxy does; without an API server (the
//! manifests source) the log line is all there is.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::{debug, warn};

use crate::model::NamespacedName;

/// What an event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Regarding {
    ThisNode,
    Service(NamespacedName),
}

pub trait EventRecorder: Send + Sync {
    /// A Warning event; also logged.
    fn warning(&self, regarding: Regarding, reason: &str, action: &str, message: &str);
}

/// Logs only.
pub struct LogEvents;

impl EventRecorder for LogEvents {
    fn warning(&self, regarding: Regarding, reason: &str, action: &str, message: &str) {
        warn!(?regarding, reason, action, "{message}");
    }
}

/// Publishes to the API server (as `kube-proxy` on this node) and logs.
pub struct ApiEvents {
    recorder: Recorder,
    node_name: String,
    runtime: tokio::runtime::Handle,
}

impl ApiEvents {
    /// Needs a tokio runtime (the events are sent from a task of their own).
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        let reporter = Reporter {
            controller: "kube-proxy".into(),
            instance: Some(node_name.into()),
        };
        ApiEvents {
            recorder: Recorder::new(client, reporter),
            node_name: node_name.into(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn reference(&self, regarding: &Regarding) -> ObjectReference {
        match regarding {
            // Upstream's node reference: the UID is the node name.
            Regarding::ThisNode => ObjectReference {
                kind: Some("Node".into()),
                api_version: Some("v1".into()),
                name: Some(self.node_name.clone()),
                uid: Some(self.node_name.clone()),
                ..ObjectReference::default()
            },
            Regarding::Service(nn) => ObjectReference {
                kind: Some("Service".into()),
                api_version: Some("v1".into()),
                namespace: Some(nn.namespace.to_string()),
                name: Some(nn.name.to_string()),
                ..ObjectReference::default()
            },
        }
    }
}

impl EventRecorder for ApiEvents {
    fn warning(&self, regarding: Regarding, reason: &str, action: &str, message: &str) {
        LogEvents.warning(regarding.clone(), reason, action, message);
        let reference = self.reference(&regarding);
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(message.into()),
            action: action.into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        self.runtime.spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                debug!(error = %e, "publishing an event");
            }
        });
    }
}
