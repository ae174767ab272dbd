//! Arms the datapath's conntrack collector (`proxy_common::collector`),
//! sweeps while the agent runs, and reads what the sweeps did.

use std::{
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use aya::{
    Ebpf,
    maps::{Array, Map, MapData},
    programs::{FlowDissector, Xdp},
};
use proxy_common::{
    action::XDP_PASS,
    collector::{CollectorStats, CollectorValue, SWEEP_INTERVAL_NS},
    maps::CT_COLLECTOR,
};
use tracing::{debug, info, warn};

/// How often arming is tried before the agent gives up.
const ARM_ATTEMPTS: u32 = 5;

/// The program that arms the timer.
pub const PROG_ARM: &str = "ct_collector_arm";
/// The program of the agent's sweeps (a flow dissector, never attached).
pub const PROG_SWEEP: &str = "ct_collector_sweep";

/// `CollectorValue` as a map value.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Value(pub CollectorValue);

// SAFETY: plain data of fixed layout (proxy_common's layout checks).
unsafe impl aya::Pod for Value {}

/// Runs the arming program (loaded with the packet programs): the collector
/// then sweeps on its own for as long as `CT_COLLECTOR` lives (pinned: past
/// this process). Arming a pinned collector again hands it this object's
/// programs.
pub fn arm(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_ARM)
        .with_context(|| format!("program {PROG_ARM} missing from the object"))?
        .try_into()
        .with_context(|| format!("{PROG_ARM} is not an XDP program"))?;
    // Any frame will do: the program reads nothing of it. A refusal was
    // seen once, on a fresh map, in a CI run of the kernel tests (Linux
    // 6.18, before the program passed the errno out): arming is tried
    // again after a moment.
    let mut attempt = 1;
    loop {
        let out = super::test_run::xdp(prog, &[0u8; 64], 0, 1)
            .context("running the collector's arming program")?;
        if out.verdict == XDP_PASS {
            break;
        }
        let why = refusal(out.verdict as u32);
        ensure!(
            attempt < ARM_ATTEMPTS,
            "the kernel refused the conntrack collector's timer {ARM_ATTEMPTS} times, the last with {why} (BPF timers need Linux 5.15)"
        );
        debug!(
            attempt,
            %why,
            "the kernel refused the collector's timer; arming again"
        );
        attempt += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    info!(
        every = ?Duration::from_nanos(SWEEP_INTERVAL_NS),
        "conntrack collector armed: the datapath sweeps expired flows itself when no agent does"
    );
    Ok(())
}

/// What the arming program's answer `verdict` says went wrong.
fn refusal(verdict: u32) -> String {
    match proxy_common::collector::arm_refusal_errno(verdict) {
        Some(errno) => format!(
            "{} (errno {errno} from the BPF timer helpers)",
            std::io::Error::from_raw_os_error(errno)
        ),
        None => format!("the unexpected answer {verdict}"),
    }
}

/// The sweep program's fd, for a [`Sweeper`] that outlives the borrow.
pub fn sweep_program(ebpf: &Ebpf) -> anyhow::Result<OwnedFd> {
    let prog: &FlowDissector = ebpf
        .program(PROG_SWEEP)
        .with_context(|| format!("program {PROG_SWEEP} missing from the object"))?
        .try_into()
        .with_context(|| format!("{PROG_SWEEP} is not a flow dissector program"))?;
    let fd = prog
        .fd()
        .with_context(|| format!("{PROG_SWEEP} is not loaded"))?;
    Ok(fd.as_fd().try_clone_to_owned()?)
}

/// One sweep of both tables, now, on this thread's CPU and in its context
/// (softirqs enabled), holding the timer off for `AGENT_GRACE_NS`.
pub fn sweep(program: BorrowedFd<'_>) -> anyhow::Result<()> {
    // A frame is required (at least an Ethernet header); the program reads none of it.
    let verdict = super::sys::test_run(program, &[0u8; 64])
        .with_context(|| format!("running {PROG_SWEEP}"))?;
    ensure!(
        verdict == 0,
        "{PROG_SWEEP} found no collector (returned {verdict})"
    );
    Ok(())
}

/// The agent's sweeps, on a thread of their own, every `every` until
/// `stopped`: while they run, the timer sweeps only when a table is full.
pub struct Sweeper {
    pub program: OwnedFd,
    pub every: Duration,
    pub stopped: Arc<AtomicBool>,
}

impl Sweeper {
    /// The first sweep at once, so that the timer armed a moment ago is
    /// held off from the start.
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ct-sweeper".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let mut failing = false;
        while !self.stopped.load(Ordering::Relaxed) {
            let started = Instant::now();
            match sweep(self.program.as_fd()) {
                Ok(()) => {
                    if failing {
                        info!("conntrack sweeps work again");
                    }
                    failing = false;
                    debug!(took = ?started.elapsed(), "conntrack swept");
                }
                Err(e) if !failing => {
                    failing = true;
                    warn!(
                        error = %format!("{e:#}"),
                        "the agent cannot sweep the conntrack tables: the datapath's timer does, in softirq"
                    );
                }
                Err(_) => {}
            }
            // Slept in short steps, so that a stop ends the thread soon.
            let next = started + self.every;
            while !self.stopped.load(Ordering::Relaxed) && Instant::now() < next {
                std::thread::sleep(
                    next.saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(200)),
                );
            }
        }
    }
}

/// What the collector's sweeps did so far.
pub fn stats(ebpf: &Ebpf) -> anyhow::Result<CollectorStats> {
    let map = ebpf
        .map(CT_COLLECTOR)
        .with_context(|| format!("map {CT_COLLECTOR} missing from the object"))?;
    match map {
        Map::Array(data) => read(data),
        _ => anyhow::bail!("{CT_COLLECTOR} is not an array"),
    }
}

/// The same from a handle on the `CT_COLLECTOR` map.
pub fn read(map: &MapData) -> anyhow::Result<CollectorStats> {
    let data = MapData::from_id(map.info()?.id())?;
    let array: Array<MapData, Value> = Map::from_map_data(data)?.try_into()?;
    Ok(array.get(&0, 0)?.0.stats)
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn a_refusal_names_the_kernels_error() {
        let busy = proxy_common::collector::arm_answer(-16);
        let why = refusal(busy);
        assert!(why.contains("busy") && why.contains("errno 16"), "{why}");
        assert_eq!(refusal(1), "the unexpected answer 1");
    }
}
