//! The user side of the monitor channel (`proxy_common::monitor`): a slot's
//! lease that turns the programs' reports on while it is renewed, and the
//! slot's ring buffer they report into. Used by `proxy-agent monitor`.

pub use crate::clock::monotonic_ns;
use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use std::net::SocketAddr;

use aya::maps::{Array, MapData, RingBuf};
use proxy_common::{
    MonitorEvent, MonitorEvent6, MonitorEventOf, MonitorSlot,
    monitor::{LEASE_NS, MONITOR_SLOTS, RENEW_NS},
};

use super::family::AgentFamily;

/// One report as the programs wrote it, in its family's layout (a ring
/// holds both; the record's size says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    V4(MonitorEvent),
    V6(MonitorEvent6),
}

/// A report with its addresses in either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub time_ns: u64,
    pub ifindex: u32,
    pub kind: u8,
    pub hook: u8,
    pub reason: u8,
    pub proto: u8,
    pub source: SocketAddr,
    pub destination: SocketAddr,
    /// Flows: the tuple the packet left with.
    pub translated_source: SocketAddr,
    pub translated_destination: SocketAddr,
    pub service_id: u32,
    pub backend_id: u32,
    pub flags: u32,
}

impl Reported {
    pub fn v4(&self) -> Option<&MonitorEvent> {
        match self {
            Reported::V4(e) => Some(e),
            Reported::V6(_) => None,
        }
    }

    pub fn v6(&self) -> Option<&MonitorEvent6> {
        match self {
            Reported::V6(e) => Some(e),
            Reported::V4(_) => None,
        }
    }

    pub fn report(&self) -> Report {
        match self {
            Reported::V4(e) => report_of(e),
            Reported::V6(e) => report_of(e),
        }
    }
}

fn report_of<F: AgentFamily>(e: &MonitorEventOf<F>) -> Report {
    let at = |addr: F::Addr, port_be: u16| {
        SocketAddr::new(F::from_be(addr).into(), u16::from_be(port_be))
    };
    Report {
        time_ns: e.time_ns,
        ifindex: e.ifindex,
        kind: e.kind,
        hook: e.hook,
        reason: e.reason,
        proto: e.proto,
        source: at(e.saddr_be, e.sport_be),
        destination: at(e.daddr_be, e.dport_be),
        translated_source: at(e.nat_saddr_be, e.nat_sport_be),
        translated_destination: at(e.nat_daddr_be, e.nat_dport_be),
        service_id: e.service_id,
        backend_id: e.backend_id,
        flags: e.flags,
    }
}

/// Reads a record of type `T` (plain data) from a ring's bytes.
fn read_record<T: aya::Pod>(bytes: &[u8]) -> T {
    // SAFETY: the caller checked the length; T is plain data, and
    // read_unaligned copes with any alignment of the ring's bytes.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Which events a monitor wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub drops: bool,
    pub flows: bool,
}

/// Why no lease could be taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{MONITOR_SLOTS} monitors already run on this datapath; stop one first")]
    Full,
    #[error("the MONITOR map: {0}")]
    Map(#[from] aya::maps::MapError),
}

/// This monitor's slot in `MONITOR`: its own entry (lease) and ring, so
/// monitors never take each other's events or turn each other off. A
/// monitor that dies stops its reports within [`LEASE_NS`], which frees the
/// slot. Claims must not race: callers hold [`ClaimLock`] around [`Lease::take`].
pub struct Lease {
    control: Array<MapData, MonitorSlot>,
    slot: u32,
    owner: u32,
    wanted: Wanted,
    renewed_at: u64,
}

impl Lease {
    /// Claims a free slot (one whose lease ran out).
    pub fn take(control: Array<MapData, MonitorSlot>, wanted: Wanted) -> Result<Self, LeaseError> {
        let now = monotonic_ns();
        let free = (0..MONITOR_SLOTS as u32).find(|i| {
            control
                .get(i, 0)
                .is_ok_and(|s| s.drops_until_ns <= now && s.flows_until_ns <= now)
        });
        let Some(slot) = free else {
            return Err(LeaseError::Full);
        };
        let mut lease = Lease {
            control,
            slot,
            owner: std::process::id(),
            wanted,
            renewed_at: 0,
        };
        lease.renew()?;
        Ok(lease)
    }

    /// The ring this lease's reports go to (`MONITOR_RINGS[slot]`).
    pub fn slot(&self) -> usize {
        self.slot as usize
    }

    /// Extends the lease (call at least every [`RENEW_NS`]; [`Lease::due`] says when).
    pub fn renew(&mut self) -> Result<(), aya::maps::MapError> {
        let now = monotonic_ns();
        let until = now + LEASE_NS;
        let lease = MonitorSlot {
            drops_until_ns: if self.wanted.drops { until } else { 0 },
            flows_until_ns: if self.wanted.flows { until } else { 0 },
            owner: self.owner,
            _pad: 0,
        };
        self.control.set(self.slot, lease, 0)?;
        self.renewed_at = now;
        Ok(())
    }

    pub fn due(&self) -> bool {
        monotonic_ns().saturating_sub(self.renewed_at) >= RENEW_NS
    }

    /// Ends this monitor's reports at once and frees the slot.
    pub fn release(&mut self) -> Result<(), aya::maps::MapError> {
        let freed = MonitorSlot {
            owner: self.owner,
            ..MonitorSlot::default()
        };
        self.control.set(self.slot, freed, 0)
    }
}

/// An exclusive `flock` on the pinned maps' directory while a slot is
/// claimed, so two monitors starting at once never pick the same slot.
pub struct ClaimLock {
    _locked: std::fs::File,
}

impl ClaimLock {
    pub fn on(dir: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(dir)?;
        // SAFETY: flock on a descriptor this struct owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ClaimLock { _locked: file })
    }
}

/// The programs' reports.
pub struct Events {
    ring: RingBuf<MapData>,
}

impl Events {
    pub fn new(ring: RingBuf<MapData>) -> Self {
        Events { ring }
    }

    /// Waits up to `timeout` for reports, then takes every one there is.
    pub fn wait(&mut self, timeout: Duration) -> Vec<Reported> {
        let mut fds = libc::pollfd {
            fd: self.ring.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut fds, 1, ms) };
        self.drain()
    }

    /// Every report waiting now, of either family.
    pub fn drain(&mut self) -> Vec<Reported> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            match item.len() {
                n if n == std::mem::size_of::<MonitorEvent>() => {
                    out.push(Reported::V4(read_record(&item)))
                }
                n if n == std::mem::size_of::<MonitorEvent6>() => {
                    out.push(Reported::V6(read_record(&item)))
                }
                _ => {}
            }
        }
        out
    }
}
