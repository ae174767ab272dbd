//! Keys and value types shared by the whole model.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use super::interner::{Interner, shared_str};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses a Kubernetes protocol; a missing protocol means TCP, as in the API defaults.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// Upstream's `v1.IPFamily` spelling, as health bodies and metric labels use it.
    pub fn api_name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

/// Names are shared, not copied: the trackers, the desired state and each
/// mode's programmer key their maps by them, and a copy of every string per
/// map held about 40 MB at 50,000 services.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl NamespacedName {
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        NamespacedName {
            namespace: shared_str(namespace.into()),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Upstream's key: namespace/name plus the service port's name and protocol.
///
/// Field order matters: ordering by namespace and name first lets a
/// `BTreeMap<ServicePortName, _>` be range-scanned per service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port_name: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(
        service: &NamespacedName,
        port_name: impl Into<Arc<str>>,
        protocol: Protocol,
    ) -> Self {
        ServicePortName {
            namespace: service.namespace.clone(),
            name: service.name.clone(),
            port_name: shared_str(port_name.into()),
            protocol,
        }
    }

    pub fn service(&self) -> NamespacedName {
        NamespacedName::new(self.namespace.clone(), self.name.clone())
    }

    pub fn belongs_to(&self, service: &NamespacedName) -> bool {
        self.namespace == service.namespace && self.name == service.name
    }

    /// The smallest key of `service`, for range scans.
    pub(crate) fn first_of(service: &NamespacedName) -> Self {
        ServicePortName::new(service, "", Protocol::Tcp)
    }
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

/// Where an endpoint runs and what its topology hints name. A node's
/// endpoints mostly share one, so each distinct placement is allocated once
/// ([`Placement::shared`]) and endpoints hold an `Arc` to it: at 100,000
/// endpoints that is 8 bytes each instead of four strings' worth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones`, sorted; empty when the slice carries none.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes`, sorted; empty when the slice carries none.
    pub node_hints: Vec<String>,
}

static PLACEMENTS: Interner<Placement> = Interner::new();

impl Placement {
    /// The one shared `Arc` equal to `self`.
    pub fn shared(self) -> Arc<Placement> {
        PLACEMENTS
            .find(&self)
            .unwrap_or_else(|| PLACEMENTS.share(Arc::new(self)))
    }

    /// No node, zone or hints.
    pub fn unknown() -> Arc<Placement> {
        static UNKNOWN: std::sync::LazyLock<Arc<Placement>> =
            std::sync::LazyLock::new(|| Placement::default().shared());
        UNKNOWN.clone()
    }
}

/// One endpoint address and the target port resolved for this service port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// Ready as upstream reads it: the slice's `ready` (nil = true), or any
    /// endpoint of a service with `publishNotReadyAddresses`.
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// True when the endpoint runs on this node.
    pub is_local: bool,
    /// Shared with the slice cache and every endpoint placed alike.
    pub placement: Arc<Placement>,
}

impl Default for Endpoint {
    fn default() -> Self {
        Endpoint {
            ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 0,
            ready: true,
            serving: true,
            terminating: false,
            is_local: false,
            placement: Placement::unknown(),
        }
    }
}

impl Endpoint {
    pub fn node_name(&self) -> Option<&str> {
        self.placement.node_name.as_deref()
    }

    pub fn zone(&self) -> Option<&str> {
        self.placement.zone.as_deref()
    }

    pub fn zone_hints(&self) -> &[String] {
        &self.placement.zone_hints
    }

    pub fn node_hints(&self) -> &[String] {
        &self.placement.node_hints
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.ip)
    }

    /// Upstream's "serving and terminating" fallback class.
    pub fn is_serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_placed_alike_share_their_placement() {
        let on = |node: &str| Placement {
            node_name: Some(node.into()),
            ..Placement::default()
        };
        let a = on("node-a").shared();
        assert!(Arc::ptr_eq(&a, &on("node-a").shared()));
        let ep = Endpoint {
            placement: a,
            ..Endpoint::default()
        };
        assert_eq!(ep.node_name(), Some("node-a"));
        assert_eq!(ep.zone(), None);
        let ns = NamespacedName::new(String::from("ns"), "one");
        assert!(Arc::ptr_eq(
            &ns.namespace,
            &NamespacedName::new("ns", "two").namespace
        ));
    }
}
