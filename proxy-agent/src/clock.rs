//! The kernel clocks the datapath stamps its state with, read from user space.

/// `CLOCK_MONOTONIC`: the programs' `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE`: the programs' `bpf_ktime_get_coarse_ns`, the
/// clock of conntrack's `last_seen_ns`.
pub fn coarse_monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
