//! The eBPF object, built from `proxy-ebpf` by build.rs and embedded in the binary.

pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"));

/// The program that balances traffic coming from pods.
pub const PROG_FROM_POD: &str = "tc_from_pod";
