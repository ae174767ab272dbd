//! The backend-neutral service model: what every proxy mode programs.
//!
//! Kubernetes objects go in; a [`DesiredState`] keyed by [`ServicePortName`]
//! comes out. Modes (ebpf today) only translate this, never the API objects,
//! so all of them make the same decisions.

mod build;

use std::{collections::BTreeMap, fmt, net::IpAddr};

pub use build::build_desired_state;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: Option<&str>) -> Option<Self> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn ip_proto(self) -> u8 {
        match self {
            Protocol::Tcp => proxy_common::proto::TCP,
            Protocol::Udp => proxy_common::proto::UDP,
            Protocol::Sctp => proxy_common::proto::SCTP,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// Upstream's key: namespace/name plus the service port's name and protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        write!(f, "/{}", self.protocol)
    }
}

/// One endpoint address and the target port resolved for this service port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// True when the endpoint runs on this node.
    pub is_local: bool,
}

/// Everything a mode needs to program one service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub name: ServicePortName,
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
    /// Endpoints to use for traffic that is balanced cluster-wide, already
    /// filtered by readiness (and later topology) rules.
    pub cluster_endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<ServicePortName, DesiredService>,
}
