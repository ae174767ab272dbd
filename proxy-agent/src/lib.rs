//! The node agent: turns Service / EndpointSlice / Node state into datapath programming.

pub mod agent;
pub mod cleanup;
pub mod cli;
pub mod clock;
pub mod events;
pub mod health;
pub mod hostsetup;
pub mod httpserve;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod modes;
pub mod options;
pub mod serving;
pub mod sources;
pub mod startup;
pub mod sync;
