//! The ipvs mode.

pub mod cleanup;
