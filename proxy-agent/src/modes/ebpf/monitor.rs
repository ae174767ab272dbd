//! The user side of the monitor channel (`proxy_common::monitor`): a slot's
//! lease that turns the programs' reports on while it is renewed, and the
//! slot's ring buffer they report into. Used by `proxy-agent monitor`.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use aya::maps::{Array, MapData, RingBuf};
use proxy_common::{
    MonitorControl, MonitorEvent, MonitorSlot,
    monitor::{LEASE_NS, MONITOR_SLOTS, RENEW_NS},
};

/// `CLOCK_MONOTONIC`, the programs' `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
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

/// This monitor's slot in `MONITOR`: its own lease and ring, so monitors
/// never take each other's events or turn each other off. A monitor that
/// dies stops its reports within [`LEASE_NS`], which frees the slot.
pub struct Lease {
    control: Array<MapData, MonitorControl>,
    slot: usize,
    owner: u32,
    wanted: Wanted,
    renewed_at: u64,
}

impl Lease {
    /// Claims a free slot (one whose lease ran out).
    pub fn take(
        mut control: Array<MapData, MonitorControl>,
        wanted: Wanted,
    ) -> Result<Self, LeaseError> {
        let owner = std::process::id();
        for slot in 0..MONITOR_SLOTS {
            let now = monotonic_ns();
            let current = control.get(&0, 0)?.slots[slot];
            if current.drops_until_ns > now || current.flows_until_ns > now {
                continue;
            }
            let mut lease = Lease {
                control,
                slot,
                owner,
                wanted,
                renewed_at: 0,
            };
            lease.renew()?;
            // Two monitors may have picked the same free slot: the last
            // writer holds it, the other looks further.
            std::thread::sleep(Duration::from_millis(2));
            if lease.control.get(&0, 0)?.slots[slot].owner == owner {
                return Ok(lease);
            }
            control = lease.control;
        }
        Err(LeaseError::Full)
    }

    /// The ring this lease's reports go to (`MONITOR_RINGS[slot]`).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Extends the lease (call at least every [`RENEW_NS`]; [`Lease::due`] says when).
    pub fn renew(&mut self) -> Result<(), aya::maps::MapError> {
        let now = monotonic_ns();
        let until = now + LEASE_NS;
        let mut control = self.control.get(&0, 0)?;
        control.slots[self.slot] = MonitorSlot {
            drops_until_ns: if self.wanted.drops { until } else { 0 },
            flows_until_ns: if self.wanted.flows { until } else { 0 },
            owner: self.owner,
            _pad: 0,
        };
        self.control.set(0, control, 0)?;
        self.renewed_at = now;
        Ok(())
    }

    pub fn due(&self) -> bool {
        monotonic_ns().saturating_sub(self.renewed_at) >= RENEW_NS
    }

    /// Ends this monitor's reports at once and frees the slot.
    pub fn release(&mut self) -> Result<(), aya::maps::MapError> {
        let mut control = self.control.get(&0, 0)?;
        let slot = &mut control.slots[self.slot];
        if slot.owner == self.owner {
            slot.drops_until_ns = 0;
            slot.flows_until_ns = 0;
            self.control.set(0, control, 0)?;
        }
        Ok(())
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
    pub fn wait(&mut self, timeout: Duration) -> Vec<MonitorEvent> {
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

    /// Every report waiting now.
    pub fn drain(&mut self) -> Vec<MonitorEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            if item.len() >= std::mem::size_of::<MonitorEvent>() {
                // SAFETY: the programs submit whole MonitorEvents (plain data);
                // read_unaligned copes with any alignment of the ring's bytes.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<MonitorEvent>()) });
            }
        }
        out
    }
}
