//! The metrics server on `metricsBindAddress`: upstream's `kubeproxy_*`
//! metrics ([`proxy`]), the process's ([`process`]) and the datapath's own
//! (registered by the mode),
//! with prometheus-client, plus `/healthz`, `/proxyMode` and `/configz` as
//! upstream's metrics mux serves them.

pub mod exposition;
mod no_local;
pub mod process;
pub mod proxy;
pub mod reconciler;
pub mod rules;
pub mod server;

pub use process::ProcessMetrics;
pub use proxy::ProxyMetrics;
pub use reconciler::ConntrackReconcilerMetrics;
pub use rules::{IptablesMetrics, NftablesMetrics};
