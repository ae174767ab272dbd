//! Backend selection for a new flow.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use proxy_common::{
    BackendId, BackendOf, Counter, ServiceKeyOf, ServiceValue,
    maglev::{self, MAGLEV_SLOT},
    service::flags,
    slots,
};

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

/// Picks one of the `set.count` backends behind `key`: by the set's Maglev
/// table at the bucket of the hash in scratch memory (`Scratch::maglev_hash`)
/// when it has one, else uniformly at random. Its slot, id and backend.
#[inline(always)]
pub fn select<F: Ip>(
    key: &ServiceKeyOf<F>,
    set: &ServiceValue,
) -> Result<(u16, BackendId, BackendOf<F>), Counter> {
    let slot = match set.has(flags::MAGLEV) {
        true => maglev_slot(key, set.count),
        false => 0,
    };
    let slot = if slot == 0 {
        below(set.count as u32) as u16 + 1
    } else {
        slot
    };
    let backend_id = slot_backend::<F>(set, slot).ok_or(Counter::DropBackendMissing)?;
    let backend = backend::<F>(backend_id).ok_or(Counter::DropBackendMissing)?;
    Ok((slot, backend_id, backend))
}

/// The slot the Maglev table of the set at `key` gives the bucket of the
/// new flow's hash; 0 (balance at random) while the table names no slot of
/// the set: the agent rewrites tables and slots one entry at a time.
// A BPF-to-BPF call: inlined, its temporaries would sit in the new-flow
// frame, which the IPv6 path has no room left in.
#[inline(never)]
pub fn maglev_slot<F: Ip>(key: &ServiceKeyOf<F>, count: u16) -> u16 {
    maglev_lookup(key, count).unwrap_or(0)
}

#[inline(always)]
fn maglev_lookup<F: Ip>(key: &ServiceKeyOf<F>, count: u16) -> Option<u16> {
    let hash = F::scratch()?.maglev_hash;
    let (first, m) = frontend(&key.with_slot(MAGLEV_SLOT))?.maglev_table();
    if m == 0 {
        return None;
    }
    let (element, at) = maglev::locate(first, hash % m);
    let slot = *F::maglev().get(element)?.slots.get(at)?;
    (slot != 0 && slot <= count).then_some(slot)
}

/// The backend id in slot `slot` (1-based) of the set `set`.
#[inline(always)]
pub fn slot_backend<F: Ip>(set: &ServiceValue, slot: u16) -> Option<BackendId> {
    let (element, at) = slots::locate(set.slot_index(slot));
    let id = *F::slots().get(element)?.ids.get(at)?;
    (id != 0).then_some(id)
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
