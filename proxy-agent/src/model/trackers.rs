//! Change trackers (upstream `servicechangetracker.go`, `endpointschangetracker.go`,
//! `endpointslicecache.go`). Updates land in `pending`; [`apply`] moves them to
//! the applied state and reports only the services whose result really changed.
//!
//! Unlike upstream, objects are reduced on arrival ([`ServicePorts`], [`SliceInfo`]),
//! so no previous object needs to be kept or passed in.
//!
//! [`apply`]: ServiceChangeTracker::apply

use foldhash::{HashMap, HashMapExt as _};
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::SystemTime,
};

use k8s_openapi::api::core::v1::Service;

use super::{
    IpFamily, NamespacedName,
    endpoint_slice::EndpointSlice,
    service::{ServicePorts, service_name, service_ports},
    slice::{EndpointsByPort, SliceInfo, endpoints_by_port, slice_info, slice_key},
};

#[derive(Debug, Default)]
pub struct ServiceChangeTracker {
    applied: HashMap<NamespacedName, ServicePorts>,
    pending: HashMap<NamespacedName, ServicePorts>,
}

impl ServiceChangeTracker {
    /// Records an added or modified Service. Returns whether anything is pending,
    /// as upstream's `ServiceChangeTracker.Update`.
    pub fn update(&mut self, svc: &Service) -> bool {
        self.update_with(reduce_service(svc))
    }

    /// [`Self::update`] with the Service already reduced
    /// ([`reduce_service`] of it), for callers that reduce many on several
    /// threads.
    pub fn update_with(&mut self, reduced: Option<(NamespacedName, ServicePorts)>) -> bool {
        match reduced {
            Some((nn, ports)) => self.set(nn, ports),
            None => self.has_pending(),
        }
    }

    pub fn delete(&mut self, service: &NamespacedName) -> bool {
        self.set(service.clone(), ServicePorts::new())
    }

