//! The nftables mode.

pub mod cleanup;
