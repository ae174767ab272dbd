//! The service map: one frontend entry (slot 0) and one entry per backend slot.
//!
//! Looking up `(vip, port, proto, slot 0)` gives the frontend with its backend
//! `count`; slots `1..=count` each hold a [`crate::BackendId`]. The agent writes
//! slots before it raises `count`, so the datapath never reads an unwritten slot.

/// Key of the `SERVICES` map.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub addr_be: u32,
    pub port_be: u16,
    /// 0 is the frontend entry; 1.. are backend slots.
    pub slot: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

impl ServiceKey {
    pub const fn frontend(addr_be: u32, port_be: u16, proto: u8) -> Self {
        Self {
            addr_be,
            port_be,
            slot: 0,
            proto,
            _pad: [0; 3],
        }
    }

    pub const fn with_slot(self, slot: u16) -> Self {
        Self { slot, ..self }
    }
}

/// Value of the `SERVICES` map. In slot 0 `count` is the number of backend
/// slots; in slots 1.. `backend_id` names the backend.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    pub backend_id: u32,
    pub count: u16,
    /// Identifies the frontend in conntrack entries and stats.
    pub service_id: u16,
    pub flags: u16,
    pub _pad: u16,
}

impl ServiceValue {
    pub const fn frontend(count: u16, service_id: u16, flags: u16) -> Self {
        Self {
            backend_id: 0,
            count,
            service_id,
            flags,
            _pad: 0,
        }
    }

    pub const fn slot(backend_id: u32, service_id: u16) -> Self {
        Self {
            backend_id,
            count: 0,
            service_id,
            flags: 0,
            _pad: 0,
        }
    }
}
