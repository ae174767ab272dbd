//! The kernel tier: the real eBPF programs in the real kernel, through
//! BPF_PROG_TEST_RUN, with maps the agent's own programmer fills. Nothing is
//! attached and no packet is sent; tests that need routes for the FIB build
//! them in a network namespace of their own thread. `explain` runs the
//! binary's offline form, which does the same in a namespace of its own.
//! Needs root (CAP_BPF); these tests fail rather than skip without it.

#[path = "../shared/abi5.rs"]
mod abi5;
#[path = "../shared/bpffs.rs"]
mod bpffs;
#[path = "../shared/explain_common.rs"]
mod explain_common;
mod tester;

mod batched_writes;
mod collector_softirqs;
mod datapath_affinity;
mod datapath_conntrack;
mod datapath_frontends;
mod datapath_ipv6;
mod datapath_kernel;
mod datapath_maglev;
mod datapath_sctp;
mod explain;
mod explain_ipv6;
mod fuzz_datapath;
mod introspect_fill;
mod ipvs_mode;
mod monitor_events;
mod pins_migration;
mod rule_modes;
mod upstream_flows;
