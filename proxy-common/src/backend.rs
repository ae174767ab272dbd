//! The backend map: endpoints keyed by an id the agent allocates, shared by
//! every service that uses the same address, port and protocol.

use crate::family::{Family, V4, V6};

pub type BackendId = u32;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendOf<F: Family> {
    pub addr_be: F::Addr,
    pub port_be: u16,
    pub proto: u8,
    /// Bits of [`flags`].
    pub flags: u8,
}

/// Bits of [`Backend::flags`].
/// An IPv4 endpoint (`BACKENDS`).
pub type Backend = BackendOf<V4>;
/// An IPv6 endpoint (`BACKENDS6`).
pub type Backend6 = BackendOf<V6>;

pub mod flags {
    /// The endpoint is this node itself (a hostNetwork pod here): traffic
    /// to it is delivered locally, so it is never masqueraded, and its
    /// replies leave through the node's stack, where `tc_from_host`
    /// translates them back.
    pub const HOST_LOCAL: u8 = 1 << 0;
}
