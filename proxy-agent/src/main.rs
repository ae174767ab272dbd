//! Thin binary: start-up (flags, config, --version, --write-config-to, --cleanup,
//! --init-only, sysctls, OOM score) lives in `proxy_agent::startup`.

use std::process::ExitCode;

use proxy_agent::startup::{self, Next};

fn main() -> ExitCode {
    let opts = match startup::prepare(std::env::args_os()) {
        Next::Exit(code) => return code,
        Next::Run(opts) => opts,
    };
    // The proxy runtime takes over from here: opts.mode, opts.manifests, opts.node_name,
    // opts.config (sync periods via opts.sync_period()/min_sync_period()) and opts.ebpf.
    tracing::error!(mode = %opts.mode, node = %opts.node_name, "the proxy runtime is not wired into main yet");
    ExitCode::FAILURE
}
