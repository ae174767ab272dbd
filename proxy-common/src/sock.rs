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
pub struct SockKey {
    pub cookie: u64,
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// A [`SockDirection`] as `u8`.
    pub direction: u8,
}

impl SockKey {
    pub const fn new(cookie: u64, addr_be: u32, port_be: u16, proto: u8, d: SockDirection) -> Self {
        Self {
            cookie,
            addr_be,
            port_be,
            proto,
            direction: d as u8,
        }
    }
}

/// Value of `SOCKETS`: the other side of the translation.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SockValue {
    pub addr_be: u32,
    pub port_be: u16,
    pub _pad: u16,
    /// The frontend's service id, to tell which sockets a service concerns.
    pub service_id: u32,
    pub backend_id: u32,
}
