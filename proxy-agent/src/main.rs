//! Thin binary: start-up (flags, config, --version, --write-config-to, --cleanup,
//! --init-only, sysctls, OOM score) lives in `proxy_agent::startup`, the
//! runtime in `proxy_agent::agent`.

use std::process::ExitCode;

use proxy_agent::{
    agent,
    startup::{self, Next},
};

fn main() -> ExitCode {
    let opts = match startup::prepare(std::env::args_os()) {
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