    fn set(&mut self, nn: NamespacedName, ports: ServicePorts) -> bool {
        // A change that returns to the applied state cancels out.
        if self
            .applied
            .get(&nn)
            .map_or(ports.is_empty(), |applied| *applied == ports)
        {
            self.pending.remove(&nn);
        } else {
            self.pending.insert(nn, ports);
        }
        self.has_pending()
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Services with a change not applied yet.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Applies the pending changes; returns the services added, changed or removed.
    pub fn apply(&mut self) -> BTreeSet<NamespacedName> {
        let mut changed = BTreeSet::new();
        // Taken, not drained: a drained map keeps its largest table.
        for (nn, ports) in std::mem::take(&mut self.pending) {
            if ports.is_empty() {
                self.applied.remove(&nn);
            } else {
                self.applied.insert(nn.clone(), ports);
            }
            changed.insert(nn);
        }
        changed
    }

    pub fn ports(&self, service: &NamespacedName) -> Option<&ServicePorts> {
        self.applied.get(service)
    }

    pub fn services(&self) -> impl Iterator<Item = (&NamespacedName, &ServicePorts)> {
        self.applied.iter()
    }
}

/// A Service's name and ports, `None` for one without a name.
pub fn reduce_service(svc: &Service) -> Option<(NamespacedName, ServicePorts)> {
    let nn = service_name(svc)?;
    let ports = service_ports(svc);
    // The ports' names share the key's strings.
    let nn = ports.first().map_or(nn, |(spn, _)| spn.service());
    Some((nn, ports))
}

#[derive(Debug, Default)]
struct ServiceSlices {
    applied: Slices,
    /// `None` = the slice is to be removed.
    pending: BTreeMap<Arc<str>, Option<SliceInfo>>,
}

/// A service's slices by name, sorted. Most services have one or two: a
/// `BTreeMap` allocates a node of eleven entries for the first, 1.3 KB a
/// service (13 MB of the agent's heap at 10,000 services).
#[derive(Debug, Default)]
struct Slices(Vec<(Arc<str>, SliceInfo)>);

impl Slices {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name))
    }

    fn get(&self, name: &str) -> Option<&SliceInfo> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    fn insert(&mut self, name: Arc<str>, info: SliceInfo) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = info,
            Err(i) => {
                // No growth slack: a Vec's first push makes room for four.
                self.0.reserve_exact(1);
                self.0.insert(i, (name, info))
            }
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.find(name) {
            self.0.remove(i);
        }
    }

    fn values(&self) -> impl Iterator<Item = &SliceInfo> {
        self.0.iter().map(|(_, info)| info)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Upstream's `EndpointSliceCache` + `EndpointsChangeTracker`.
#[derive(Debug)]
pub struct EndpointsChangeTracker {
    node_name: String,
    services: HashMap<NamespacedName, ServiceSlices>,
    /// Which service each slice was last filed under, so a slice whose
    /// service-name label changes leaves its old service (upstream does not).
    /// Keyed by the slice's namespace/name, sharing its strings.
    owners: HashMap<NamespacedName, NamespacedName>,
    pending_services: BTreeSet<NamespacedName>,
    /// `endpoints.kubernetes.io/last-change-trigger-time` of pending slice
    /// updates, for the network programming latency.
    trigger_times: BTreeMap<NamespacedName, Vec<(IpFamily, SystemTime)>>,
    /// Trigger times from before the agent started are not its latency.
    started: SystemTime,
}

/// The annotation the EndpointSlice controller sets to the time of the change
/// (a pod or service event) that led to the slice's update.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl EndpointsChangeTracker {
    /// `node_name` decides which endpoints are local.
    pub fn new(node_name: impl Into<String>) -> Self {
        EndpointsChangeTracker {
            node_name: node_name.into(),
            services: HashMap::new(),
            owners: HashMap::new(),
            pending_services: BTreeSet::new(),
            trigger_times: BTreeMap::new(),
            started: SystemTime::now(),
        }
    }

    /// Records an added or modified slice. Returns whether this update changed
    /// anything, as upstream's `EndpointSliceUpdate`.
    pub fn update(&mut self, slice: &EndpointSlice) -> bool {
        self.update_with(slice, slice_info(slice))
    }

    /// [`Self::update`] with the slice already reduced (`slice_info` of it),
    /// for callers that reduce many slices on several threads.
    pub fn update_with(&mut self, slice: &EndpointSlice, info: Option<SliceInfo>) -> bool {
        let Some((namespace, name)) = slice_key(slice) else {
            return false;
        };
        let Some(info) = info else {
            // Lost its service label or turned FQDN: gone as far as we are concerned.
            return self.delete(&namespace, &name);
        };
        // The slice's namespace is its service's: one string for both.
        debug_assert_eq!(*info.service.namespace, *namespace);
        let key = NamespacedName::new(info.service.namespace.clone(), name);
        let mut changed = false;
        if let Some(old) = self
            .owners
            .get(&key)
            .filter(|old| **old != info.service)
            .cloned()
        {
            changed |= self.set_pending(old, &key.name, None);
        }
        self.owners.insert(key.clone(), info.service.clone());
        let service = info.service.clone();
        let changed = changed | self.set_pending(service.clone(), &key.name, Some(info));
        if changed && let Some(at) = trigger_time(slice).filter(|t| *t > self.started) {
            let family = match slice.address_type.as_str() {
                "IPv6" => IpFamily::V6,
                _ => IpFamily::V4,
            };
            self.trigger_times
                .entry(service)
                .or_default()
                .push((family, at));
        }
        changed
    }

    /// As upstream: a deletion's annotation dates from the slice's last update,
    /// not from the change that removed it, so the service's times are dropped.
    pub fn delete(&mut self, namespace: &str, name: &str) -> bool {
        match self
            .owners
            .remove_entry(&NamespacedName::new(namespace, name))
        {
            Some((key, owner)) => {
                self.trigger_times.remove(&owner);
                self.set_pending(owner, &key.name, None)
            }
            None => false,
        }
    }

    /// The trigger times of the changes applied since the last call.
    pub fn take_trigger_times(&mut self) -> Vec<(IpFamily, SystemTime)> {
        std::mem::take(&mut self.trigger_times)
            .into_values()
            .flatten()
            .collect()
    }

    fn set_pending(
        &mut self,
        service: NamespacedName,
        slice: &Arc<str>,
        info: Option<SliceInfo>,
    ) -> bool {
        let entry = self.services.entry(service.clone()).or_default();
        let current = match entry.pending.get(&**slice) {
            Some(pending) => pending.as_ref(),
            None => entry.applied.get(slice),
        };
        if current == info.as_ref() {
            return false;
        }
        entry.pending.insert(slice.clone(), info);
        self.pending_services.insert(service);
        true
    }

    pub fn has_pending(&self) -> bool {
        !self.pending_services.is_empty()
    }

    /// Services whose slices changed and are not applied yet.
    pub fn pending_len(&self) -> usize {
        self.pending_services.len()
    }

    /// Applies the pending slices; returns the services whose endpoints changed.
    pub fn apply(&mut self) -> BTreeSet<NamespacedName> {
        let mut changed = BTreeSet::new();
        for service in std::mem::take(&mut self.pending_services) {
            let Some(entry) = self.services.get_mut(&service) else {
                continue;
            };
            // Not kept between syncs (a third copy of every endpoint):
            // merged again before and after, only for the services changed.
            // A service new to the tracker (all of them at the first
            // listing) changed when it has an endpoint on a port at all.
            let before = (!entry.applied.is_empty())
                .then(|| endpoints_by_port(entry.applied.values(), &self.node_name));
            for (name, info) in std::mem::take(&mut entry.pending) {
                match info {
                    Some(info) => entry.applied.insert(name, info),
                    None => entry.applied.remove(&name),
                }
            }
            let differs = match before {
                Some(before) => {
                    endpoints_by_port(entry.applied.values(), &self.node_name) != before
                }
                None => entry
                    .applied
                    .values()
                    .any(|s| !s.ports.is_empty() && !s.endpoints.is_empty()),
            };
            if differs {
                changed.insert(service.clone());
            }
            if entry.applied.is_empty() {
                self.services.remove(&service);
            }
        }
        changed
    }

    /// The service's endpoints per port, merged from its applied slices.
    pub fn endpoints(&self, service: &NamespacedName) -> Option<EndpointsByPort> {
        self.services
            .get(service)
            .map(|s| endpoints_by_port(s.applied.values(), &self.node_name))
    }
}

fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME)?;
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}
