//! Backend selection for a new flow.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use proxy_common::{BackendId, BackendOf, Counter, ServiceKeyOf, ServiceValue};

use crate::ip::Ip;

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

/// Picks one of the `set.count` backends behind `key` uniformly at random:
/// its slot, id and backend.
#[inline(always)]
pub fn select<F: Ip>(
    key: &ServiceKeyOf<F>,
    set: &ServiceValue,
) -> Result<(u16, BackendId, BackendOf<F>), Counter> {
    let slot = below(set.count as u32) as u16 + 1;
    // SAFETY: map values are plain data and copied out immediately.
    let backend_id = frontend(&key.with_slot(slot))
        .ok_or(Counter::DropBackendMissing)?
        .backend_id;
    let backend = backend::<F>(backend_id).ok_or(Counter::DropBackendMissing)?;
    Ok((slot, backend_id, backend))
}

#[inline(always)]
pub fn backend<F: Ip>(id: BackendId) -> Option<BackendOf<F>> {
    // SAFETY: map values are plain data and copied out immediately.
    unsafe { F::backends().get(&id) }.copied()
}

#[inline(always)]
pub fn frontend<F: Ip>(key: &ServiceKeyOf<F>) -> Option<ServiceValue> {
    // The key is looked up from scratch memory: the IPv6 path has no stack
    // to spare for the several a packet needs.
    let at = &mut F::scratch()?.service;
    *at = *key;
    // SAFETY: map values are plain data and copied out immediately.
    unsafe { F::services().get(at) }.copied()
}
