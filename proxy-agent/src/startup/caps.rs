//! The Linux capabilities each mode needs, checked once the mode is known so
//! that whatever is missing is named at once, each with what it is for,
//! instead of surfacing later as an EPERM from a probe, the verifier or
//! netlink.
//!
//! The ebpf mode, measured on 6.18 by running the agent under `setpriv`
//! with exactly these capabilities:
//! - CAP_BPF: the bpf() syscall itself (`kernel.unprivileged_bpf_disabled`),
//!   the maps and the programs. Pinning needs nothing more than access to
//!   the BPF filesystem's directory.
//! - CAP_PERFMON: without it the verifier refuses the programs' packet
//!   pointer arithmetic ("pointer arithmetic prohibited for !root").
//! - CAP_NET_ADMIN: loading TC and XDP programs at all, attaching them
//!   (netlink tc filters before 6.6), and removing what the other modes
//!   left (nftables, iptables-nft and IPVS speak netlink).
//! - CAP_SYS_RESOURCE: only before 5.11, where BPF memory is charged to
//!   RLIMIT_MEMLOCK and aya raises that limit to infinity (not needed when
//!   the hard limit already is).
//!
//! CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON (for runtimes that do
//! not know them), not for CAP_NET_ADMIN. Not needed: CAP_NET_RAW (only the
//! legacy iptables backend's leftovers would stay, with a warning), and
//! nothing at all for the host source's rtnetlink dumps and notifications.
//! Optional: CAP_SYS_RESOURCE also lowers `oom_score_adj` (a warning without).
//!
//! The netfilter modes need CAP_NET_ADMIN (rules, IPVS, conntrack settings)
//! and CAP_NET_RAW (the legacy iptables backend opens a raw socket).

use std::fmt;

use crate::{modes::ebpf::probe::parse_kernel_release, options::ProxyMode};

/// A capability: its name and its bit in the kernel's masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    pub name: &'static str,
    pub bit: u32,
}

impl Capability {
    const fn new(name: &'static str, bit: u32) -> Self {
        Capability { name, bit }
    }
}

pub const CAP_NET_ADMIN: Capability = Capability::new("CAP_NET_ADMIN", 12);
pub const CAP_NET_RAW: Capability = Capability::new("CAP_NET_RAW", 13);
pub const CAP_SYS_ADMIN: Capability = Capability::new("CAP_SYS_ADMIN", 21);
pub const CAP_SYS_RESOURCE: Capability = Capability::new("CAP_SYS_RESOURCE", 24);
pub const CAP_PERFMON: Capability = Capability::new("CAP_PERFMON", 38);
pub const CAP_BPF: Capability = Capability::new("CAP_BPF", 39);

/// A set of capabilities, as in the `Cap*` lines of /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn has(self, capability: Capability) -> bool {
        self.0 & 1 << capability.bit != 0
    }

    /// The `CapEff:` line of a /proc/PID/status text.
    pub fn effective_from_status(status: &str) -> Option<Self> {
        let hex = status
            .lines()
            .find_map(|line| line.strip_prefix("CapEff:"))?
            .trim();
        u64::from_str_radix(hex, 16).ok().map(CapSet)
    }
}

/// One capability a mode needs, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub capability: Capability,
    /// A capability that does as well.
    pub or: Option<Capability>,
    pub why: &'static str,
}

impl Need {
    fn met_by(&self, effective: CapSet) -> bool {
        effective.has(self.capability) || self.or.is_some_and(|c| effective.has(c))
    }
}

/// What of the host decides whether CAP_SYS_RESOURCE is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    /// `(major, minor)`, if the release could be read.
    pub kernel: Option<(u32, u32)>,
    /// The hard RLIMIT_MEMLOCK is RLIM_INFINITY.
    pub memlock_unlimited: bool,
}

impl Host {
    pub fn live() -> Self {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct it is given.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
        Host {
            kernel: parse_kernel_release(release.trim()),
            memlock_unlimited: read && limit.rlim_max == libc::RLIM_INFINITY,
        }
    }

    /// BPF maps and programs count against RLIMIT_MEMLOCK before 5.11
    /// (memory cgroup accounting replaced it then).
    fn charges_bpf_to_memlock(&self) -> bool {
        self.kernel.is_some_and(|k| k < (5, 11))
    }
}

