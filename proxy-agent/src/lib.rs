//! The node agent: turns Service / EndpointSlice / Node state into datapath programming.

pub mod agent;
pub mod cleanup;
pub mod config_watch;
pub mod datapath;
pub mod explain;
pub mod hostsetup;
pub mod manifests;
pub mod model;
pub mod options;
pub mod packet;
pub mod runner;
pub mod startup;
pub mod sync;
pub mod watch;
