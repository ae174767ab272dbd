//! `DATAPATH_PROFILE=<metric>`: where one path's time goes. After the first
//! tier is set up, only that metric's packets run, under `perf record` of
//! this process (call graphs, kernel included: the JIT's programs show by
//! their function names, beside the helpers and map code they call). The
//! bench's figures are not taken: sampling slows every run (about twice
//! the bench's time per run on these VMs), so compare shares, not
//! nanoseconds. Read the result with
//! `perf report -i <file> --no-children --sort symbol`.
//!
//! - `DATAPATH_PROFILE_OUT`: the perf data file (default in the temp dir);
//! - `DATAPATH_PROFILE_SECS`: how long a repeated packet runs (default 5);
//! - `DATAPATH_PROFILE_FLOWS`: how many new flows a new-flow metric opens
//!   (default 100,000: two conntrack entries each must fit the map).

use std::{
    os::unix::process::CommandExt as _,
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::{Metric, Tier, node_port_flow};

/// The metric named `name` (its label, spaces as dashes: `xdp-new-flows`).
pub fn metric(name: &str) -> anyhow::Result<Metric> {
    let wanted = name.trim().to_lowercase();
    Metric::ALL
        .iter()
        .copied()
        .find(|m| m.label().to_lowercase().replace(' ', "-") == wanted)
        .with_context(|| {
            let names: Vec<String> = Metric::ALL
                .iter()
                .map(|m| m.label().to_lowercase().replace(' ', "-"))
                .collect();
            format!(
                "DATAPATH_PROFILE={name}: no such metric (one of {})",
                names.join(", ")
            )
        })
}

/// Runs `metric`'s packets through `tier` under perf; prints where the data went.
pub fn run(tier: &Tier, metric: Metric) -> anyhow::Result<()> {
    let env_number = |name: &str, default: u64| -> anyhow::Result<u64> {
        match std::env::var(name) {
            Ok(v) => v
                .trim()
                .parse()
                .with_context(|| format!("{name}: a number")),
            Err(_) => Ok(default),
        }
    };
    let secs = env_number("DATAPATH_PROFILE_SECS", 5)?;
    let flows = env_number("DATAPATH_PROFILE_FLOWS", 100_000)? as usize;
    let name = metric.label().to_lowercase().replace(' ', "-");
    let out = std::env::var("DATAPATH_PROFILE_OUT").unwrap_or_else(|_| {
        std::env::temp_dir()
            .join(format!("datapath-{name}.perf.data"))
            .display()
            .to_string()
    });
    let (hook, verdict, _) = metric.path();
    // Distinct flows, built before perf starts; the established ones
    // opened before it, too.
    let flows: Vec<Vec<u8>> = match metric {
        Metric::NewFlow | Metric::EstablishedMany => {
            (0..flows).map(|j| tier.layout.new_flow(j)).collect()
        }
        Metric::XdpNewFlow | Metric::KatranNewFlow => (0..flows).map(node_port_flow).collect(),
        _ => Vec::new(),
    };
    if metric == Metric::EstablishedMany {
        for p in &flows {
            tier.timed(hook, p, 1, verdict)?;
        }
    }
    let perf = Perf::start(&out)?;
    let started = Instant::now();
    let (mut runs, mut kernel_ns) = (0u64, 0u64);
    match tier.repeated(metric) {
        None => {
            for p in &flows {
                kernel_ns += tier.timed(hook, p, 1, verdict)?;
                runs += 1;
            }
        }
        Some((packet, repeat)) => {
            while started.elapsed() < Duration::from_secs(secs) {
                for _ in 0..100 {
                    kernel_ns += tier.timed(hook, packet, repeat, verdict)? * u64::from(repeat);
                    runs += u64::from(repeat);
                }
            }
        }
    }
    let wall = started.elapsed();
    perf.stop()?;
    println!(
        "profiled {name} at {} services: {runs} runs in {:.2} s, kernel-reported {:.1} ns per run \
         under perf",
        tier.layout.frontends,
        wall.as_secs_f64(),
        kernel_ns as f64 / runs.max(1) as f64
    );
    println!("perf data: {out}\n  perf report -i {out} --no-children --sort symbol");
    Ok(())
}

/// `perf record` of this process, stopped by SIGINT.
struct Perf(Child);

impl Perf {
    fn start(out: &str) -> anyhow::Result<Self> {
        let pid = std::process::id().to_string();
        let mut command = Command::new("perf");
        command.args(["record", "-g", "-F", "20000", "-q", "-o", out, "-p", &pid]);
        // SAFETY: the closure calls async-signal-safe syscalls only.
        unsafe {
            command.pre_exec(|| {
                // The bench holds its CPU at SCHED_FIFO; perf must not share it.
                let normal = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal);
                let mut all: libc::cpu_set_t = std::mem::zeroed();
                for cpu in 0..libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(cpu, &mut all);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &all);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .context("running perf (install linux-perf)")?;
        // perf attaches to the process's threads before it samples anything.
        std::thread::sleep(Duration::from_millis(700));
        Ok(Self(child))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.0.id() as libc::pid_t;
        // SAFETY: signals the child this struct spawned.
        ensure!(
            unsafe { libc::kill(pid, libc::SIGINT) } == 0,
            "signalling perf"
        );
        let status = self.0.wait().context("waiting for perf")?;
        // perf writes its data, then dies of the signal it was stopped with.
        if !status.success()
            && std::os::unix::process::ExitStatusExt::signal(&status) != Some(libc::SIGINT)
        {
            bail!("perf record failed: {status}");
        }
        Ok(())
    }
}
