//! The agent's subcommands for operators (`explain` today). Shared by them:
//! [`pins`] (the running agent's pinned maps) and [`packet`] (frames).

pub mod explain;
pub mod packet;
pub mod pins;
