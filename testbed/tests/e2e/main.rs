//! The testbed itself, in one binary: a testbed and a two-node cluster
//! leave nothing behind (on drop, panic and signals), and who reaches whom,
//! what the lan carries and how XDP_TX frames travel. Needs root (it creates
//! network namespaces).

mod cleanup;
mod cluster;
