//! The pure tier: no root, no kernel, no network namespace, and fast. The
//! options (flags, files, validation, checks, the binary's command line), the
//! model, the sync engine and its runner, the API and manifests sources, and
//! the parts of `--cleanup` checked against fakes. Runs first, to fail early.

// The e2e bench's hosts file, read here as the bench reads it.
#[allow(dead_code)]
#[path = "../../benches/end_to_end/hosts.rs"]
mod bench_hosts;
// The e2e bench's count of the CPU time around an endpoint change.
#[allow(dead_code)]
#[path = "../../benches/end_to_end/cpu_taken.rs"]
mod bench_cpu_taken;
#[path = "../shared/http_client.rs"]
mod http_client;
#[path = "../shared/http_serve.rs"]
mod http_serve;
#[path = "../shared/options_common.rs"]
mod options_common;

mod bench_cpu_counts;
mod bench_hosts_file;
mod cleanup_fakes;
mod deploy_manifests;
mod events_api;
mod health_proxy;
mod health_service_ports;
mod manifests_source;
mod metrics_upstream;
mod model_build;
mod model_categorize;
mod model_trackers;
mod options_binary;
mod options_checks;
mod options_config_watch;
mod options_decode;
mod options_defaults;
mod options_flags;
mod options_hostsetup;
mod options_precedence;
mod options_validation;
mod options_write_config;
mod parsers_fuzz;
mod runner_bounded_frequency;
mod runner_sync_engine;
mod watch_api;
