//! The ebpf mode: loads the programs, attaches them to pod-facing and
//! external interfaces and programs the maps from the desired state.

mod attach;
pub mod cleanup;
pub mod collector;
mod deferred;
pub mod family;
pub mod flow_flush;
mod interfaces;
pub mod introspect;
pub mod maglev;
pub mod mapped_array;
pub mod maps;
pub mod metrics;
pub mod migrate;
pub mod monitor;
pub mod node;
mod object;
pub mod pin;
pub mod probe;
mod programmer;
mod programs_ready;
mod proxier;
pub mod publish;
mod run;
pub mod slot_table;
pub mod sockets;
pub mod stale_sockets;
pub mod stats;
mod sys;
pub mod test_run;

use anyhow::{Context as _, bail};
use aya::{Ebpf, EbpfLoader};

pub use attach::{Attacher, XdpChoice};
pub use maps::{KernelMaps, MapError, NodeSnapshot, ServiceMaps};
pub use node::{EbpfNodeSettings, NodeFacts, NodeProgrammer, node_facts};
pub use object::{
    OBJECT, PROG_FROM_HOST, PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP, SOCKET_PROGRAMS,
};
pub use programmer::{
    AdoptStats, Capacity, FamilyProgrammer, MaglevSettings, Programmer, ServiceSnapshot,
    ServiceSnapshotOf, SyncStats,
};
pub use proxier::EbpfProxier;
pub use run::{EbpfMode, Opened, Takeover, open as open_pinned};

/// Capacities of the maps, chosen at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub conntrack: u32,
    /// Elements of each family's `MAGLEV` array.
    pub maglev: u32,
    /// Slot indexes of each family's `SLOTS` array.
    pub slots: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        use proxy_common::maps::*;
        MapSizes {
            services: MAX_SERVICE_ENTRIES,
            backends: MAX_BACKENDS,
            conntrack: MAX_CONNTRACK,
            maglev: MAX_MAGLEV_CHUNKS,
            slots: MAX_SLOT_ELEMENTS * proxy_common::slots::SLOTS_PER_ELEMENT,
        }
    }
}

/// `SLOTS` elements that hold `slots` slots.
pub fn slot_elements(slots: u32) -> u32 {
    proxy_common::slots::elements_for(slots).max(1)
}

/// Loads the embedded object into the kernel with the default map sizes, without attaching anything.
pub fn load() -> anyhow::Result<Ebpf> {
    load_with(MapSizes::default())
}

/// Loads the embedded object into the kernel without attaching anything.
pub fn load_with(sizes: MapSizes) -> anyhow::Result<Ebpf> {
    let mut ebpf = create_maps(sizes, None)?;
    load_packet_programs(&mut ebpf)?;
    Ok(ebpf)
}

