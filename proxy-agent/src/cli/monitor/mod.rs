//! `proxy-agent monitor`: a live stream of the datapath's decisions, read
//! from the ring buffer the programs report into while this command holds a
//! lease ([`crate::modes::ebpf::monitor`]). Filters by service and address
//! apply here; the names come from the file the agent publishes.

pub mod args;
mod event;

use std::{
    collections::BTreeSet,
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::maps::{Array, Map, MapData, RingBuf};
use proxy_common::{Counter, MonitorSlot, maps as names};

use args::MonitorArgs;
use event::{Described, Filter};

use crate::{
    cli::{
        explain::args::Output,
        fail,
        inspect::{self, names::Naming, services::ServiceTables},
        pins::{PinnedMaps, open},
    },
    modes::ebpf::{
        monitor::{ClaimLock, Events, Lease, Wanted, monotonic_ns},
        stats,
    },
};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn main(args: MonitorArgs) -> ExitCode {
    match run(&args, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("{e:#}")),
    }
}

/// Streams events to `out` until a stop condition; the lease is released on
/// every way out.
pub fn run(args: &MonitorArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let dir = args.pins.dir();
    let pinned = PinnedMaps::open(&dir)?;
    let (control, _): (Array<MapData, MonitorSlot>, u32) = open(&dir, names::MONITOR)
        .context("this agent's datapath has no monitor channel (is it older than this command?)")?;
    let (stats, _): (aya::maps::PerCpuArray<MapData, u64>, u32) = open(&dir, names::STATS)?;
    let tables = ServiceTables::read(&pinned.maps)?;
    let naming = Naming::load(&args.state_dir, &tables.service_ids(), &tables.backends);
    let filter = Filter {
        service_ids: args
            .service
            .as_ref()
            .map(|f| inspect::service_ids(f, &tables, &naming))
            .transpose()?,
        frontends: BTreeSet::new(),
        address: args.address,
    }
    .with_frontends(&tables);
    if let Some(note) = &naming.status.note {
        eprintln!("note: {note}");
    }

    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let lost_before = lost(&stats);
    let wanted = Wanted {
        drops: true,
        flows: args.flows,
    };
    // What an earlier holder of the slot left unread is older than this.
    let since = monotonic_ns();
    let mut lease = {
        let _claiming = ClaimLock::on(&dir).context("--pin-dir: locking it to claim a slot")?;
        Lease::take(control, wanted)?
    };
    let mut events = match ring(&dir, lease.slot()) {
        Ok(ring) => Events::new(ring),
        Err(e) => {
            let _ = lease.release();
            return Err(e);
        }
    };
    eprintln!(
        "monitoring {} (Ctrl-C to stop)",
        if args.flows {
            "drops, rejects and new flows"
        } else {
            "drops and rejects"
        }
    );
    let result = stream(args, since, &mut lease, &mut events, &filter, &naming, out);
    let released = lease.release();
    let lost = lost(&stats).saturating_sub(lost_before);
    if lost > 0 {
        eprintln!("{lost} events lost: the ring buffer was full (filter more, or read faster)");
    }
    result?;
    released.context("releasing the monitor lease")?;
    Ok(())
}

fn stream(
    args: &MonitorArgs,
    since: u64,
    lease: &mut Lease,
    events: &mut Events,
    filter: &Filter,
    naming: &Naming,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let clock = event::WallClock::now();
    let mut shown = 0u64;
    loop {
        if STOP.load(Ordering::Relaxed)
            || args.duration.is_some_and(|d| started.elapsed() >= d)
            || args.count.is_some_and(|n| shown >= n)
        {
            return Ok(());
        }
        if lease.due() {
            lease.renew().context("renewing the monitor lease")?;
        }
        for raw in events.wait(Duration::from_millis(100)) {
            let raw = raw.report();
            if raw.time_ns < since
                || !filter.matches(&raw)
                || args.count.is_some_and(|n| shown >= n)
            {
                continue;
            }
            let described = Described::new(&raw, &clock, naming);
            let line = match args.output {
                Output::Text => described.text(),
                Output::Json => serde_json::to_string(&described)?,
            };
            writeln!(out, "{line}")?;
            out.flush()?;
            shown += 1;
        }
    }
}

/// The ring of monitor slot `slot`.
fn ring(dir: &std::path::Path, slot: usize) -> anyhow::Result<RingBuf<MapData>> {
    let path = dir.join(names::MONITOR_RINGS[slot]);
    let data = MapData::from_pin(&path)
        .with_context(|| format!("--pin-dir: opening {}", path.display()))?;
    Ok(RingBuf::try_from(Map::from_map_data(data)?)?)
}

fn lost(stats: &aya::maps::PerCpuArray<MapData, u64>) -> u64 {
    stats::read(stats)
        .into_iter()
        .find(|(name, _)| *name == Counter::MonitorLost.name())
        .map_or(0, |(_, n)| n)
}