/// What `mode` needs on `host`, in the order they are reported.
pub fn needs(mode: ProxyMode, host: &Host) -> Vec<Need> {
    match mode {
        ProxyMode::Ebpf => {
            let mut needs = vec![
                Need {
                    capability: CAP_BPF,
                    or: Some(CAP_SYS_ADMIN),
                    why: "create the maps and load the programs",
                },
                Need {
                    capability: CAP_PERFMON,
                    or: Some(CAP_SYS_ADMIN),
                    why: "the verifier allows the programs' packet pointer arithmetic only with it",
                },
                Need {
                    capability: CAP_NET_ADMIN,
                    or: None,
                    why: "load and attach TC and XDP programs, remove other modes' rules",
                },
            ];
            if host.charges_bpf_to_memlock() && !host.memlock_unlimited {
                needs.push(Need {
                    capability: CAP_SYS_RESOURCE,
                    or: None,
                    why: "raise RLIMIT_MEMLOCK, which kernels before 5.11 charge BPF maps to",
                });
            }
            needs
        }
        ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Nftables => vec![
            Need {
                capability: CAP_NET_ADMIN,
                or: None,
                why: "program netfilter and IPVS, and the conntrack settings",
            },
            Need {
                capability: CAP_NET_RAW,
                or: None,
                why: "run iptables, whose legacy backend opens a raw socket",
            },
        ],
    }
}

/// The capabilities `mode` needs that `effective` lacks.
pub fn missing(mode: ProxyMode, effective: CapSet, host: &Host) -> Vec<Need> {
    needs(mode, host)
        .into_iter()
        .filter(|need| !need.met_by(effective))
        .collect()
}

/// Capabilities a mode needs and the process has not.
#[derive(Debug, PartialEq, Eq)]
pub struct MissingCapabilities {
    pub mode: ProxyMode,
    pub missing: Vec<Need>,
}

impl fmt::Display for MissingCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = if self.missing.len() == 1 {
            "capability"
        } else {
            "capabilities"
        };
        write!(f, "missing {noun} for the {} mode: ", self.mode)?;
        for (i, need) in self.missing.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            write!(f, "{separator}{} ({})", need.capability.name, need.why)?;
        }
        // Every stand-in is CAP_SYS_ADMIN.
        let stood_in: Vec<(&str, &str)> = self
            .missing
            .iter()
            .filter_map(|n| Some((n.or?.name, n.capability.name)))
            .collect();
        if let Some((or, _)) = stood_in.first() {
            let names: Vec<&str> = stood_in.iter().map(|(_, name)| *name).collect();
            write!(f, "; {or} also does for {}", names.join(" and "))?;
        }
        Ok(())
    }
}

impl std::error::Error for MissingCapabilities {}

