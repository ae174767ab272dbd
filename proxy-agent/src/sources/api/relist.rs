//! kube-rs watcher events -> [`SourceEvent`]s, remembering which objects we
//! reported so that a relist can report the ones that vanished meanwhile.

use std::collections::HashSet;

use k8s_openapi::api::{
    core::v1::{Node, Service},
    networking::v1::ServiceCIDR,
};
use kube::runtime::watcher::Event;

use crate::{
    model::{NamespacedName, endpoint_slice::EndpointSlice},
    sources::SourceEvent,
};

/// How one watched kind maps onto source events.
pub trait Kind {
    type Object;
    const NAME: &'static str;
    fn key(obj: &Self::Object) -> Option<NamespacedName>;
    fn applied(obj: Self::Object) -> SourceEvent;
    fn deleted(key: NamespacedName) -> SourceEvent;
    fn synced() -> Option<SourceEvent>;
}

fn key_of(meta: &kube::api::ObjectMeta) -> Option<NamespacedName> {
    Some(NamespacedName::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone()?,
    ))
}

pub struct ServiceKind;
impl Kind for ServiceKind {
    type Object = Service;
    const NAME: &'static str = "Service";
    fn key(obj: &Service) -> Option<NamespacedName> {
        key_of(&obj.metadata)
    }
    fn applied(obj: Service) -> SourceEvent {
        SourceEvent::ServiceApplied(Box::new(obj))
    }
    fn deleted(key: NamespacedName) -> SourceEvent {
        SourceEvent::ServiceDeleted(key)
    }
    fn synced() -> Option<SourceEvent> {
        Some(SourceEvent::ServicesSynced)
    }
}

pub struct SliceKind;
impl Kind for SliceKind {
    type Object = EndpointSlice;
    const NAME: &'static str = "EndpointSlice";
    fn key(obj: &EndpointSlice) -> Option<NamespacedName> {
        key_of(&obj.metadata)
    }
    fn applied(obj: EndpointSlice) -> SourceEvent {
        SourceEvent::SliceApplied(Box::new(obj))
    }
    fn deleted(key: NamespacedName) -> SourceEvent {
        SourceEvent::SliceDeleted(key)
    }
    fn synced() -> Option<SourceEvent> {
        Some(SourceEvent::SlicesSynced)
    }
}

pub struct ServiceCidrKind;
impl Kind for ServiceCidrKind {
    type Object = ServiceCIDR;
    const NAME: &'static str = "ServiceCIDR";
    fn key(obj: &ServiceCIDR) -> Option<NamespacedName> {
        key_of(&obj.metadata)
    }
    fn applied(obj: ServiceCIDR) -> SourceEvent {
        SourceEvent::ServiceCidrApplied(Box::new(obj))
    }
    fn deleted(key: NamespacedName) -> SourceEvent {
        SourceEvent::ServiceCidrDeleted(key.name.to_string())
    }
    /// Nothing waits for them: until they are listed, the configured ones apply.
    fn synced() -> Option<SourceEvent> {
        None
    }
}

pub struct NodeKind;
impl Kind for NodeKind {
    type Object = Node;
    const NAME: &'static str = "Node";
    fn key(obj: &Node) -> Option<NamespacedName> {
        key_of(&obj.metadata)
    }
    fn applied(obj: Node) -> SourceEvent {
        SourceEvent::NodeApplied(Box::new(obj))
    }
    fn deleted(_: NamespacedName) -> SourceEvent {
        SourceEvent::NodeDeleted
    }
    fn synced() -> Option<SourceEvent> {
        None
    }
}

pub struct Relister<K> {
    known: HashSet<NamespacedName>,
    /// Keys listed since the last `Init`; `Some` while a (re)list is running.
    listing: Option<HashSet<NamespacedName>>,
    _kind: K,
}

impl<K: Kind> Relister<K> {
    pub fn new(kind: K) -> Self {
        Relister {
            known: HashSet::new(),
            listing: None,
            _kind: kind,
        }
    }

    pub fn on_event(&mut self, event: Event<K::Object>) -> Vec<SourceEvent> {
        match event {
            Event::Init => {
                self.listing = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                let Some(key) = K::key(&obj) else {
                    return Vec::new();
                };
                self.listing
                    .get_or_insert_with(HashSet::new)
                    .insert(key.clone());
                self.known.insert(key);
                vec![K::applied(obj)]
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let mut gone: Vec<NamespacedName> =
                    self.known.difference(&listed).cloned().collect();
                gone.sort();
                self.known = listed;
                gone.into_iter()
                    .map(K::deleted)
                    .chain(K::synced())
                    .collect()
            }
            Event::Apply(obj) => {
                let Some(key) = K::key(&obj) else {
                    return Vec::new();
                };
                self.known.insert(key);
                vec![K::applied(obj)]
            }
            Event::Delete(obj) => {
                let Some(key) = K::key(&obj) else {
                    return Vec::new();
                };
                self.known.remove(&key);
                vec![K::deleted(key)]
            }
        }
    }
}
