//! The end-to-end tier: network namespaces, real traffic and the agent on a
//! node. Two-node testbeds with the agent on both nodes, `explain --online`
//! against a running agent, `--cleanup` and `--init-only` inside test
//! namespaces, and the start-up and restart checks that ask this host whether
//! a mode works. Everything is built in namespaces the tests create, with
//! addresses from 198.18.0.0/15, and removed on every exit path. Needs root.

#[path = "../shared/abi5.rs"]
mod abi5;
#[path = "../shared/bpffs.rs"]
mod bpffs;
#[path = "../shared/explain_common.rs"]
mod explain_common;
#[path = "../shared/http_client.rs"]
mod http_client;
#[path = "../shared/options_common.rs"]
mod options_common;
#[path = "../shared/sock_client.rs"]
mod sock_client;

mod cleanup_common;
mod support;

mod capabilities;
mod cleanup_binary;
mod cleanup_netns;
mod e2e_affinity;
mod e2e_cluster;
mod e2e_clusterip;
mod e2e_dual_stack;
mod e2e_host_network;
mod e2e_restart;
mod e2e_rule_modes;
mod e2e_sctp;
mod explain;
mod flow_suite;
mod inspect;
mod monitor;
mod operability;
mod options_binary;
mod options_config_watch;
mod socket_lb;
