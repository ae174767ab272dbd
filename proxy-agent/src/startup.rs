//! The start-up sequence of config_rules.md §3, from the raw command line to validated
//! settings ready for the proxy runtime: options -> `--help`/`--version` -> logging ->
//! `--write-config-to` -> `--cleanup` -> the mode's capabilities -> mode support ->
//! configuration checks (§3.3) -> leftovers of other modes -> host set-up (sysctls) ->
//! `--init-only` -> OOM score. Bad input exits 1 before any step that changes the node.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

mod caps;

use crate::cleanup::{self, NetlinkTransport, ProcessRunner};
use crate::hostsetup::{self, ProcParams};
use crate::modes::HostSupport;
use crate::options::{self, Environment, Parsed, ProxyOptions, checks, write};

/// What `main` does next.
pub enum Next {
    /// Run the proxy with these settings.
    Run(Box<ProxyOptions>),
    /// Exit now with this code (help, version, write-config, cleanup, init-only, errors).
    Exit(ExitCode),
}

fn fail(msg: impl std::fmt::Display) -> Next {
    eprintln!("error: {msg}");
    Next::Exit(ExitCode::FAILURE)
}

/// Maps klog verbosity to a tracing level: 0-1 info, 2-4 debug, 5+ trace. `RUST_LOG` wins.
fn init_logging(o: &ProxyOptions) {
    let level = match o.config.logging.verbosity {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    use std::io::IsTerminal as _;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Runs the start-up sequence on `args` (program name first).
pub fn prepare(args: impl IntoIterator<Item = OsString>) -> Next {
    let env = Environment {
        support: &HostSupport,
        hostname: None,
    };
    let o = match options::parse(args, &env) {
        Ok(Parsed::Help(h)) => {
            print!("{h}");
            return Next::Exit(ExitCode::SUCCESS);
        }
        Ok(Parsed::Version(v)) => {
            println!("{v}");
            return Next::Exit(ExitCode::SUCCESS);
        }
        Ok(Parsed::Run(o)) => o,
        Err(e) => return fail(e),
    };
    init_logging(&o);
    for w in &o.warnings {
        tracing::warn!("{w}");
    }

    if o.write_config_to.is_some() || o.ebpf_write_config_to.is_some() {
        if let Some(p) = &o.write_config_to {
            if let Err(e) = write::write_file(p, &o.config) {
                return fail(e);
            }
            tracing::info!(path = %p.display(), "wrote KubeProxyConfiguration");
        }
        if let Some(p) = &o.ebpf_write_config_to {
            if let Err(e) = write::write_file(p, &o.ebpf) {
                return fail(e);
            }
            tracing::info!(path = %p.display(), "wrote EbpfDatapathConfiguration");
        }
        return Next::Exit(ExitCode::SUCCESS);
    }

    if o.cleanup {
        let report = cleanup::cleanup_all(
            &mut ProcessRunner::default(),
            &mut NetlinkTransport,
            Path::new(&o.ebpf.pinning.root),
        );
        if report.removed.is_empty() {
            println!("nothing to clean up");
        }
        for r in &report.removed {
            println!("removed {r}");
        }
        for n in &report.notes {
            println!("note: {n}");
        }
        if !report.is_ok() {
            return fail(cleanup::CleanupError {
                errors: report.errors,
            });
        }
        return Next::Exit(ExitCode::SUCCESS);
    }

    // Before the mode's probe, which fails on a missing capability too,
    // only less clearly.
    if let Err(e) = caps::check(o.mode) {
        return fail(e);
    }
    if let Err(e) = o.check_mode_supported(&HostSupport) {
        return fail(e);
    }
    match &o.mode_choice {
        Some(c) => tracing::info!(mode = %o.mode, reason = %c.reason, "proxy mode chosen"),
        None => tracing::info!(mode = %o.mode, "proxy mode set by configuration"),
    }

    // §3.3 as far as it can be decided before the Node is known (the primary family comes
    // from a specific bindAddress; otherwise only the family-independent warning). The rest
    // runs again with the Node's IPs and podCIDRs (`options::checks::run`).
    let findings = checks::run(&o.config, &checks::NodeFacts::at_startup(o.mode));
    if let Some(stack) = &findings.stack {
        tracing::info!("{stack}");
    }
    for w in [&findings.bad_config, &findings.bad_ip_config]
        .into_iter()
        .flatten()
    {
        tracing::warn!(error = %w, "{}", checks::MAY_BE_INCORRECT);
    }
    if let Some(fatal) = findings.fatal {
        return fail(fatal);
    }

    let leftovers = cleanup::leftovers_of_other_modes(
        o.mode,
        &mut ProcessRunner::default(),
        &mut NetlinkTransport,
    );
    for r in &leftovers.removed {
        tracing::info!("removed leftover {r}");
    }
    for e in &leftovers.errors {
        tracing::warn!("leftover cleanup: {e}");
    }

    // Upstream sets the kernel's conntrack parameters in every mode. The
    // ebpf mode does too: the kernel's conntrack still tracks what the BPF
    // datapath does not translate (hostPorts, the node's own connections),
    // and its conntrack settings also size and expire the BPF table.
    let mut params = ProcParams::default();
    match hostsetup::conntrack::apply(&o.config, hostsetup::conntrack::online_cpus(), &mut params) {
        Ok(r) => {
            for w in &r.writes {
                tracing::info!(key = %w.key, old = ?w.old, new = %w.new, "set conntrack parameter");
            }
            for w in &r.warnings {
                tracing::warn!("{w}");
            }
        }
        Err(e) if o.mode.uses_kernel_conntrack() => return fail(e),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot set the kernel's conntrack parameters (is nf_conntrack loaded?): they \
             apply only to traffic the BPF datapath does not translate; it is not affected"
        ),
    }
    if !o.mode.uses_kernel_conntrack() {
        let ct = options::ebpf::conntrack_params(
            &o.config,
            &o.ebpf,
            hostsetup::conntrack::online_cpus(),
        );
        tracing::info!(
            ?ct,
            "ebpf mode: conntrack settings size and expire the BPF conntrack table"
        );
    }
    match hostsetup::sysctls::apply(&o, &mut params) {
        Ok(writes) => {
            for w in writes {
                tracing::info!(key = %w.key, new = %w.new, "set sysctl");
            }
        }
        Err(e) => return fail(e),
    }

    if o.init_only {
        tracing::info!("--init-only: host initialisation done, exiting");
        return Next::Exit(ExitCode::SUCCESS);
    }

    if let Some(adj) = o.config.oom_score_adj
        && let Err(e) = hostsetup::oom::apply(adj, Path::new(hostsetup::oom::SELF_OOM_SCORE_ADJ))
    {
        tracing::warn!(value = adj, error = %e, "failed to set oom_score_adj");
    }
    Next::Run(o)
}
