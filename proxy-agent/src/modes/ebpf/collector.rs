//! Arms the datapath's conntrack collector (`proxy_common::collector`),
//! sweeps while the agent runs, and reads what the sweeps did.
//!
//! The agent's sweep walks the tables from user space, a batch of entries
//! per system call, and deletes what [`removal`] says, each entry taken out
//! and judged again in one step (a flow refreshed meanwhile is put back).
//! A sweep inside the kernel (one BPF program run) would hold its CPU for
//! the whole walk: over 100 ms for a full table of 2^20 entries, during
//! which no other thread of that CPU runs (these kernels do not preempt
//! kernel code). Between two batches the CPU's other threads and softirqs
//! run. Then `ct_collector_sweep` records the sweep and pushes the timer back.

use std::{
    os::fd::{AsFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use aya::{
    Ebpf, Pod,
    maps::{Array, Map, MapData},
    programs::{FlowDissector, Xdp},
};
use proxy_common::{
    CtKeyOf, CtValueOf, DatapathConfig, Family, V4, V6,
    action::XDP_PASS,
    collector::{AgentSweep, CollectorStats, CollectorValue, Removal, SWEEP_INTERVAL_NS, removal},
    maps::{CONFIG, CONNTRACK, CONNTRACK6, CT_COLLECTOR},
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

/// The agent's sweep: the program that records it and the maps it walks,
/// found through the program (pinned or not, taken out of the object or not).
pub struct Sweep {
    program: OwnedFd,
    conntrack: MapData,
    conntrack6: MapData,
    config: MapData,
    collector: MapData,
}

impl Sweep {
    pub fn of(ebpf: &Ebpf) -> anyhow::Result<Self> {
        let prog: &FlowDissector = ebpf
            .program(PROG_SWEEP)
            .with_context(|| format!("program {PROG_SWEEP} missing from the object"))?
            .try_into()
            .with_context(|| format!("{PROG_SWEEP} is not a flow dissector program"))?;
        let program = prog
            .fd()
            .with_context(|| format!("{PROG_SWEEP} is not loaded"))?
            .as_fd()
            .try_clone_to_owned()?;
        let mut maps = super::maps::named_maps(prog.info()?.map_ids()?.unwrap_or_default());
        let mut take = |name: &str| {
            let at = maps
                .iter()
                .position(|(n, _)| n == name)
                .with_context(|| format!("{PROG_SWEEP} does not use the map {name}"))?;
            anyhow::Ok(maps.swap_remove(at).1)
        };
        Ok(Self {
            conntrack: take(CONNTRACK)?,
            conntrack6: take(CONNTRACK6)?,
            config: take(CONFIG)?,
            collector: take(CT_COLLECTOR)?,
            program,
        })
    }

    /// One sweep of both tables, now, from this thread: what it did, as
    /// the program recorded it.
    pub fn run(&self) -> anyhow::Result<AgentSweep> {
        let started = Instant::now();
        let stats = read(&self.collector)?;
        let mut config = DatapathConfig::default();
        let found = super::sys::lookup(
            self.config.fd().as_fd(),
            bytes_of(&0u32),
            bytes_of_mut(&mut config),
        )
        .context("reading CONFIG")?;
        ensure!(found, "CONFIG holds no element 0");
        let judge = Judge {
            config,
            now: crate::clock::coarse_monotonic_ns(),
            pressure: stats.kick_pending(),
        };
        let (live, removed4, unanswered4) = sweep_table::<V4>(&self.conntrack, &judge)
            .with_context(|| format!("sweeping {CONNTRACK}"))?;
        let (live6, removed6, unanswered6) = sweep_table::<V6>(&self.conntrack6, &judge)
            .with_context(|| format!("sweeping {CONNTRACK6}"))?;
        let report = AgentSweep {
            started_ns: judge.now,
            took_ns: started.elapsed().as_nanos() as u64,
            pressure: u64::from(judge.pressure),
            live,
            live6,
            removed: removed4 + removed6,
            removed_under_pressure: unanswered4 + unanswered6,
        };
        let verdict = super::sys::test_run(self.program.as_fd(), &report.to_bytes())
            .with_context(|| format!("running {PROG_SWEEP}"))?;
        ensure!(
            verdict == 0,
            "{PROG_SWEEP} found no collector or no report (returned {verdict})"
        );
        Ok(report)
    }
}

/// What a sweep judges entries by: the settings, the coarse clock at its
/// start, and whether it runs under pressure.
pub struct Judge {
    pub config: DatapathConfig,
    pub now: u64,
    pub pressure: bool,
}

impl Judge {
    fn removal<F: Family>(&self, key: &CtKeyOf<F>, value: &CtValueOf<F>) -> Option<Removal> {
        removal(
            &self.config,
            self.now,
            self.pressure,
            key.proto,
            value.flags,
            value.last_seen_ns,
        )
    }
}

/// Walks `table` in batches and deletes what `judge` removes, each batch's
/// before the next is read (so the agent holds one batch of keys, not the
/// table's): each entry taken out with the kernel's lookup-and-delete, then
/// judged again on the value it had, so a flow refreshed since the walk
/// read it goes back (its packets in between find the other half, or open
/// it again, as after any sweep). Entries left, removed, and of those
/// removed under pressure.
fn sweep_table<F: Family>(table: &MapData, judge: &Judge) -> anyhow::Result<(u64, u64, u64)>
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let fd = table.fd().as_fd();
    let mut visited = 0u64;
    let mut removals = Removals::default();
    let mut doomed: Vec<CtKeyOf<F>> = Vec::new();
    let mut failed = None;
    super::sys::walk_typed_batches::<CtKeyOf<F>, CtValueOf<F>>(fd, |entries| {
        for (key, value) in entries {
            visited += 1;
            if judge.removal::<F>(&key, &value).is_some() {
                doomed.push(key);
            }
        }
        if failed.is_none()
            && let Err(e) = removals.remove::<F>(fd, &doomed, judge)
        {
            failed = Some(e);
        }
        doomed.clear();
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok((
        visited.saturating_sub(removals.removed),
        removals.removed,
        removals.unanswered,
    ))
}

/// What a sweep removed from a table.
#[derive(Default)]
struct Removals {
    removed: u64,
    /// Of them, under pressure ([`Removal::Unanswered`]).
    unanswered: u64,
}

impl Removals {
    fn remove<F: Family>(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        doomed: &[CtKeyOf<F>],
        judge: &Judge,
    ) -> std::io::Result<()>
    where
        CtKeyOf<F>: Pod,
        CtValueOf<F>: Pod,
    {
        for key in doomed {
            match remove_if_due::<F>(fd, key, judge)? {
                Some(Removal::Unanswered) => {
                    self.removed += 1;
                    self.unanswered += 1;
                }
                Some(Removal::Expired) => self.removed += 1,
                None => {}
            }
        }
        Ok(())
    }
}

/// Takes `key` out of the table `fd` (lookup-and-delete, one step) and
/// judges it again on the value it had: what removed it, or `None` when it
/// was gone already or is live, in which case it goes back. Should the
/// datapath have opened the tuple again meanwhile, its entry stays; should
/// the table have filled meanwhile, the flow's next refresh rebuilds this
/// half from the other, as after any lost entry.
pub fn remove_if_due<F: Family>(
    fd: std::os::fd::BorrowedFd<'_>,
    key: &CtKeyOf<F>,
    judge: &Judge,
) -> std::io::Result<Option<Removal>>
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    take_if::<F, _>(fd, key, |taken| judge.removal::<F>(key, taken))
}

/// Takes `key` out of the table `fd` (lookup-and-delete, one step) and asks
/// `why` about the value it had: its answer, or `None` when the entry was
/// gone already or `why` keeps it, in which case it goes back (unless the
/// datapath opened the tuple again meanwhile).
pub fn take_if<F: Family, T>(
    fd: std::os::fd::BorrowedFd<'_>,
    key: &CtKeyOf<F>,
    why: impl FnOnce(&CtValueOf<F>) -> Option<T>,
) -> std::io::Result<Option<T>>
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let mut value = vec![0u8; size_of::<CtValueOf<F>>()];
    let key_bytes = bytes_of(key);
    if !super::sys::take(fd, key_bytes, &mut value)? {
        return Ok(None);
    }
    // SAFETY: the kernel wrote a whole value of this Pod type.
    let taken: CtValueOf<F> = unsafe { std::ptr::read_unaligned(value.as_ptr().cast()) };
    let answer = why(&taken);
    if answer.is_none() {
        let _ = super::sys::insert_new(fd, key_bytes, &value);
    }
    Ok(answer)
}

fn bytes_of<T: Pod>(value: &T) -> &[u8] {
    // SAFETY: a Pod value is plain bytes of its size.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

fn bytes_of_mut<T: Pod>(value: &mut T) -> &mut [u8] {
    // SAFETY: a Pod value is plain bytes of its size, any of which is valid.
    unsafe { std::slice::from_raw_parts_mut((value as *mut T).cast::<u8>(), size_of::<T>()) }
}

/// The agent's sweeps, on a thread of their own, every `every` until
/// `stopped`: while they run, the timer sweeps only when a table is full.
pub struct Sweeper {
    pub sweep: Sweep,
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
            match self.sweep.run() {
                Ok(done) => {
                    if failing {
                        info!("conntrack sweeps work again");
                    }
                    failing = false;
                    debug!(
                        took = ?started.elapsed(),
                        removed = done.removed,
                        under_pressure = done.removed_under_pressure,
                        left = done.live + done.live6,
                        "conntrack swept"
                    );
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
