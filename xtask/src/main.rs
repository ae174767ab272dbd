//! Project tasks: `cargo xtask <setup|build|load|test|demo|bench>`.

mod demo;
mod fuzz;
mod setup;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
    time::Instant,
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
    /// Install the eBPF toolchain and tools (Debian packages, bpf-linker, bpffs, the Kubernetes schema validator); a no-op when present.
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
    /// Run every test, tier by tier, stopping at the first that fails: pure and unit tests, then
    /// kernel (BPF_PROG_TEST_RUN), then end to end in namespaces. Needs root.
    Test {
        /// Extra arguments passed to every `cargo test` (e.g. a test name filter). Arguments that
        /// select packages or targets themselves make it one plain `cargo test ARGS`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build a testbed, run the agent on the example Service and show balancing. Needs root.
    Demo,
    /// Run the benchmarks (sync engine; per-packet cost of the eBPF programs; connections per second through the socket hooks) and print their figures; `bench e2e` runs the end-to-end one (connections through a ClusterIP per datapath and scale) and writes docs/bench/e2e.md. Needs root.
    Bench {
        /// `e2e`: the end-to-end benchmark only.
        which: Option<String>,
    },
    /// Fuzz every datapath program, in both address families, through BPF_PROG_TEST_RUN against an oracle of the services and flows, and print the figures. Needs root.
    Fuzz {
        /// Packets per program.
        #[arg(long, default_value_t = 1_000_000)]
        packets: u64,
    },
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
            // Not `ensure`: no bpffs mount, so it also runs in a container image build.
            setup::ensure_build()?;
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
            test(&args)
        }
        Task::Bench { which } => {
            setup::ensure()?;
            // The datapath bench loads the real programs into the kernel.
            require_root()?;
            match which.as_deref() {
                None => {}
                Some("e2e") => {
                    let status = cargo()
                        .args(["bench", "--package", "proxy-agent", "--bench", "end_to_end"])
                        .env_remove("AYA_BUILD_SKIP")
                        .status()
                        .context("running cargo bench")?;
                    if !status.success() {
                        bail!("the e2e benchmark failed ({status})");
                    }
                    return Ok(());
                }
                Some(other) => bail!(
                    "bench {other:?}: unknown; `cargo xtask bench` or `cargo xtask bench e2e`"
                ),
            }
            let status = cargo()
                .args(["bench", "--package", "proxy-agent"])
                .args([
                    "--bench",
                    "model",
                    "--bench",
                    "datapath",
                    "--bench",
                    "socket_lb",
                    "--bench",
                    "families",
                    "--bench",
                    "semantics",
                    "--bench",
                    "rule_modes",
                ])
                // The datapath bench needs the eBPF object embedded.
                .env_remove("AYA_BUILD_SKIP")
                // 1,000 service ports keep the rule-mode bench to seconds; at
                // 10,000 (its own default) the first syncs take minutes today.
                .env(
                    "RULE_MODES_SERVICES",
                    std::env::var("RULE_MODES_SERVICES").unwrap_or_else(|_| "1000".into()),
                )
                .status()
                .context("running cargo bench")?;
            if !status.success() {
                bail!("benchmarks failed ({status})");
            }
            Ok(())
        }
        Task::Fuzz { packets } => {
            setup::ensure()?;
            require_root()?;
            fuzz::run(packets)
        }
        Task::Demo => {
            setup::ensure()?;
            require_root()?;
            build()?;
            demo::run(&agent_binary(), &workspace_root().join("examples/demo"))
        }
    }
}

/// The test tiers, in the order `cargo xtask test` runs them, each a name,
/// what it holds and its `cargo test` target selection: fast and root-free
/// first, to fail early. None names a package, so every tier builds the
/// default members with the same features, as one plain `cargo test` would,
/// and all share one build.
const TIERS: &[(&str, &str, &[&str])] = &[
    (
        "pure",
        "unit tests and proxy-agent's pure tier: no root, no kernel",
        &["--lib", "--bins", "--test", "pure"],
    ),
    ("doc", "doc tests", &["--doc"]),
    (
        "kernel",
        "the eBPF programs through BPF_PROG_TEST_RUN",
        &["--test", "kernel"],
    ),
    (
        "e2e",
        "namespaces, traffic and the agent binary; the testbed's own tests",
        &["--test", "e2e"],
    ),
];

/// `cargo test` options that choose packages or targets: with one of them
/// the caller picks the tests, and gets one plain `cargo test ARGS`.
const SELECTORS: &[&str] = &[
    "-p",
    "--package",
    "--workspace",
    "--all",
    "--exclude",
    "--lib",
    "--bin",
    "--bins",
    "--example",
    "--examples",
    "--test",
    "--tests",
    "--bench",
    "--benches",
    "--all-targets",
    "--doc",
];

fn test(args: &[String]) -> anyhow::Result<()> {
    let cargo_args = args.iter().take_while(|a| *a != "--");
    let selects = cargo_args.clone().any(|a| {
        SELECTORS
            .iter()
            .any(|s| a == s || a.starts_with(&format!("{s}=")))
            || a.starts_with("-p")
    });
    if selects {
        return cargo_test(&[], args);
    }
    let no_run = cargo_args.clone().any(|a| a == "--no-run");
    let started = Instant::now();
    for (name, what, selection) in TIERS {
        if no_run && *name == "doc" {
            continue; // cargo cannot build doc tests without running them
        }
        println!("xtask: tier {name} ({what})");
        let tier_started = Instant::now();
        cargo_test(selection, args).with_context(|| format!("tier {name}"))?;
        println!(
            "xtask: tier {name} ok in {:.1} s",
            tier_started.elapsed().as_secs_f64()
        );
    }
    println!(
        "xtask: all tiers ok in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn cargo_test(selection: &[&str], args: &[String]) -> anyhow::Result<()> {
    let status = cargo()
        .arg("test")
        .args(selection)
        .args(args)
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("tests failed ({status})");
    }
    Ok(())
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
