//! Session affinity (`sessionAffinity: ClientIP`, see
//! `proxy_common::affinity`): a client's new connection goes to the backend
//! its previous one went to, within the service's timeout, while that
//! backend still holds its slot in the set the traffic policy chose.

use proxy_common::{
    AffinityKeyOf, AffinityValue, BackendId, BackendOf, ServiceKeyOf, ServiceValue,
};

use crate::{ip::Ip, lb};

/// The backend `client` is pinned to in the set `set` (found at
/// `set_key`), its timestamp refreshed; `None` when there is none, it expired,
/// or its slot holds another backend now.
#[inline(always)]
pub fn pinned<F: Ip>(
    frontend: &ServiceValue,
    set_key: &ServiceKeyOf<F>,
    set: &ServiceValue,
    client: F::Addr,
    now: u64,
) -> Option<(BackendId, BackendOf<F>)> {
    // In scratch memory: the IPv6 new-flow path has no stack to spare.
    let key = &mut F::scratch()?.affinity_key;
    *key = AffinityKeyOf::<F> {
        service_id: frontend.service_id,
        client_be: client,
    };
    // SAFETY: a pointer into the map's value, used before this program returns.
    let entry = unsafe { &mut *F::affinity().get_ptr_mut(key)? };
    if now.saturating_sub(entry.last_ns) > frontend.affinity_timeout_ns()
        || entry.scope != set_key.scope
        || entry.slot == 0
        || entry.slot > set.count
    {
        return None;
    }
    if lb::slot_backend::<F>(set, entry.slot)? != entry.backend_id {
        return None;
    }
    let backend = lb::backend::<F>(entry.backend_id)?;
    entry.last_ns = now;
    Some((entry.backend_id, backend))
}

/// Pins `client` to the backend in `slot` of the set at `set_key`.
#[inline(always)]
pub fn pin<F: Ip>(
    frontend: &ServiceValue,
    set_key: &ServiceKeyOf<F>,
    client: F::Addr,
    (slot, backend_id): (u16, BackendId),
    now: u64,
) {
    let Some(scratch) = F::scratch() else {
        return;
    };
    scratch.affinity_key = AffinityKeyOf::<F> {
        service_id: frontend.service_id,
        client_be: client,
    };
    scratch.affinity = AffinityValue {
        last_ns: now,
        backend_id,
        slot,
        scope: set_key.scope,
        _pad: 0,
    };
    // A full table evicts the least recently used client; nothing fails.
    let _ = F::affinity().insert(&scratch.affinity_key, &scratch.affinity, 0);
}
