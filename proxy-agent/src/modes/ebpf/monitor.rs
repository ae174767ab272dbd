//! The user side of the monitor channel (`proxy_common::monitor`): a lease
//! that turns the programs' reports on while it is renewed, and the ring
//! buffer they report into. Used by `proxy-agent monitor`.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use aya::maps::{Array, MapData, RingBuf};
use proxy_common::{
    MonitorControl, MonitorEvent,
    monitor::{LEASE_NS, RENEW_NS},
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

/// This monitor's hold on `MONITOR`. Several monitors share the entry: each
/// only ever extends what it wants, so none turns another off, and one that
/// dies stops the reports within [`LEASE_NS`].
pub struct Lease {
    control: Array<MapData, MonitorControl>,
    wanted: Wanted,
    /// What this monitor last wrote, to release only a lease nobody renewed since.
    written: Option<MonitorControl>,
    renewed_at: u64,
}

impl Lease {
    pub fn take(
        control: Array<MapData, MonitorControl>,
        wanted: Wanted,
    ) -> Result<Self, aya::maps::MapError> {
        let mut lease = Lease {
            control,
            wanted,
            written: None,
            renewed_at: 0,
        };
        lease.renew()?;
        Ok(lease)
    }

    /// Extends the lease (call at least every [`RENEW_NS`]; [`Lease::due`] says when).
    pub fn renew(&mut self) -> Result<(), aya::maps::MapError> {
        let now = monotonic_ns();
        let until = now + LEASE_NS;
        let mut control = self.control.get(&0, 0)?;
        if self.wanted.drops {
            control.drops_until_ns = control.drops_until_ns.max(until);
        }
        if self.wanted.flows {
            control.flows_until_ns = control.flows_until_ns.max(until);
        }
        self.control.set(0, control, 0)?;
        self.written = Some(control);
        self.renewed_at = now;
        Ok(())
    }

    pub fn due(&self) -> bool {
        monotonic_ns().saturating_sub(self.renewed_at) >= RENEW_NS
    }

    /// Ends the reports at once when no other monitor renewed since this one
    /// did; otherwise the others keep theirs.
    pub fn release(&mut self) -> Result<(), aya::maps::MapError> {
        let current = self.control.get(&0, 0)?;
        if Some(current) == self.written.take() {
            let mut control = current;
            let now = monotonic_ns();
            if self.wanted.drops {
                control.drops_until_ns = now;
            }
            if self.wanted.flows {
                control.flows_until_ns = now;
            }
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
