//! The conntrack collector (`CT_COLLECTOR`, one element). The conntrack
//! tables are plain hashes: a new flow never evicts a live one, as in the
//! kernel's conntrack, and nothing is removed by being old. Sweeps of both
//! tables delete the entries whose idle timeout passed ([`removal`]). A
//! running agent sweeps every [`SWEEP_INTERVAL_NS`] from a thread of its
//! own, walking the tables from user space in batches (so its CPU's other
//! threads and softirqs run between them), and hands what it did to the
//! program `ct_collector_sweep` ([`AgentSweep`]), which records it and holds
//! off a BPF timer in this map's value for [`AGENT_GRACE_NS`]. The timer,
//! armed by the agent, keeps firing while the map is pinned: it sweeps when
//! no agent did (so the tables keep room for new flows whether the agent
//! runs or not), and at once when a table is full.

use crate::{DatapathConfig, conntrack::flags, conntrack::idle_timeout};

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

impl CollectorStats {
    /// Whether a full table asked for a sweep that has not run yet: the
    /// next sweep runs under pressure.
    #[inline(always)]
    pub fn kick_pending(&self) -> bool {
        self.kicked_ns != 0 && self.kicked_ns >= self.last_sweep_ns
    }
}

/// Why a sweep deletes an entry.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Idle longer than its state's timeout.
    Expired,
    /// Under pressure: never saw a reply and idle
    /// [`UNANSWERED_UNDER_PRESSURE_NS`].
    Unanswered,
}

/// Whether a sweep at `now` (the coarse clock of `last_seen_ns`) deletes an
/// entry of protocol `proto` with `entry_flags`, and why.
#[inline(always)]
pub fn removal(
    config: &DatapathConfig,
    now: u64,
    pressure: bool,
    proto: u8,
    entry_flags: u16,
    last_seen_ns: u64,
) -> Option<Removal> {
    let idle = now.saturating_sub(last_seen_ns);
    if idle > idle_timeout(config, proto, entry_flags) {
        Some(Removal::Expired)
    } else if pressure
        && entry_flags & flags::SEEN_REPLY == 0
        && idle >= UNANSWERED_UNDER_PRESSURE_NS
    {
        Some(Removal::Unanswered)
    } else {
        None
    }
}

/// What an agent's sweep did, handed to `ct_collector_sweep` as its test
/// run's data: the program adds it to the stats and pushes the timer back.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentSweep {
    /// The coarse clock the sweep judged the entries by, read at its start.
    pub started_ns: u64,
    pub took_ns: u64,
    /// 1 when it swept under pressure (a kick was pending at its start).
    pub pressure: u64,
    /// Entries left in each table.
    pub live: u64,
    pub live6: u64,
    pub removed: u64,
    pub removed_under_pressure: u64,
}

impl AgentSweep {
    /// The bytes handed to the program (a test run needs at least an
    /// Ethernet header's 14).
    pub fn to_bytes(&self) -> [u8; core::mem::size_of::<AgentSweep>()] {
        let words = [
            self.started_ns,
            self.took_ns,
            self.pressure,
            self.live,
            self.live6,
            self.removed,
            self.removed_under_pressure,
        ];
        let mut bytes = [0u8; core::mem::size_of::<AgentSweep>()];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        bytes
    }
}

/// The map value as user space reads it: the kernel's `struct bpf_timer`
/// (16 bytes, read as zeros) and the stats.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectorValue {
    pub timer: [u64; 2],
    pub stats: CollectorStats,
}

/// The time between two sweeps. The timer's sweep takes about 2 ms for two
/// empty tables of 262,144 entries, 19 ms with 250,000 entries and over 100
/// ms for a full table of 2^20 on the VMs of docs/datapath.md, in softirq
/// (that CPU's packets wait for it); the agent's walks the tables a batch
/// per system call. A full table asks the timer for one sooner
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
    fn an_entry_goes_when_idle_past_its_states_timeout_or_unanswered_under_pressure() {
        let config = DatapathConfig {
            tcp_established_ns: 100,
            tcp_syn_sent_ns: 50,
            ..DatapathConfig::default()
        };
        let tcp = crate::proto::TCP;
        let answered = flags::SEEN_REPLY;
        let second = UNANSWERED_UNDER_PRESSURE_NS;
        assert_eq!(removal(&config, 1_000, false, tcp, answered, 900), None);
        assert_eq!(
            removal(&config, 1_000, false, tcp, answered, 899),
            Some(Removal::Expired)
        );
        // A SYN_SENT entry has its own, shorter timeout.
        assert_eq!(
            removal(&config, 1_000, false, tcp, 0, 949),
            Some(Removal::Expired)
        );
        // Under pressure an unanswered flow goes after a second idle, an answered one does not.
        let config = DatapathConfig {
            tcp_syn_sent_ns: 10 * second,
            tcp_established_ns: 10 * second,
            ..config
        };
        assert_eq!(removal(&config, 3 * second, false, tcp, 0, second), None);
        assert_eq!(
            removal(&config, 3 * second, true, tcp, 0, second),
            Some(Removal::Unanswered)
        );
        assert_eq!(
            removal(&config, 3 * second, true, tcp, answered, second),
            None
        );
        assert_eq!(removal(&config, second, true, tcp, 0, 1), None);
    }

    #[test]
    fn an_agent_sweep_is_handed_over_as_its_fields_in_order() {
        let report = AgentSweep {
            started_ns: 1,
            took_ns: 2,
            pressure: 3,
            live: 4,
            live6: 5,
            removed: 6,
            removed_under_pressure: 7,
        };
        let bytes = report.to_bytes();
        // SAFETY: AgentSweep is repr(C), u64 fields only; read_unaligned copes with the array.
        let back: AgentSweep = unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast()) };
        assert_eq!(back, report);
        assert!(bytes.len() >= 14);
    }

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
