//! The agent's subcommands for operators (`explain` today).

pub mod explain;
pub mod packet;
