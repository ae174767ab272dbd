//! Session affinity as the probe left it: which endpoint the client is
//! pinned to, whether it already was, and for how long the pin lasts
//! without a new connection (the `AFFINITY*` maps, private copies).

use std::net::{IpAddr, SocketAddr};

use proxy_common::{AffinityKeyOf, AffinityValue, Counter, V4, V6};
use serde::Serialize;

use super::{frontend::Frontend, probe::Probe, trace::Trace};
use crate::modes::ebpf::{KernelMaps, family::AgentFamily as _};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pin {
    pub timeout_seconds: u32,
    /// The endpoint the client is pinned to; `None`: not pinned (the
    /// connection was not forwarded).
    pub endpoint: Option<String>,
    /// The client was pinned there before this connection.
    pub already_pinned: bool,
    /// Seconds until the pin lapses unless the client connects again.
    pub expires_in_seconds: Option<u64>,
}

/// The pin of `probe`'s client at `frontend`, read after the trace.
pub fn read(maps: &KernelMaps, frontend: &Frontend, probe: &Probe, trace: &Trace) -> Option<Pin> {
    let timeout_seconds = frontend.affinity_timeout_s?;
    let service_id = frontend.service_id;
    let entry: Option<(AffinityValue, Option<SocketAddr>)> = match probe.src {
        IpAddr::V4(client) => {
            let key = AffinityKeyOf::<V4> {
                service_id,
                client_be: V4::to_be(client),
            };
            maps.affinity.get(&key, 0).ok().map(|v| {
                let backend = maps.backends.get(&v.backend_id, 0).ok().map(|b| {
                    SocketAddr::new(V4::from_be(b.addr_be).into(), u16::from_be(b.port_be))
                });
                (v, backend)
            })
        }
        IpAddr::V6(client) => {
            let key = AffinityKeyOf::<V6> {
                service_id,
                client_be: V6::to_be(client),
            };
            maps.v6.affinity.get(&key, 0).ok().map(|v| {
                let backend = maps.v6.backends.get(&v.backend_id, 0).ok().map(|b| {
                    SocketAddr::new(V6::from_be(b.addr_be).into(), u16::from_be(b.port_be))
                });
                (v, backend)
            })
        }
    };
    let (endpoint, expires_in_seconds) = match entry {
        Some((value, backend)) => {
            let ends = value.last_ns + u64::from(timeout_seconds) * 1_000_000_000;
            (
                backend.map(|b| b.to_string()),
                Some(ends.saturating_sub(crate::clock::monotonic_ns()) / 1_000_000_000),
            )
        }
        None => (None, None),
    };
    Some(Pin {
        timeout_seconds,
        endpoint,
        already_pinned: trace.moved(Counter::AffinityHit) > 0,
        expires_in_seconds,
    })
}

/// The report's line for a pin.
pub fn text(pin: &Pin) -> String {
    let Some(endpoint) = &pin.endpoint else {
        return format!(
            "ClientIP, {} s: this client is pinned to no endpoint",
            pin.timeout_seconds
        );
    };
    let how = if pin.already_pinned {
        "was already pinned to"
    } else {
        "is now pinned to"
    };
    let left = pin
        .expires_in_seconds
        .map(|s| format!(" for {s} s more without a new connection"))
        .unwrap_or_default();
    format!(
        "ClientIP, {} s: this client {how} {endpoint}{left}",
        pin.timeout_seconds
    )
}
