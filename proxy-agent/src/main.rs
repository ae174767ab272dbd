//! Thin binary: start-up (flags, config, --version, --write-config-to, --cleanup,
//! --init-only, sysctls, OOM score) lives in `proxy_agent::startup`, the
//! runtime in `proxy_agent::agent`. The subcommands (`proxy-agent explain
//! ...`, `proxy_agent::cli`) are recognised by name in first position before
//! kube-proxy's flat flags are parsed, so those stay exactly upstream's.

use std::{ffi::OsString, process::ExitCode};

use proxy_agent::{
    agent, cli,
    startup::{self, Next},
};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Read by jemalloc itself (the crate's symbol prefix), see `proxy_agent::memory`.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8] = proxy_agent::memory::MALLOC_CONF;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = cli::main(&args) {
        return code;
    }
    let opts = match startup::prepare(args) {
        Next::Exit(code) => return code,
        Next::Run(opts) => opts,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(*opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
