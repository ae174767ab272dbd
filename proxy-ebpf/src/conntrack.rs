//! Flow state: which backend a flow uses and how to reverse-translate replies.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use proxy_common::{
    Counter, CtKey, CtValue,
    conntrack::{REFRESH_INTERVAL_NS, TCP_IDLE_TIMEOUT_NS, UDP_IDLE_TIMEOUT_NS},
    proto,
};

use crate::maps::CONNTRACK;

#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The live entry for `key`, refreshing its idle timer; expired entries count as absent.
#[inline(always)]
pub fn lookup(key: &CtKey, now: u64) -> Option<CtValue> {
    let entry = CONNTRACK.get_ptr_mut(key)?;
    // SAFETY: the pointer from the map lookup stays valid for this program run.
    let entry = unsafe { &mut *entry };
    let timeout = if key.proto == proto::TCP {
        TCP_IDLE_TIMEOUT_NS
    } else {
        UDP_IDLE_TIMEOUT_NS
    };
    let idle = now.saturating_sub(entry.last_seen_ns);
    if idle > timeout {
        return None;
    }
    if idle > REFRESH_INTERVAL_NS {
        entry.last_seen_ns = now;
    }
    Some(*entry)
}

#[inline(always)]
pub fn insert(key: &CtKey, value: &CtValue) -> Result<(), Counter> {
    CONNTRACK
        .insert(key, value, 0)
        .map_err(|_| Counter::DropConntrackFull)
}
