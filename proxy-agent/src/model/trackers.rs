//! Change trackers (upstream `servicechangetracker.go`, `endpointschangetracker.go`,
//! `endpointslicecache.go`). Updates land in `pending`; [`apply`] moves them to
//! the applied state and reports only the services whose result really changed.
//!
//! Unlike upstream, objects are reduced on arrival ([`ServicePorts`], [`SliceInfo`]),
//! so no previous object needs to be kept or passed in.
//!
//! [`apply`]: ServiceChangeTracker::apply

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::SystemTime,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{
    IpFamily, NamespacedName,
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
        match service_name(svc) {
            Some(nn) => self.set(nn, service_ports(svc)),
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
        for (nn, ports) in self.pending.drain() {
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

#[derive(Debug, Default)]
struct ServiceSlices {
    applied: Slices,
    /// `None` = the slice is to be removed.
    pending: BTreeMap<String, Option<SliceInfo>>,
    endpoints: EndpointsByPort,
}

/// A service's slices by name, sorted. Most services have one or two: a
/// `BTreeMap` allocates a node of eleven entries for the first, 1.3 KB a
/// service (13 MB of the agent's heap at 10,000 services).
#[derive(Debug, Default)]
struct Slices(Vec<(String, SliceInfo)>);

impl Slices {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    fn get(&self, name: &str) -> Option<&SliceInfo> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    fn insert(&mut self, name: String, info: SliceInfo) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = info,
            Err(i) => self.0.insert(i, (name, info)),
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
    owners: HashMap<(String, String), NamespacedName>,
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
        let Some((namespace, name)) = slice_key(slice) else {
            return false;
        };
        let Some(info) = slice_info(slice) else {
            // Lost its service label or turned FQDN: gone as far as we are concerned.
            return self.delete(&namespace, &name);
        };
        let key = (namespace, name);
        let mut changed = false;
        if let Some(old) = self
            .owners
            .get(&key)
            .filter(|old| **old != info.service)
            .cloned()
        {
            changed |= self.set_pending(old, &key.1, None);
        }
        self.owners.insert(key.clone(), info.service.clone());
        let service = info.service.clone();
        let changed = changed | self.set_pending(service.clone(), &key.1, Some(info));
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
        match self.owners.remove(&(namespace.to_owned(), name.to_owned())) {
            Some(owner) => {
                self.trigger_times.remove(&owner);
                self.set_pending(owner, name, None)
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
        slice: &str,
        info: Option<SliceInfo>,
    ) -> bool {
        let entry = self.services.entry(service.clone()).or_default();
        let current = match entry.pending.get(slice) {
            Some(pending) => pending.as_ref(),
            None => entry.applied.get(slice),
        };
        if current == info.as_ref() {
            return false;
        }
        entry.pending.insert(slice.to_owned(), info);
        self.pending_services.insert(service);
        true
    }

    pub fn has_pending(&self) -> bool {
        !self.pending_services.is_empty()
    }

    /// Applies the pending slices; returns the services whose endpoints changed.
    pub fn apply(&mut self) -> BTreeSet<NamespacedName> {
        let mut changed = BTreeSet::new();
        for service in std::mem::take(&mut self.pending_services) {
            let Some(entry) = self.services.get_mut(&service) else {
                continue;
            };
            for (name, info) in std::mem::take(&mut entry.pending) {
                match info {
                    Some(info) => entry.applied.insert(name, info),
                    None => entry.applied.remove(&name),
                }
            }
            let endpoints = endpoints_by_port(entry.applied.values(), &self.node_name);
            if endpoints != entry.endpoints {
                entry.endpoints = endpoints;
                changed.insert(service.clone());
            }
            if entry.applied.is_empty() {
                self.services.remove(&service);
            }
        }
        changed
    }

    pub fn endpoints(&self, service: &NamespacedName) -> Option<&EndpointsByPort> {
        self.services.get(service).map(|s| &s.endpoints)
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
