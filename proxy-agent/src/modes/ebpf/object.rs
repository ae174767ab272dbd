//! The eBPF object, built from `proxy-ebpf` by build.rs and embedded in the binary.

pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"));

/// TC ingress of pod-facing interfaces.
pub const PROG_FROM_POD: &str = "tc_from_pod";
/// TC ingress of the node's external interfaces.
pub const PROG_FROM_NETDEV: &str = "tc_from_netdev";
/// XDP on the node's external interfaces.
pub const PROG_XDP: &str = "xdp_from_netdev";
