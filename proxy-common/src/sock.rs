//! The socket-level balancer's memory (`SOCKETS`): which service
//! address a socket asked for when the connect or sendmsg hook pointed it at
//! a backend, so `getpeername` and UDP `recvmsg` show the service address
//! and the application never sees the backend.

//!
//! Each translation leaves two entries, as conntrack does: keyed by the
//! backend ([`SockDirection::Reverse`], the address the application must be
//! shown instead), and, for UDP sends, keyed by the service
//! ([`SockDirection::Forward`], the backend this socket's datagrams to the
//! service keep going to, as the kernel's conntrack keeps a UDP flow on one
//! endpoint).

use crate::family::{Family, V4, V6};

#[repr(u8)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SockDirection {
    /// Keyed by the backend; the value is the service address.
    Reverse = 0,
    /// Keyed by the service address; the value is the backend.
    Forward = 1,
}

/// Key of `SOCKETS`: the socket (its cookie) and the address it talks to.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKeyOf<F: Family> {
    pub cookie: u64,
    pub addr_be: F::Addr,
    pub port_be: u16,
    pub proto: u8,
    /// A [`SockDirection`] as `u8`.
    pub direction: u8,
    /// Nothing for IPv4; IPv6 keys end 4 bytes short of their 8-byte alignment.
    pub _tail: F::TailPad,
}

/// An IPv4 socket's translation (`SOCKETS`).
pub type SockKey = SockKeyOf<V4>;
/// An IPv6 socket's translation (`SOCKETS6`).
pub type SockKey6 = SockKeyOf<V6>;

impl<F: Family> SockKeyOf<F> {
    pub fn new(cookie: u64, addr_be: F::Addr, port_be: u16, proto: u8, d: SockDirection) -> Self {
        Self {
            cookie,
            addr_be,
            port_be,
            proto,
            direction: d as u8,
            _tail: F::TailPad::default(),
        }
    }
}

/// Value of `SOCKETS`: the other side of the translation.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SockValueOf<F: Family> {
    pub addr_be: F::Addr,
    pub port_be: u16,
    pub _pad: u16,
    /// The frontend's service id, to tell which sockets a service concerns.
    pub service_id: u32,
    pub backend_id: u32,
}

pub type SockValue = SockValueOf<V4>;
pub type SockValue6 = SockValueOf<V6>;
