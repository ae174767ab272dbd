//! The node agent: turns Service / EndpointSlice / Node state into datapath programming.

pub mod cleanup;
pub mod datapath;
pub mod hostsetup;
pub mod model;
pub mod options;
pub mod runner;
pub mod startup;
pub mod sync;
pub mod watch;
