//! The conntrack collector (`CT_COLLECTOR`, one element). The conntrack
//! tables are plain hashes: a new flow never evicts a live one, as in the
//! kernel's conntrack, and nothing is removed by being old. Sweeps of both
//! tables delete the entries whose idle timeout passed. A running agent
//! sweeps every [`SWEEP_INTERVAL_NS`] from a thread of its own (in process
//! context: the CPU's softirqs go on meanwhile), and each of its sweeps
//! holds off a BPF timer in this map's value for [`AGENT_GRACE_NS`]. The
//! timer, armed by the agent, keeps firing while the map is pinned: it
//! sweeps when no agent did (so the tables keep room for new flows whether
//! the agent runs or not), and at once when a table is full.

/// What the sweeps did, the value's fields after the kernel's timer.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectorStats {
    pub sweeps: u64,
    /// Entries deleted, over every sweep.
    pub removed: u64,
    /// Of them, live entries of flows that never saw a reply, deleted
    /// because the table was full ([`UNANSWERED_UNDER_PRESSURE_NS`]).
    pub removed_under_pressure: u64,
    /// Entries left in each table after the last sweep.
    pub live: u64,
    pub live6: u64,
    /// The coarse clock at the start of the last sweep (the clock of the
    /// entries' `last_seen_ns`), and how long the sweep took.
    pub last_sweep_ns: u64,
    pub last_sweep_took_ns: u64,
    /// The last time a new flow found a table full and asked for a sweep
    /// ([`KICK_GAP_NS`]); the sweep that follows runs under pressure.
    pub kicked_ns: u64,
}

/// The map value as user space reads it: the kernel's `struct bpf_timer`
/// (16 bytes, read as zeros) and the stats.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectorValue {
    pub timer: [u64; 2],
    pub stats: CollectorStats,
}

/// The time between two sweeps. A sweep takes about 2 ms for two empty
/// tables of 262,144 entries, 19 ms with 250,000 entries and over 100 ms
/// for a full table of 2^20 on the VMs of docs/datapath.md: the agent's
/// with its CPU's preemption off, the timer's in softirq (that CPU's
/// packets wait for it). A full table asks the timer for one sooner
/// ([`KICK_GAP_NS`]).
pub const SWEEP_INTERVAL_NS: u64 = 10_000_000_000;
/// An agent's sweep pushes the timer's next firing this far back: while the
/// agent sweeps every [`SWEEP_INTERVAL_NS`], the timer never sweeps but
/// under pressure; once it stops, the timer takes over within this.
pub const AGENT_GRACE_NS: u64 = 2 * SWEEP_INTERVAL_NS;
/// A full table asks for a sweep at once, at most this often.
pub const KICK_GAP_NS: u64 = 100_000_000;
/// ... and at most once per this many lengths of the last sweep: a table
/// full of live flows, which a sweep cannot free, keeps the timer's CPU in
/// sweeps for at most a tenth of its time.
pub const KICK_GAP_SWEEPS: u64 = 10;
/// Under pressure (a full table) a sweep also deletes the flows that never
/// saw a reply and were idle this long, as the kernel's early drop evicts
/// unassured entries first: a flood of unanswered SYNs cannot hold the table.
pub const UNANSWERED_UNDER_PRESSURE_NS: u64 = 1_000_000_000;

/// `ct_collector_arm`'s answer when the kernel refused the timer: this plus
/// the helper's errno (capped at [`ARM_ERRNO_MAX`]), so the agent can say why.
/// Armed, it answers `XDP_PASS`.
pub const ARM_REFUSED: u32 = 0x1000;
pub const ARM_ERRNO_MAX: u32 = 0xfff;

/// The errno of an arming answer, when it is a refusal.
pub fn arm_refusal_errno(answer: u32) -> Option<i32> {
    (ARM_REFUSED..=ARM_REFUSED + ARM_ERRNO_MAX)
        .contains(&answer)
        .then(|| (answer - ARM_REFUSED) as i32)
}

/// The arming program's answer for the helpers' result `ret` (0 or a
/// negative errno).
pub fn arm_answer(ret: i64) -> u32 {
    if ret == 0 {
        crate::action::XDP_PASS as u32
    } else {
        ARM_REFUSED + ret.unsigned_abs().min(u64::from(ARM_ERRNO_MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arming_answer_carries_the_kernels_errno_and_never_looks_like_a_verdict() {
        use crate::action::{XDP_ABORTED, XDP_PASS, XDP_REDIRECT};
        assert_eq!(arm_answer(0), XDP_PASS as u32);
        assert_eq!(arm_refusal_errno(arm_answer(0)), None);
        // -EBUSY, -EPERM, -EOPNOTSUPP as the helpers return them.
        for errno in [16, 1, 95] {
            assert_eq!(arm_refusal_errno(arm_answer(-errno)), Some(errno as i32));
        }
        assert_eq!(
            arm_refusal_errno(arm_answer(-1_000_000)),
            Some(ARM_ERRNO_MAX as i32)
        );
        assert!(
            (XDP_ABORTED..=XDP_REDIRECT).all(|verdict| arm_refusal_errno(verdict as u32).is_none())
        );
    }
}
