//! The iptables mode.

pub mod cleanup;
