//! Health as upstream kube-proxy serves it: the proxy's own health state and
//! server (`/healthz`, `/livez` on `healthzBindAddress`), and one health-check
//! server per `externalTrafficPolicy: Local` LoadBalancer service on its
//! `healthCheckNodePort`, which cloud load balancers probe.

pub mod proxy_server;
pub mod service_ports;
mod state;

pub use service_ports::ServiceHealthPorts;
pub use state::{
    Clock, FamilyHealth, Health, ProxyHealth, SystemClock, TO_BE_DELETED_TAINT, format_time,
};
