//! The node agent: turns Service / EndpointSlice / Node state into datapath programming.

pub mod datapath;
pub mod model;
pub mod runner;
pub mod sync;
pub mod watch;
