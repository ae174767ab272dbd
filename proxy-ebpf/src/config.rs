//! The agent's node-wide settings, and who counts as a local pod.

use aya_ebpf::maps::lpm_trie::Key;
use proxy_common::{
    DatapathConfig, PrefixOf,
    config::{flags, iface},
};

use crate::{
    ip::Ip,
    maps::{CONFIG, IFACES},
};

/// The settings, in place (not copied: the stack is short). Entry 0 of an
/// array always exists (zeroed until the agent writes it, which means the
/// built-in defaults); `None` never happens but must be handled.
#[inline(always)]
pub fn get() -> Option<&'static DatapathConfig> {
    CONFIG.get(0)
}

/// Whether `daddr_be` is inside one of the cluster's service CIDRs.
#[inline(always)]
pub fn in_service_cidr<F: Ip>(config: &DatapathConfig, daddr_be: F::Addr) -> bool {
    if config.flags & flags::SERVICE_CIDRS == 0 {
        return false;
    }
    let key = Key::new(F::BITS, PrefixOf::<F> { addr_be: daddr_be });
    F::service_cidrs().get(&key).is_some()
}

/// Whether upstream's local-traffic detector (detectLocalMode) would call
/// this packet pod traffic from this node.
#[inline(always)]
pub fn from_local_pod<F: Ip>(config: &DatapathConfig, saddr_be: F::Addr, ifindex: u32) -> bool {
    if config.flags & F::DETECT_LOCAL_BY_CIDR != 0 {
        let key = Key::new(F::BITS, PrefixOf::<F> { addr_be: saddr_be });
        return F::local_pod_cidrs().get(&key).is_some();
    }
    if config.flags & flags::DETECT_LOCAL_BY_INTERFACE != 0 {
        // SAFETY: map values are plain data and copied out immediately.
        return unsafe { IFACES.get(&ifindex) }.is_some_and(|i| i.flags & iface::LOCAL_POD != 0);
    }
    false
}

/// Whether a detector is configured at all (upstream's "IsImplemented").
#[inline(always)]
pub fn detects_local<F: Ip>(config: &DatapathConfig) -> bool {
    config.flags & (F::DETECT_LOCAL_BY_CIDR | flags::DETECT_LOCAL_BY_INTERFACE) != 0
}
