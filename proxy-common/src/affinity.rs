//! Session affinity (`sessionAffinity: ClientIP`): the backend each client
//! of a service port was last balanced to (`AFFINITY`, `AFFINITY6`). A
//! frontend with [`crate::service::flags::AFFINITY`] keeps its timeout in
//! slot 0's `backend_id` (seconds); a new connection within the timeout of
//! the client's previous one goes to the same backend while that backend
//! still holds its slot, and refreshes the timestamp, as upstream's
//! `recent` match does.

use crate::family::{Family, V4, V6};

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKeyOf<F: Family> {
    pub service_id: u32,
    pub client_be: F::Addr,
}

pub type AffinityKey = AffinityKeyOf<V4>;
pub type AffinityKey6 = AffinityKeyOf<V6>;

#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    /// When the client last opened a connection to the service port.
    pub last_ns: u64,
    pub backend_id: u32,
    /// Where the backend was: its slot in the frontend's `scope` set. A
    /// slot that holds another backend now (it left, or became unusable)
    /// ends the affinity.
    pub slot: u16,
    pub scope: u8,
    pub _pad: u8,
}
