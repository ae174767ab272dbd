//! Backend selection for a new flow.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use proxy_common::{Backend, BackendId, Counter, ServiceKey, ServiceValue};

use crate::maps::{BACKENDS, SERVICES};

/// A random number below `n` (0 when `n` is 0); the guard sits next to the
/// division so the compiler sees it and emits no panic path.
#[inline(always)]
pub fn below(n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    // SAFETY: helper without preconditions.
    unsafe { bpf_get_prandom_u32() % n }
}

/// Picks one of the `set.count` backends behind `key` uniformly at random.
#[inline(always)]
pub fn select(key: &ServiceKey, set: &ServiceValue) -> Result<(BackendId, Backend), Counter> {
    let slot = below(set.count as u32) as u16 + 1;
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

#[inline(always)]
pub fn frontend(key: &ServiceKey) -> Option<ServiceValue> {
    // SAFETY: map values are plain data and copied out immediately.
    unsafe { SERVICES.get(key) }.copied()
}
