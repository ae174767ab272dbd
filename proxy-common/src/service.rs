//! The service map: per frontend, one entry (slot 0) naming its backend slots.
//!
//! Looking up `(addr, port, proto, scope, slot 0)` gives the frontend with its
//! backend `count` and `first_slot`: its backends are `count` consecutive
//! elements of the slots array (`crate::slots`), numbered 1..=count. The
//! agent writes slots before it raises `count`, so the datapath never reads
//! an unwritten slot. The key's `slot` field also names a frontend's Maglev
//! table reference ([`crate::maglev::MAGLEV_SLOT`]); snapshots the agent
//! reads present each backend slot as a key with its slot number.
//!
//! A frontend whose traffic policy is Local keeps its node-local backends in
//! [`Scope::Primary`] and, when it is external, the cluster-wide backends in
//! [`Scope::ClusterWide`]: those serve clients upstream treats as "local"
//! (pods of this node), which bypass the external traffic policy.

use crate::family::{Family, V4, V6};

#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Primary = 0,
    ClusterWide = 1,
}

/// Key of the `SERVICES` map.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKeyOf<F: Family> {
    pub addr_be: F::Addr,
    pub port_be: u16,
    /// 0 is the frontend entry; [`crate::maglev::MAGLEV_SLOT`] its Maglev
    /// table reference; 1.. name backend slots in snapshots only.
    pub slot: u16,
    pub proto: u8,
    /// A [`Scope`] as `u8`.
    pub scope: u8,
    pub _pad: [u8; 2],
}

/// An IPv4 frontend or backend slot (`SERVICES`).
pub type ServiceKey = ServiceKeyOf<V4>;
/// An IPv6 one (`SERVICES6`).
pub type ServiceKey6 = ServiceKeyOf<V6>;

impl<F: Family> ServiceKeyOf<F> {
    pub const fn frontend(addr_be: F::Addr, port_be: u16, proto: u8) -> Self {
        Self {
            addr_be,
            port_be,
            slot: 0,
            proto,
            scope: Scope::Primary as u8,
            _pad: [0; 2],
        }
    }

    /// The entry that marks `addr_be` as a cluster IP: traffic to one of its
    /// ports that is not a service port is rejected, as upstream's nftables mode does.
    pub const fn cluster_ip(addr_be: F::Addr) -> Self {
        Self::frontend(addr_be, 0, 0)
    }

    pub const fn with_slot(self, slot: u16) -> Self {
        Self { slot, ..self }
    }

    pub const fn with_scope(self, scope: Scope) -> Self {
        Self {
            scope: scope as u8,
            ..self
        }
    }
}

/// What a frontend is; stored in the top bits of [`ServiceValue::flags`].
#[repr(u16)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FrontendKind {
    ClusterIp = 0,
    NodePort = 1,
    ExternalIp = 2,
    LoadBalancer = 3,
}

impl FrontendKind {
    pub const fn name(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::ExternalIp => "ExternalIP",
            FrontendKind::LoadBalancer => "LoadBalancer",
        }
    }
}

/// Bits of [`ServiceValue::flags`] in a frontend entry.
pub mod flags {
    /// NodePort, external IP or load-balancer IP: externalTrafficPolicy applies,
    /// and with policy Cluster the traffic is masqueraded.
    pub const EXTERNAL: u16 = 1 << 0;
    /// The primary backends are this node's only (the applicable policy is Local).
    pub const POLICY_LOCAL: u16 = 1 << 1;
    /// Sources must match the service's loadBalancerSourceRanges.
    pub const SOURCE_RANGES: u16 = 1 << 2;
    /// No usable endpoint exists anywhere: reject instead of drop when `count` is 0.
    pub const REJECT_WHEN_EMPTY: u16 = 1 << 3;
    /// A [`super::ServiceKey::cluster_ip`] marker, not a frontend.
    pub const CLUSTER_IP_MARKER: u16 = 1 << 4;
    /// Served to this node's own sockets only (localhost NodePorts): the
    /// per-packet programs pass traffic to it, as upstream drops martian
    /// packets to 127.0.0.0/8 that did not come from the node itself.
    pub const HOST_ONLY: u16 = 1 << 5;
    /// `sessionAffinity: ClientIP`: slot 0's `backend_id` is the timeout in
    /// seconds (see [`crate::affinity`]).
    pub const AFFINITY: u16 = 1 << 6;
    /// Balanced by Maglev consistent hashing: the table is named by the
    /// entry at [`crate::maglev::MAGLEV_SLOT`] (see [`crate::maglev`]).
    pub const MAGLEV: u16 = 1 << 7;
    pub const KIND_SHIFT: u16 = 12;
}

/// Value of the `SERVICES` map. In slot 0 `count` is the number of backend
/// slots and `first_slot` the array index of slot 1; in a snapshot's slot
/// 1.. `backend_id` names the backend.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    pub backend_id: u32,
    /// Identifies the service port in conntrack entries, source ranges and stats.
    pub service_id: u32,
    pub count: u16,
    pub flags: u16,
    /// Index in the slots array (`crate::slots`) of backend slot 1.
    pub first_slot: u32,
}

impl ServiceValue {
    pub const fn frontend(count: u16, service_id: u32, flags: u16) -> Self {
        Self {
            backend_id: 0,
            service_id,
            count,
            flags,
            first_slot: 0,
        }
    }

    /// A backend slot as a snapshot presents it (no map holds such an entry).
    pub const fn slot(backend_id: u32, service_id: u32) -> Self {
        Self {
            backend_id,
            service_id,
            count: 0,
            flags: 0,
            first_slot: 0,
        }
    }

    /// The array index (`crate::slots`) of backend slot `slot` (1-based).
    pub const fn slot_index(&self, slot: u16) -> u32 {
        self.first_slot.wrapping_add(slot as u32).wrapping_sub(1)
    }

    /// The entry at [`crate::maglev::MAGLEV_SLOT`]: the frontend's Maglev
    /// table starts at element `first_chunk` and has `m` buckets.
    pub const fn maglev_ref(first_chunk: u32, m: u32) -> Self {
        Self {
            backend_id: first_chunk,
            service_id: m,
            count: 0,
            flags: 0,
            first_slot: 0,
        }
    }

    /// Of a [`ServiceValue::maglev_ref`]: (first chunk, buckets).
    pub const fn maglev_table(&self) -> (u32, u32) {
        (self.backend_id, self.service_id)
    }

    /// The affinity timeout of a frontend with [`flags::AFFINITY`], in nanoseconds.
    pub const fn affinity_timeout_ns(&self) -> u64 {
        self.backend_id as u64 * 1_000_000_000
    }

    pub const fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    pub const fn kind(&self) -> FrontendKind {
        match self.flags >> flags::KIND_SHIFT {
            1 => FrontendKind::NodePort,
            2 => FrontendKind::ExternalIp,
            3 => FrontendKind::LoadBalancer,
            _ => FrontendKind::ClusterIp,
        }
    }

    pub const fn kind_flags(kind: FrontendKind) -> u16 {
        (kind as u16) << flags::KIND_SHIFT
    }
}