/// The embedded object with its maps created (or, with `maps_dir`, taken
/// from `maps_dir/NAME` and, when absent, created and pinned there) and its
/// programs not yet verified: [`load_packet_programs`] does that, and the
/// maps can be filled meanwhile.
pub fn create_maps(sizes: MapSizes, maps_dir: Option<&std::path::Path>) -> anyhow::Result<Ebpf> {
    use proxy_common::maps as names;
    if OBJECT.is_empty() {
        bail!(
            "this binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it"
        );
    }
    if let Some(dir) = maps_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the pin directory {}", dir.display()))?;
    }
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(names::SERVICES, sizes.services)
        .map_max_entries(names::BACKENDS, sizes.backends)
        .map_max_entries(names::CONNTRACK, sizes.conntrack)
        // Each family's tables take the same configured sizes, as Cilium's
        // per-family tables do: a dual-stack node's IPv6 flows get the
        // capacity its IPv4 flows have.
        .map_max_entries(names::SERVICES6, sizes.services)
        .map_max_entries(names::BACKENDS6, sizes.backends)
        .map_max_entries(names::CONNTRACK6, sizes.conntrack)
        .map_max_entries(names::MAGLEV, sizes.maglev.max(1))
        .map_max_entries(names::MAGLEV6, sizes.maglev.max(1))
        .map_max_entries(names::SLOTS, slot_elements(sizes.slots))
        .map_max_entries(names::SLOTS6, slot_elements(sizes.slots));
    let shapes = object_maps()?;
    if let Some(dir) = maps_dir {
        for name in shapes.keys() {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    loader
        .load(OBJECT)
        .context("loading the eBPF object into the kernel")
}

/// Verifies and loads the packet programs (TC and XDP) of an object from
/// [`create_maps`]. The conntrack collector comes with them: armed once
/// they load.
pub fn load_packet_programs(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    load_programs(
        ebpf,
        &[
            PROG_FROM_POD,
            PROG_FROM_NETDEV,
            PROG_FROM_HOST,
            PROG_XDP,
            collector::PROG_ARM,
            collector::PROG_SWEEP,
        ],
    )?;
    collector::arm(ebpf)
}

/// Loads the socket-level balancing programs. A kernel without one of
/// their hooks (before Linux 5.18 lacks `bpf_set_retval`, before 5.8
/// `getpeername`) refuses them: the error says which.
pub fn load_socket_programs(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    load_programs(ebpf, &SOCKET_PROGRAMS)
}

/// Loads the programs `names` of `ebpf`, each verified on a thread of its
/// own: the verifier runs in the loading thread (about 0.15 s for each of
/// the three large programs on a small node).
fn load_programs(ebpf: &mut Ebpf, names: &[&str]) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let programs: Vec<(&str, &mut aya::programs::Program)> = ebpf
        .programs_mut()
        .filter(|(name, _)| names.contains(name))
        .collect();
    if let Some(missing) = names
        .iter()
        .find(|name| !programs.iter().any(|(found, _)| found == *name))
    {
        bail!("program {missing} missing from the object");
    }
    let took = std::thread::scope(|scope| {
        let loads: Vec<_> = programs
            .into_iter()
            .map(|(name, prog)| {
                scope.spawn(move || {
                    lower_verifier_priority();
                    let started = std::time::Instant::now();
                    load_program(name, prog).map(|()| (name, started.elapsed()))
                })
            })
            .collect();
        loads
            .into_iter()
            .map(|load| {
                load.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    tracing::debug!(programs = ?took, took = ?started.elapsed(), "programs verified");
    Ok(())
}

/// The nice value of the verifying threads: they yield the CPU to the
/// agent's other threads (nice weighs threads against the others of their
/// CPU cgroup: on a node, the agent's own pod). A cold start's first
/// sync waits for both its maps and its programs; on a node of few CPUs
/// the verifier (about 0.8 s of CPU for the packet programs) otherwise
/// competes with the parallel parsing of the first listing, which comes
/// first on the critical path, while the single-threaded build of the
/// maps that follows leaves a CPU idle. At nice 10 the three large
/// programs' threads still took about half of the 2 CPUs while the listing
/// was fed (50,000 services); at nice 19 they take what the agent leaves
/// idle (20 alternating cold starts: median 1.69 -> 1.57 s, the parse 90 ms
/// shorter, the programs verified as early). A thread at nice 19 still gets
/// about 1.5% of a CPU contended by one at nice 0, and all of it once the
/// first sync is built: it is never starved.
const VERIFIER_NICE: i32 = 19;

fn lower_verifier_priority() {
    // SAFETY: plain syscalls about the calling thread.
    let failed = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, VERIFIER_NICE) != 0
    };
    if failed {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "the verifier keeps its normal CPU priority"
        );
    }
}

/// The per-CPU working memory of the programs (`SCRATCH`, `SCRATCH6`) and
/// their per-CPU next-hop caches (`HOPS`, `HOPS6`): no state the datapath
/// needs lives there across a restart, so they are never pinned and their
/// layout may change from one version to the next.
pub fn is_scratch(map: &str) -> bool {
    map.starts_with("SCRATCH")
        || map == proxy_common::maps::HOPS
        || map == proxy_common::maps::HOPS6
}

/// Every map of the embedded object that is pinned, by name, with its definition.
pub fn object_maps() -> anyhow::Result<std::collections::BTreeMap<String, pin::MapShape>> {
    let object = aya_obj::Object::parse(OBJECT).context("parsing the embedded eBPF object")?;
    Ok(object
        .maps
        .iter()
        .filter(|(name, _)| !name.starts_with('.') && !is_scratch(name))
        .map(|(name, map)| {
            (
                name.clone(),
                pin::MapShape {
                    map_type: map.map_type(),
                    key_size: map.key_size(),
                    value_size: map.value_size(),
                },
            )
        })
        .collect())
}

/// The verifier gives up with EAGAIN when a signal arrives mid-verification
/// (a child exiting, say): the loading thread blocks the signals it can for
/// the load (a process-wide signal then goes to another thread; a busy test
/// binary, its threads running children, failed five attempts in a row
/// without this), and an interrupted load is tried again.
fn load_program(name: &str, prog: &mut aya::programs::Program) -> anyhow::Result<()> {
    const ATTEMPTS: usize = 10;
    for attempt in 1..=ATTEMPTS {
        let _blocked = SignalsBlocked::new();
        let result = match prog {
            aya::programs::Program::SchedClassifier(p) => p.load(),
            aya::programs::Program::Xdp(p) => p.load(),
            aya::programs::Program::CgroupSockAddr(p) => p.load(),
            aya::programs::Program::CgroupSock(p) => p.load(),
            aya::programs::Program::FlowDissector(p) => p.load(),
            _ => bail!("program {name} has an unexpected type"),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if attempt < ATTEMPTS && interrupted(&e) => {
                tracing::debug!(
                    program = name,
                    attempt,
                    "verification interrupted; retrying"
                )
            }
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("the kernel verifier rejected {name}"));
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// Every blockable signal blocked on this thread until dropped.
struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data, initialised by sigfillset/
        // pthread_sigmask before use; the calls only touch this thread's mask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
            SignalsBlocked(previous)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new` on the same thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

fn interrupted(e: &aya::programs::ProgramError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
        {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verifying threads yield to the first sync; the caller's own
    /// priority is untouched.
    #[test]
    fn a_verifying_thread_runs_at_a_lower_priority_than_the_agent() {
        // SAFETY: plain syscalls about the calling thread.
        let nice =
            || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let before = nice();
        let verifying = std::thread::spawn(move || {
            lower_verifier_priority();
            nice()
        })
        .join()
        .unwrap();
        assert_eq!(verifying, VERIFIER_NICE);
        assert_eq!(nice(), before);
    }
}
