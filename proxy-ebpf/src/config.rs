//! The agent's node-wide settings, and who counts as a local pod.

use aya_ebpf::maps::lpm_trie::Key;
use proxy_common::{
    DatapathConfig, Ipv4Prefix,
    config::{flags, iface},
};

use crate::maps::{CONFIG, IFACES, LOCAL_POD_CIDRS};

#[inline(always)]
pub fn get() -> DatapathConfig {
    CONFIG.get(0).copied().unwrap_or_default()
}

/// Whether upstream's local-traffic detector (detectLocalMode) would call
/// this packet pod traffic from this node.
#[inline(always)]
pub fn from_local_pod(config: &DatapathConfig, saddr_be: u32, ifindex: u32) -> bool {
    if config.flags & flags::DETECT_LOCAL_BY_CIDR != 0 {
        let key = Key::new(32, Ipv4Prefix { addr_be: saddr_be });
        return LOCAL_POD_CIDRS.get(&key).is_some();
    }
    if config.flags & flags::DETECT_LOCAL_BY_INTERFACE != 0 {
        // SAFETY: map values are plain data and copied out immediately.
        return unsafe { IFACES.get(&ifindex) }.is_some_and(|i| i.flags & iface::LOCAL_POD != 0);
    }
    false
}

/// Whether a detector is configured at all (upstream's "IsImplemented").
#[inline(always)]
pub fn detects_local(config: &DatapathConfig) -> bool {
    config.flags & (flags::DETECT_LOCAL_BY_CIDR | flags::DETECT_LOCAL_BY_INTERFACE) != 0
}
