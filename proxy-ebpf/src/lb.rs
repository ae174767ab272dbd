//! Backend selection for a new flow.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use proxy_common::{Backend, BackendId, Counter, ServiceKey, ServiceValue};

use crate::maps::{BACKENDS, SERVICES};

/// Picks a backend of `frontend` uniformly at random.
#[inline(always)]
pub fn select(key: &ServiceKey, frontend: &ServiceValue) -> Result<(BackendId, Backend), Counter> {
    if frontend.count == 0 {
        return Err(Counter::DropNoEndpoints);
    }
    // SAFETY: helper without preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    let slot = (random % frontend.count as u32) as u16 + 1;
    // SAFETY: map values are plain data and copied out immediately.
    let slot_value =
        unsafe { SERVICES.get(&key.with_slot(slot)) }.ok_or(Counter::DropBackendMissing)?;
    let backend_id = slot_value.backend_id;
    let backend = backend(backend_id).ok_or(Counter::DropBackendMissing)?;
    Ok((backend_id, backend))
}

#[inline(always)]
pub fn backend(id: BackendId) -> Option<Backend> {
    // SAFETY: map values are plain data and copied out immediately.
    unsafe { BACKENDS.get(&id) }.copied()
}
