//! The backend map: endpoints keyed by an id the agent allocates, shared by
//! every service that uses the same address, port and protocol.

pub type BackendId = u32;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
}
