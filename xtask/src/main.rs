//! Project tasks: `cargo xtask <setup|build|load|test|demo|bench>`.

mod demo;
mod setup;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Set-up, build, load, tests and demo of the eBPF kube-proxy")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain and tools (Debian packages, bpf-linker, bpffs); a no-op when present.
    Setup,
    /// Build the agent (release) with the eBPF programs embedded.
    Build,
    /// Load and attach the programs on an interface (for hacking); Ctrl-C detaches.
    Load {
        /// Interface name (prefix) to attach tc_from_pod to.
        #[arg(long)]
        iface: String,
        /// Network namespace to run in (default: the current one).
        #[arg(long)]
        netns: Option<String>,
        /// Manifests to program (default: examples/demo).
        #[arg(long)]
        manifests: Option<PathBuf>,
    },
    /// Run every test: unit, kernel (BPF_PROG_TEST_RUN) and end-to-end in namespaces. Needs root.
    Test {
        /// Extra arguments passed to `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build a testbed, run the agent on the example Service and show balancing. Needs root.
    Demo,
    /// Run the benchmarks (sync engine; per-packet cost of the eBPF programs) and print their figures. Needs root.
    Bench,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    match task {
        Task::Setup => setup::ensure(),
        Task::Build => {
            setup::ensure()?;
            build()
        }
        Task::Load {
            iface,
            netns,
            manifests,
        } => {
            setup::ensure()?;
            require_root()?;
            build()?;
            let manifests = manifests.unwrap_or_else(|| workspace_root().join("examples/demo"));
            let mut cmd = match &netns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(agent_binary());
                    c
                }
                None => Command::new(agent_binary()),
            };
            cmd.arg("--manifests")
                .arg(manifests)
                .args(["--ebpf-pod-interface-prefixes", &iface]);
            println!("xtask: running {cmd:?} (Ctrl-C detaches and exits)");
            let status = cmd.status().context("starting proxy-agent")?;
            if !status.success() {
                bail!("proxy-agent exited with {status}");
            }
            Ok(())
        }
        Task::Test { args } => {
            setup::ensure()?;
            require_root()?;
            let status = cargo()
                .args(["test"])
                .args(&args)
                .status()
                .context("running cargo test")?;
            if !status.success() {
                bail!("tests failed ({status})");
            }
            Ok(())
        }
        Task::Bench => {
            setup::ensure()?;
            // The datapath bench loads the real programs into the kernel.
            require_root()?;
            let status = cargo()
                .args(["bench", "--package", "proxy-agent"])
                .args(["--bench", "model", "--bench", "datapath"])
                // The datapath bench needs the eBPF object embedded.
                .env_remove("AYA_BUILD_SKIP")
                .status()
                .context("running cargo bench")?;
            if !status.success() {
                bail!("benchmarks failed ({status})");
            }
            Ok(())
        }
        Task::Demo => {
            setup::ensure()?;
            require_root()?;
            build()?;
            demo::run(&agent_binary(), &workspace_root().join("examples/demo"))
        }
    }
}

fn build() -> anyhow::Result<()> {
    let status = cargo()
        .args(["build", "--release", "--package", "proxy-agent"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("build failed ({status})");
    }
    Ok(())
}

/// `cargo`, with the cargo bin directory (bpf-linker) on PATH.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root())
        .env("PATH", setup::path_with_cargo_bin());
    cmd
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

fn agent_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("release/proxy-agent")
}

fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this task loads BPF programs and creates network namespaces: run it as root");
    }
    Ok(())
}
