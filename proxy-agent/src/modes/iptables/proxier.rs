//! The iptables proxier: each sync writes one family's kube-proxy chains in
//! the filter and nat tables with one `iptables-restore --noflush` (all or
//! nothing), after making sure the built-in chains jump to them, and
//! deletes the service chains no longer wanted in the same restore, as
//! upstream's full syncs do.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::rules::{self, NodeRules};
use crate::{
    model::{DesiredState, IpFamily},
    modes::nftables::proxier::NftSettings,
    sync::{Proxier, SyncChanges},
};

/// The binaries of one family.
struct Tools {
    iptables: &'static str,
    save: &'static str,
    restore: &'static str,
}

fn tools(family: IpFamily) -> Tools {
    match family {
        IpFamily::V4 => Tools {
            iptables: "iptables",
            save: "iptables-save",
            restore: "iptables-restore",
        },
        IpFamily::V6 => Tools {
            iptables: "ip6tables",
            save: "ip6tables-save",
            restore: "ip6tables-restore",
        },
    }
}

/// Service chains this proxier owns (the fixed ones are always declared).
const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct IptablesSyncError(anyhow::Error);

pub struct IptablesProxier {
    /// The node-dependent settings are the nftables mode's: the same options.
    settings: NftSettings,
}

impl IptablesProxier {
    pub fn new(settings: NftSettings) -> Self {
        Self { settings }
    }

    fn node_rules(&self, family: IpFamily, desired: &DesiredState) -> NodeRules {
        let nft_family = match family {
            IpFamily::V4 => crate::modes::nftables::nft::Family::Ip,
            IpFamily::V6 => crate::modes::nftables::nft::Family::Ip6,
        };
        let n = self.settings.node_rules(nft_family, &desired.node);
        NodeRules {
            family,
            masquerade_mark: n.masquerade_mark,
            masquerade_all: n.masquerade_all,
            local: n.local,
            node_port_ips: n.node_port_ips,
            node_ip: n.node_ip,
        }
    }

    fn sync_family(&self, family: IpFamily, desired: &DesiredState) -> anyhow::Result<()> {
        let t = tools(family);
        for (table, chain, args) in rules::jumps() {
            ensure_jump(&t, table, chain, &args)?;
        }
        let stale = our_service_chains(&t)?;
        let restore = rules::build(&self.node_rules(family, desired), desired, &stale);
        run_restore(&t, &restore.text)
    }
}

/// Adds `-A`-style `args` at the top of `chain` unless present (upstream's EnsureRule).
fn ensure_jump(t: &Tools, table: &str, chain: &str, args: &[&str]) -> anyhow::Result<()> {
    // The target chain must exist before a rule can jump to it.
    let target = args.last().copied().unwrap_or_default();
    let _ = Command::new(t.iptables)
        .args(["-w", "-t", table, "-N", target])
        .stderr(Stdio::null())
        .status();
    let check = Command::new(t.iptables)
        .args(["-w", "-t", table, "-C", chain])
        .args(args)
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", t.iptables))?;
    if check.success() {
        return Ok(());
    }
    let out = Command::new(t.iptables)
        .args(["-w", "-t", table, "-I", chain])
        .args(args)
        .output()
        .with_context(|| format!("running {}", t.iptables))?;
    if !out.status.success() {
        bail!(
            "{} -t {table} -I {chain} {}: {}",
            t.iptables,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Our service chains in the filter and nat tables, from `iptables-save`.
fn our_service_chains(t: &Tools) -> anyhow::Result<BTreeMap<&'static str, BTreeSet<String>>> {
    let mut out = BTreeMap::new();
    for table in ["filter", "nat"] {
        let dump = Command::new(t.save)
            .args(["-t", table])
            .output()
            .with_context(|| format!("running {}", t.save))?;
        if !dump.status.success() {
            bail!(
                "{} -t {table}: {}",
                t.save,
                String::from_utf8_lossy(&dump.stderr).trim()
            );
        }
        let chains: BTreeSet<String> = String::from_utf8_lossy(&dump.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| SERVICE_CHAIN_PREFIXES.iter().any(|p| c.starts_with(p)))
            .map(str::to_owned)
            .collect();
        out.insert(table, chains);
    }
    Ok(out)
}

fn run_restore(t: &Tools, text: &str) -> anyhow::Result<()> {
    let mut child = Command::new(t.restore)
        .args(["-w", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", t.restore))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())
        .with_context(|| format!("writing to {}", t.restore))?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} refused the rules: {}",
            t.restore,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Proxier for IptablesProxier {
    type Error = IptablesSyncError;

    fn sync(&mut self, desired: &DesiredState, _: &SyncChanges) -> Result<(), Self::Error> {
        for family in IpFamily::BOTH {
            self.sync_family(family, desired).map_err(|e| {
                IptablesSyncError(e.context(format!("syncing the {family:?} iptables rules")))
            })?;
            match crate::modes::conntrack::clean_stale_udp(family, desired) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(family = ?family, flows = n, "deleted stale UDP conntrack entries")
                }
                Err(e) => {
                    tracing::warn!(family = ?family, error = %e, "could not clean stale UDP conntrack entries")
                }
            }
        }
        Ok(())
    }
}
