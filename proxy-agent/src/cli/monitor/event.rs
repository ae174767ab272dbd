//! One reported decision, filtered and described for people and scripts.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, SystemTime},
};

use proxy_common::{
    Counter,
    monitor::{event_flags, hook, kind},
    proto,
};
use serde::Serialize;

use crate::{
    cli::inspect::{args::EndpointFilter, names::Naming, services::ServiceTables},
    health::format_time,
    modes::ebpf::monitor::{Report, monotonic_ns},
};

/// `--service` and `--address`.
pub struct Filter {
    /// The service ports `--service` names.
    pub service_ids: Option<BTreeSet<u32>>,
    /// Their frontends: drops and rejects carry the address, not the id.
    pub frontends: BTreeSet<(SocketAddr, u8)>,
    pub address: Option<EndpointFilter>,
}

impl Filter {
    pub fn with_frontends(mut self, tables: &ServiceTables) -> Self {
        if let Some(ids) = &self.service_ids {
            self.frontends = tables
                .entries
                .iter()
                .filter(|(k, v)| k.slot == 0 && ids.contains(&v.service_id))
                .map(|(k, _)| (SocketAddr::new(k.addr, u16::from_be(k.port_be)), k.proto))
                .collect();
        }
        self
    }

    pub fn matches(&self, e: &Report) -> bool {
        let service = self.service_ids.as_ref().is_none_or(|ids| {
            ids.contains(&e.service_id) || self.frontends.contains(&(e.destination, e.proto))
        });
        let address = self
            .address
            .is_none_or(|a| endpoints(e).iter().any(|s| a.matches(s.ip(), s.port())));
        service && address
    }
}

/// Every address an event names.
fn endpoints(e: &Report) -> Vec<SocketAddr> {
    let mut all = vec![e.source, e.destination];
    if e.kind == kind::FLOW {
        all.push(e.translated_source);
        all.push(e.translated_destination);
    }
    all
}

/// Turns the programs' monotonic times into wall-clock times.
pub struct WallClock {
    wall: SystemTime,
    monotonic: u64,
}

impl WallClock {
    pub fn now() -> Self {
        WallClock {
            wall: SystemTime::now(),
            monotonic: monotonic_ns(),
        }
    }

    fn at(&self, monotonic: u64) -> SystemTime {
        if monotonic >= self.monotonic {
            self.wall + Duration::from_nanos(monotonic - self.monotonic)
        } else {
            self.wall - Duration::from_nanos(self.monotonic - monotonic)
        }
    }
}

/// An event in words; its JSON form is one line of `--output json`.
#[derive(Debug, Serialize)]
pub struct Described {
    pub time: String,
    /// `drop`, `reject` or `flow`.
    pub kind: &'static str,
    /// The counter that counted it (`drop_source_range`, `new_flow`, ...).
    pub reason: &'static str,
    pub program: &'static str,
    /// The interface it arrived on (none for the socket hooks).
    pub interface: Option<String>,
    pub protocol: &'static str,
    pub source: String,
    pub destination: String,
    /// Flows: the tuple it left with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated_source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated_destination: Option<String>,
    /// `namespace/name:port/PROTOCOL` when known.
    pub service: Option<String>,
    pub service_id: Option<u32>,
    pub backend_id: Option<u32>,
    /// Flows: the source was rewritten (masquerade, or a port of its own).
    pub snat: bool,
}

impl Described {
    pub fn new(e: &Report, clock: &WallClock, naming: &Naming) -> Self {
        let flow = e.kind == kind::FLOW;
        let service_id = (e.service_id != 0).then_some(e.service_id);
        Described {
            time: format_time(clock.at(e.time_ns)),
            kind: match e.kind {
                kind::DROP => "drop",
                kind::REJECT => "reject",
                kind::FLOW => "flow",
                _ => "unknown",
            },
            reason: Counter::ALL
                .iter()
                .find(|c| **c as u8 == e.reason)
                .map_or("unknown", |c| c.name()),
            program: match e.hook {
                hook::FROM_POD => "tc_from_pod",
                hook::FROM_NETDEV => "tc_from_netdev",
                hook::XDP => "xdp_from_netdev",
                hook::FROM_HOST => "tc_from_host",
                hook::SOCKET if e.destination.is_ipv6() => "sock_connect6",
                hook::SOCKET => "sock_connect4",
                _ => "unknown",
            },
            interface: (e.ifindex != 0).then(|| interface_name(e.ifindex)),
            protocol: match e.proto {
                proto::TCP => "TCP",
                proto::UDP => "UDP",
                proto::SCTP => "SCTP",
                0 => "-",
                _ => "other",
            },
            source: e.source.to_string(),
            destination: e.destination.to_string(),
            translated_source: flow.then(|| e.translated_source.to_string()),
            translated_destination: flow.then(|| e.translated_destination.to_string()),
            service: service_id
                .and_then(|id| naming.service(id))
                .map(|s| s.port_name()),
            service_id,
            backend_id: (e.backend_id != 0).then_some(e.backend_id),
            snat: e.flags & event_flags::SNAT != 0,
        }
    }

    pub fn text(&self) -> String {
        let mut line = format!(
            "{} {:<6} {:<24} {:<15} {:<10} {:<4} {} -> {}",
            self.time,
            self.kind.to_uppercase(),
            self.reason,
            self.program,
            self.interface.as_deref().unwrap_or("-"),
            self.protocol,
            self.source,
            self.destination,
        );
        if let (Some(s), Some(d)) = (&self.translated_source, &self.translated_destination) {
            line.push_str(&format!(" => {s} -> {d}"));
        }
        match (&self.service, self.service_id) {
            (Some(name), _) => line.push_str(&format!(" {name}")),
            (None, Some(id)) => line.push_str(&format!(" service#{id}")),
            _ => {}
        }
        if let Some(b) = self.backend_id {
            line.push_str(&format!(" backend#{b}"));
        }
        if self.snat {
            line.push_str(" snat");
        }
        line
    }
}

fn interface_name(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname requires.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return format!("if#{ifindex}");
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