/// Checks this process's effective capabilities against what `mode` needs.
/// When /proc/self/status cannot be read, the check is skipped (logged).
pub fn check(mode: ProxyMode) -> Result<(), MissingCapabilities> {
    let status = std::fs::read_to_string("/proc/self/status");
    let Some(effective) = status
        .as_deref()
        .ok()
        .and_then(CapSet::effective_from_status)
    else {
        tracing::warn!("cannot read the effective capabilities (/proc/self/status); not checked");
        return Ok(());
    };
    let missing = missing(mode, effective, &Host::live());
    if missing.is_empty() {
        Ok(())
    } else {
        Err(MissingCapabilities { mode, missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW_KERNEL: Host = Host {
        kernel: Some((6, 18)),
        memlock_unlimited: false,
    };
    const ALL: CapSet = CapSet(u64::MAX >> 23); // CAP_CHOWN..CAP_CHECKPOINT_RESTORE (40)

    fn set(capabilities: &[Capability]) -> CapSet {
        CapSet(capabilities.iter().fold(0, |mask, c| mask | 1 << c.bit))
    }

    fn names(needs: &[Need]) -> Vec<&'static str> {
        needs.iter().map(|n| n.capability.name).collect()
    }

    #[test]
    fn the_effective_set_is_read_from_the_status_text() {
        let status = "Name:\tproxy-agent\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                      CapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\n";
        let effective = CapSet::effective_from_status(status).unwrap();
        assert_eq!(effective, CapSet(0x1ff_ffff_ffff));
        assert!(effective.has(CAP_BPF) && effective.has(CAP_NET_ADMIN));
        assert_eq!(
            CapSet::effective_from_status("CapEff:\t0000000000003000\n"),
            Some(set(&[CAP_NET_ADMIN, CAP_NET_RAW]))
        );
        assert_eq!(CapSet::effective_from_status("CapPrm:\t0\n"), None);
        assert_eq!(CapSet::effective_from_status("CapEff:\tzz\n"), None);
    }

    #[test]
    fn full_root_lacks_nothing_in_any_mode() {
        let old = Host {
            kernel: Some((5, 10)),
            memlock_unlimited: false,
        };
        for mode in ProxyMode::ALL {
            for host in [NEW_KERNEL, old] {
                assert_eq!(missing(mode, ALL, &host), [], "{mode} {host:?}");
            }
        }
    }

    #[test]
    fn the_ebpf_mode_needs_bpf_perfmon_and_net_admin() {
        let none = missing(ProxyMode::Ebpf, CapSet(0), &NEW_KERNEL);
        assert_eq!(names(&none), ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"]);

        let least = set(&[CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN]);
        assert_eq!(missing(ProxyMode::Ebpf, least, &NEW_KERNEL), []);
        // CAP_SYS_ADMIN does for CAP_BPF and CAP_PERFMON, not for CAP_NET_ADMIN.
        let sys_admin = set(&[CAP_SYS_ADMIN]);
        let lacking = missing(ProxyMode::Ebpf, sys_admin, &NEW_KERNEL);
        assert_eq!(names(&lacking), ["CAP_NET_ADMIN"]);
        let with_net_admin = set(&[CAP_SYS_ADMIN, CAP_NET_ADMIN]);
        assert_eq!(missing(ProxyMode::Ebpf, with_net_admin, &NEW_KERNEL), []);
        // The netfilter modes' capabilities do nothing for it.
        let netfilter = set(&[CAP_NET_ADMIN, CAP_NET_RAW]);
        let lacking = missing(ProxyMode::Ebpf, netfilter, &NEW_KERNEL);
        assert_eq!(names(&lacking), ["CAP_BPF", "CAP_PERFMON"]);
    }

    #[test]
    fn sys_resource_only_where_bpf_memory_counts_against_memlock() {
        let least = set(&[CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN]);
        let host = |kernel, memlock_unlimited| Host {
            kernel,
            memlock_unlimited,
        };
        let lacking = missing(ProxyMode::Ebpf, least, &host(Some((5, 10)), false));
        assert_eq!(names(&lacking), ["CAP_SYS_RESOURCE"]);
        for fine in [
            host(Some((5, 10)), true),
            host(Some((5, 11)), false),
            host(Some((6, 1)), false),
            host(None, false),
        ] {
            assert_eq!(missing(ProxyMode::Ebpf, least, &fine), [], "{fine:?}");
        }
        // The netfilter modes load no BPF.
        let netfilter = set(&[CAP_NET_ADMIN, CAP_NET_RAW]);
        assert_eq!(
            missing(ProxyMode::Iptables, netfilter, &host(Some((5, 10)), false)),
            []
        );
    }

    #[test]
    fn the_netfilter_modes_need_net_admin_and_net_raw() {
        for mode in [ProxyMode::Iptables, ProxyMode::Ipvs, ProxyMode::Nftables] {
            let none = missing(mode, CapSet(0), &NEW_KERNEL);
            assert_eq!(names(&none), ["CAP_NET_ADMIN", "CAP_NET_RAW"], "{mode}");
            let raw = set(&[CAP_NET_RAW]);
            assert_eq!(names(&missing(mode, raw, &NEW_KERNEL)), ["CAP_NET_ADMIN"]);
            let ebpf_set = set(&[CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN, CAP_SYS_ADMIN]);
            assert_eq!(
                names(&missing(mode, ebpf_set, &NEW_KERNEL)),
                ["CAP_NET_RAW"]
            );
        }
    }

    #[test]
    fn the_error_is_one_line_naming_each_capability_and_why() {
        let error = |mode, effective| MissingCapabilities {
            mode,
            missing: missing(mode, effective, &NEW_KERNEL),
        };
        assert_eq!(
            error(ProxyMode::Ebpf, CapSet(0)).to_string(),
            "missing capabilities for the ebpf mode: \
             CAP_BPF (create the maps and load the programs), \
             CAP_PERFMON (the verifier allows the programs' packet pointer arithmetic only with it), \
             CAP_NET_ADMIN (load and attach TC and XDP programs, remove other modes' rules); \
             CAP_SYS_ADMIN also does for CAP_BPF and CAP_PERFMON"
        );
        assert_eq!(
            error(ProxyMode::Ebpf, set(&[CAP_SYS_ADMIN])).to_string(),
            "missing capability for the ebpf mode: \
             CAP_NET_ADMIN (load and attach TC and XDP programs, remove other modes' rules)"
        );
        assert_eq!(
            error(ProxyMode::Nftables, set(&[CAP_NET_ADMIN])).to_string(),
            "missing capability for the nftables mode: \
             CAP_NET_RAW (run iptables, whose legacy backend opens a raw socket)"
        );
    }
}
