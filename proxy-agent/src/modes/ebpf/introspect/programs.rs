//! Our programs as the kernel has them loaded, with the run time and run
//! count it accounts while BPF statistics are on.

use std::collections::BTreeSet;

use serde::Serialize;

use super::IntrospectError;
use crate::modes::ebpf::{
    PROG_FROM_HOST, PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP, SOCKET_PROGRAMS,
};

/// One loaded program of the datapath.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramStats {
    pub id: u32,
    /// The program's name in the object (`sock_getpeername4`), or the
    /// kernel's 15-character name when it is none of ours.
    pub name: String,
    /// Nanoseconds spent running, accounted only while statistics are on.
    pub run_time_ns: u64,
    /// Runs, accounted only while statistics are on.
    pub run_count: u64,
}

/// The programs that use one of `map_ids` (the datapath's maps): those of
/// the agent owning the maps, and only those (another agent's, or a test's,
/// use other maps).
pub fn our_programs(map_ids: &BTreeSet<u32>) -> Result<Vec<ProgramStats>, IntrospectError> {
    let mut out = Vec::new();
    for info in aya::programs::loaded_programs() {
        let info = match info {
            Ok(info) => info,
            // Unloaded between listing and reading.
            Err(_) => continue,
        };
        let uses_ours = info
            .map_ids()
            .ok()
            .flatten()
            .is_some_and(|ids| ids.iter().any(|id| map_ids.contains(id)));
        if !uses_ours {
            continue;
        }
        let kernel_name = info.name_as_str().unwrap_or_default();
        out.push(ProgramStats {
            id: info.id(),
            name: full_name(kernel_name).to_owned(),
            run_time_ns: info.run_time().as_nanos() as u64,
            run_count: info.run_count(),
        });
    }
    out.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
    Ok(out)
}

/// BPF_OBJ_NAME_LEN less its NUL.
const KERNEL_NAME_MAX: usize = 15;

/// The object's name of a program the kernel names with at most 15 characters.
pub fn full_name(kernel_name: &str) -> &str {
    [PROG_FROM_POD, PROG_FROM_NETDEV, PROG_FROM_HOST, PROG_XDP]
        .into_iter()
        .chain(SOCKET_PROGRAMS)
        .find(|full| {
            *full == kernel_name
                || (kernel_name.len() == KERNEL_NAME_MAX && full.starts_with(kernel_name))
        })
        .unwrap_or(kernel_name)
}

/// Where the kernel's BPF run-time statistics stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BpfStats {
    /// `kernel.bpf_stats_enabled` is 1: run time and counts are accounted.
    On,
    /// The sysctl is 0. A process holding a BPF_ENABLE_STATS descriptor
    /// still turns accounting on without the sysctl showing it: counts that
    /// move tell.
    Off,
    /// The sysctl cannot be read.
    Unknown,
}

/// Reads `kernel.bpf_stats_enabled` (never changes it).
pub fn bpf_stats() -> BpfStats {
    match std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled") {
        Ok(s) if s.trim() == "1" => BpfStats::On,
        Ok(_) => BpfStats::Off,
        Err(_) => BpfStats::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::full_name;

    #[test]
    fn kernel_names_cut_at_15_characters_map_back_to_the_programs() {
        assert_eq!(full_name("sock_getpeernam"), "sock_getpeername4");
        assert_eq!(full_name("xdp_from_netdev"), "xdp_from_netdev");
        assert_eq!(full_name("tc_from_pod"), "tc_from_pod");
        assert_eq!(full_name("something_else"), "something_else");
        assert_eq!(full_name(""), "");
        assert_eq!(
            full_name("tc_from"),
            "tc_from",
            "only a cut name is completed"
        );
    }
}
