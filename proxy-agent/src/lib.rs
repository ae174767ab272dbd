//! The node agent: turns Service / EndpointSlice / Node state into datapath programming.

pub mod agent;
pub mod datapath;
pub mod manifests;
pub mod model;
pub mod packet;
