//! The proxy modes: one folder each.

pub mod ebpf;
pub mod iptables;
pub mod ipvs;
pub mod nftables;
