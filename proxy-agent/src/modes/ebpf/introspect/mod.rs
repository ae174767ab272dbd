//! What a running datapath holds and does, read from the kernel: the fill
//! and capacity of every pinned map ([`PinnedMapSet`], [`map_usage`]), the
//! counters summed over CPUs, our loaded programs with their run time and
//! count ([`our_programs`], [`bpf_stats`]), which interface runs which of
//! them in which mode ([`interfaces`]) and the socket hooks' cgroups
//! ([`cgroup_hooks`]); plus the names the agent publishes for the maps'
//! ids ([`names`]).
//!
//! Shared by `proxy-agent inspect` and the agent's metrics: each call reads
//! the kernel afresh, nothing is cached, nothing is written.
//!
//! ```text
//! PinnedMapSet::open(maps_dir) -> usage(), counters(), ids()
//! ids() -> our_programs -> interfaces(), cgroup_hooks()
//! ```

mod cgroups;
mod fill;
mod interfaces;
pub(crate) use interfaces::xdp_generic_attached;
pub mod names;
mod pinned;
mod programs;

use std::{io, path::PathBuf};

pub use cgroups::{CgroupHook, cgroup_hooks};
pub use fill::{MapUsage, map_usage};
pub use interfaces::{Attachment, Hook, InterfaceAttachments, Interfaces, interfaces};
pub use pinned::PinnedMapSet;
pub use programs::{BpfStats, ProgramStats, bpf_stats, full_name, our_programs};

#[derive(Debug, thiserror::Error)]
pub enum IntrospectError {
    #[error("{dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{dir} has no pinned map {map}")]
    Missing { dir: PathBuf, map: String },
    #[error("map {map}: {source}")]
    Map {
        map: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("walking map {map}: {source}")]
    Walk {
        map: String,
        #[source]
        source: io::Error,
    },
    #[error("listing the interfaces over rtnetlink: {0}")]
    Netlink(#[source] io::Error),
    #[error("asking which programs run on interface {ifindex}: {source}")]
    Query {
        ifindex: u32,
        #[source]
        source: io::Error,
    },
    #[error("listing the kernel's BPF links: {0}")]
    Links(#[source] io::Error),
}

impl IntrospectError {
    fn map(name: &str, source: aya::maps::MapError) -> Self {
        IntrospectError::Map {
            map: name.to_owned(),
            source,
        }
    }
}
