//! `--cleanup`: remove everything any proxy mode left on the node — ours (BPF pins and
//! attachments, our iptables chains and nftables table, IPVS state) and upstream kube-proxy's
//! (KUBE-* chains, `kube-proxy` nftables tables, IPVS services, `kube-ipvs0`, KUBE-* ipsets) —
//! report it, and succeed when nothing was there. Running it twice is harmless. Each mode's
//! own cleaner lives with the mode (`crate::modes::*::cleanup`); this runs them.

pub mod exec;

use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::modes::ipvs::cleanup::{FakeGenl, GenlTransport, NetlinkTransport};
pub use exec::{CommandRunner, FakeRunner, ProcessRunner};

use crate::modes::{self, CleanupTools};
use crate::options::ProxyMode;

/// One thing removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    BpfPin {
        path: PathBuf,
    },
    Xdp {
        iface: String,
    },
    TcFilter {
        iface: String,
        direction: &'static str,
    },
    NftTable {
        family: String,
        name: String,
    },
    IptablesChain {
        family: &'static str,
        table: String,
        chain: String,
    },
    IptablesRule {
        family: &'static str,
        table: String,
        rule: String,
    },
    IpvsServices {
        count: usize,
    },
    Link {
        name: String,
    },
    IpSet {
        name: String,
    },
}

impl fmt::Display for Removed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Removed::BpfPin { path } => write!(f, "BPF pin {}", path.display()),
            Removed::Xdp { iface } => write!(f, "XDP program on {iface}"),
            Removed::TcFilter { iface, direction } => write!(f, "TC {direction} filter on {iface}"),
            Removed::NftTable { family, name } => write!(f, "nftables table {family} {name}"),
            Removed::IptablesChain {
                family,
                table,
                chain,
            } => write!(f, "{family} iptables chain {table}/{chain}"),
            Removed::IptablesRule {
                family,
                table,
                rule,
            } => write!(f, "{family} iptables rule in {table}: {rule}"),
            Removed::IpvsServices { count } => write!(f, "{count} IPVS virtual service(s)"),
            Removed::Link { name } => write!(f, "interface {name}"),
            Removed::IpSet { name } => write!(f, "ipset {name}"),
        }
    }
}

/// What a cleanup did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub removed: Vec<Removed>,
    /// Failures; any makes `--cleanup` exit non-zero.
    pub errors: Vec<String>,
    /// Things deliberately left alone.
    pub notes: Vec<String>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("encountered an error while tearing down rules: {}", errors.join("; "))]
pub struct CleanupError {
    pub errors: Vec<String>,
}

/// Runs every mode's cleaner. Order: BPF attachments and pins, nftables, iptables, then IPVS
/// (its ipsets can only go once no iptables rule references them).
pub fn cleanup_all(
    run: &mut dyn CommandRunner,
    genl: &mut dyn GenlTransport,
    pin_root: &Path,
) -> Report {
    let mut report = Report::default();
    let mut tools = CleanupTools {
        run,
        genl,
        pin_root,
    };
    for mode in [
        ProxyMode::Ebpf,
        ProxyMode::Nftables,
        ProxyMode::Iptables,
        ProxyMode::Ipvs,
    ] {
        modes::of(mode).cleanup(&mut tools, &mut report);
    }
    report
}

/// Best-effort removal, at a normal start, of what *other* modes left behind (upstream's
/// `platformCleanup` without `--cleanup`): nftables mode removes iptables and IPVS leftovers,
/// iptables/ipvs modes remove nftables leftovers, and ebpf mode removes all three so a node
/// migrated from kube-proxy carries no stale rules. Our BPF pins are never touched here.
pub fn leftovers_of_other_modes(
    mode: ProxyMode,
    run: &mut dyn CommandRunner,
    genl: &mut dyn GenlTransport,
) -> Report {
    let others: &[ProxyMode] = match mode {
        ProxyMode::Nftables => &[ProxyMode::Iptables, ProxyMode::Ipvs],
        ProxyMode::Iptables | ProxyMode::Ipvs => &[ProxyMode::Nftables],
        ProxyMode::Ebpf => &[ProxyMode::Nftables, ProxyMode::Iptables, ProxyMode::Ipvs],
    };
    let mut report = Report::default();
    let mut tools = CleanupTools {
        run,
        genl,
        pin_root: Path::new(""),
    };
    for other in others {
        modes::of(*other).cleanup(&mut tools, &mut report);
    }
    report
}
