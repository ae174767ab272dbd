//! Upstream's service health server (`service_health.go`): for every
//! `externalTrafficPolicy: Local` LoadBalancer service with a
//! `healthCheckNodePort`, an HTTP server on that port saying how many ready
//! endpoints the service has on this node. Cloud load balancers send traffic
//! only to nodes that answer 200.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
};

use tokio::task::JoinHandle;
use tracing::{error, info};

use super::ProxyHealth;
use crate::{
    events::{EventRecorder, Regarding},
    httpserve::{self, Handler, Response},
    model::{DesiredState, NamespacedName},
    sync::{SyncObserver, SyncReport},
};

/// Where one service's health check listens.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Binding {
    port: u16,
    addresses: Vec<IpAddr>,
}

struct Served {
    binding: Binding,
    listeners: Vec<JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.listeners.iter().for_each(JoinHandle::abort);
    }
}

#[derive(Default)]
struct State {
    served: BTreeMap<NamespacedName, Served>,
    /// Ready endpoints on this node, counted by distinct address.
    local_endpoints: BTreeMap<NamespacedName, usize>,
}

pub struct ServiceHealthPorts {
    node_name: String,
    /// `nodePortAddresses` unset: one listener on the unspecified address.
    all_addresses: bool,
    health: Arc<ProxyHealth>,
    events: Arc<dyn EventRecorder>,
    state: Arc<Mutex<State>>,
    runtime: tokio::runtime::Handle,
}

impl ServiceHealthPorts {
    /// Needs a tokio runtime: each listener is a task.
    pub fn new(
        node_name: &str,
        all_addresses: bool,
        health: Arc<ProxyHealth>,
        events: Arc<dyn EventRecorder>,
    ) -> Self {
        ServiceHealthPorts {
            node_name: node_name.into(),
            all_addresses,
            health,
            events,
            state: Arc::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The services with a health-check port and their local ready endpoint counts.
    pub fn wanted(desired: &DesiredState) -> BTreeMap<NamespacedName, (u16, usize)> {
        let mut ports = BTreeMap::new();
        let mut addresses: BTreeMap<NamespacedName, BTreeSet<IpAddr>> = BTreeMap::new();
        for svc in desired.services.values() {
            let Some(port) = svc.health_check_node_port.filter(|p| *p != 0) else {
                continue;
            };
            let name = svc.name.service();
            ports.insert(name.clone(), port);
            let ready_local = svc
                .local_endpoints
                .iter()
                .filter(|e| e.is_local && e.ready)
                .map(|e| e.ip);
            addresses.entry(name).or_default().extend(ready_local);
        }
        ports
            .into_iter()
            .map(|(name, port)| {
                let count = addresses.get(&name).map_or(0, BTreeSet::len);
                (name, (port, count))
            })
            .collect()
    }

    /// Upstream's `SyncServices` + `SyncEndpoints`: closes the listeners of
    /// services gone or moved, opens new ones, leaves the rest alone.
    pub fn sync(&self, desired: &DesiredState) {
        let wanted = Self::wanted(desired);
        let addresses = if self.all_addresses {
            vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)]
        } else {
            desired.node.node_port_addresses.clone()
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.local_endpoints = wanted.iter().map(|(n, (_, c))| (n.clone(), *c)).collect();
        state.served.retain(|name, served| {
            let keep = wanted.get(name).is_some_and(|(port, _)| {
                served.binding.port == *port && served.binding.addresses == addresses
            });
            if !keep {
                info!(service = %name, port = served.binding.port, "closing the health-check node port");
            }
            keep
        });
        for (name, (port, _)) in &wanted {
            if state.served.contains_key(name) {
                continue;
            }
            let binding = Binding {
                port: *port,
                addresses: addresses.clone(),
            };
            match self.open(name, &binding) {
                Ok(listeners) => {
                    info!(service = %name, port, addresses = ?binding.addresses, "serving the health-check node port");
                    state
                        .served
                        .insert(name.clone(), Served { binding, listeners });
                }
                Err((address, e)) => {
                    let message = format!(
                        "node {} failed to start healthcheck \"{name}\" on port {port}: {e}",
                        self.node_name
                    );
                    error!(%address, "{message}; retried at the next sync");
                    self.events.warning(
                        Regarding::Service(name.clone()),
                        "FailedToStartServiceHealthcheck",
                        "Listen",
                        &message,
                    );
                }
            }
        }
    }

    /// Listens on every address, or on none (closing those opened) when one fails.
    fn open(
        &self,
        name: &NamespacedName,
        binding: &Binding,
    ) -> Result<Vec<JoinHandle<()>>, (SocketAddr, std::io::Error)> {
        let _runtime = self.runtime.enter();
        let mut listeners = Vec::new();
        for ip in &binding.addresses {
            let address = SocketAddr::new(*ip, binding.port);
            match httpserve::listen(address) {
                Ok(listener) => {
                    let handler = self.handler(name.clone());
                    listeners.push(self.runtime.spawn(httpserve::serve(listener, handler)));
                }
                Err(e) => {
                    listeners.iter().for_each(JoinHandle::abort);
                    return Err((address, e));
                }
            }
        }
        Ok(listeners)
    }

    fn handler(&self, name: NamespacedName) -> Handler {
        let state = self.state.clone();
        let health = self.health.clone();
        Arc::new(move |_req| {
            let count = {
                let state = state.lock().unwrap_or_else(|e| e.into_inner());
                state
                    .served
                    .contains_key(&name)
                    .then(|| state.local_endpoints.get(&name).copied().unwrap_or(0))
            };
            match count {
                Some(count) => answer(&name, count, health.health().healthy),
                None => {
                    error!(service = %name, "request for a closed health check");
                    httpserve::respond(200, &[], "")
                }
            }
        })
    }
}

/// Upstream's body: its dedented JSON template, tab-indented, no trailing newline.
pub fn answer(name: &NamespacedName, local_endpoints: usize, proxy_healthy: bool) -> Response {
    let status = if local_endpoints != 0 && proxy_healthy {
        200
    } else {
        503
    };
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        serde_json::Value::from(&*name.namespace),
        serde_json::Value::from(&*name.name),
    );
    let weight = local_endpoints.to_string();
    httpserve::respond(
        status,
        &[
            ("Content-Type", "application/json"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Load-Balancing-Endpoint-Weight", &weight),
        ],
        body,
    )
}

impl SyncObserver for ServiceHealthPorts {
    fn synced(&self, report: &SyncReport<'_>) {
        if report.any_synced() {
            self.sync(report.desired);
        }
    }
}
