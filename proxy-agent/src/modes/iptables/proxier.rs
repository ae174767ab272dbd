//! The iptables proxier: each sync writes one family's kube-proxy chains in
//! the filter and nat tables with one `iptables-restore --noflush` (all or
//! nothing). A full sync makes sure the built-in chains jump to ours, and
//! deletes the service chains no longer wanted; a partial sync (upstream's
//! minimal restore) writes the shared chains and only the changed service
//! ports' own chains, deleting those they no longer use. The periodic
//! sync, finding upstream's canary chain gone (the tables flushed from
//! outside), syncs in full.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    backend::{IptablesBackend, Tools},
    nfacct,
    rules::{self, NfacctCounters, NodeRules, OwnChains},
};
use crate::{
    metrics::{IptablesMetrics, rules::NfacctMetric},
    model::{DesiredState, FamilySet, IpFamily, ServicePortName},
    modes::nftables::proxier::NftSettings,
    sync::{FamilySyncError, Proxier, RulesRefused, SyncChanges, sync_each_family},
};

pub struct IptablesProxier {
    /// The node-dependent settings are the nftables mode's: the same options.
    settings: NftSettings,
    backend: IptablesBackend,
    /// Per family (IPv4, IPv6), what the last successful sync wrote
    /// (`None`: unknown, the next sync is full).
    written: [Option<Written>; 2],
    /// Deletes stale UDP flows after each family's sync, as upstream.
    reconciler: crate::modes::conntrack::Reconciler,
    /// Rule counts and partial restore failures, as upstream reports them.
    metrics: IptablesMetrics,
    /// Whether the rules drop conntrack INVALID packets, as upstream
    /// decides once at start.
    drop_invalid: bool,
    /// The nfacct objects that exist for the rules to count into.
    counters: NfacctCounters,
}

/// One family's rules as written: what a partial sync builds on.
struct Written {
    node: NodeRules,
    services: BTreeMap<ServicePortName, OwnChains>,
    /// Whether the mangle canary was made: only then does its absence say
    /// the tables were flushed (a node without a mangle table has none).
    canary: bool,
}

impl IptablesProxier {
    /// On the backend the node uses (see `backend`).
    pub fn new(settings: NftSettings) -> Self {
        let (backend, why) = IptablesBackend::detect();
        tracing::info!(backend = backend.name(), why, "iptables backend");
        Self::with_backend(settings, backend)
    }

    /// The mode's own metrics, to be served: the conntrack reconciler's,
    /// the rule counts and partial restore failures.
    pub fn metrics(&self) -> Vec<Box<dyn prometheus_client::collector::Collector>> {
        vec![
            Box::new(self.reconciler.metrics()),
            Box::new(self.metrics.clone()),
        ]
    }

    pub fn with_backend(settings: NftSettings, backend: IptablesBackend) -> Self {
        let tcp_be_liberal = conntrack_tcp_be_liberal();
        if tcp_be_liberal {
            tracing::info!(
                "nf_conntrack_tcp_be_liberal set: no DROP rule for conntrack INVALID packets, \
                 as upstream"
            );
        }
        let counters = ensure_counters();
        let counted = [
            (
                counters.invalid_dropped,
                NfacctMetric::CtStateInvalidDropped,
                nfacct::CT_STATE_INVALID_DROPPED,
            ),
            (
                counters.localhost_node_ports_accepted,
                NfacctMetric::LocalhostNodePortsAccepted,
                nfacct::LOCALHOST_NODE_PORTS_ACCEPTED,
            ),
        ]
        .into_iter()
        .filter(|(exists, _, _)| *exists)
        .map(|(_, metric, object)| (metric, object))
        .collect();
        Self {
            drop_invalid: !tcp_be_liberal,
            counters,
            metrics: IptablesMetrics::new(&IpFamily::BOTH).reading_nfacct(counted, nfacct::packets),
            settings,
            backend,
            written: [None, None],
            reconciler: Default::default(),
        }
    }

    pub fn backend(&self) -> IptablesBackend {
        self.backend
    }

    fn sync_family(
        &mut self,
        family: IpFamily,
        desired: &DesiredState,
        changes: &SyncChanges,
    ) -> anyhow::Result<()> {
        let slot = match family {
            IpFamily::V4 => 0,
            IpFamily::V6 => 1,
        };
        let t = self.backend.tools(family);
        let node = NodeRules {
            drop_invalid: self.drop_invalid,
            counters: self.counters,
            ..NodeRules::new(&self.settings, family, &desired.node)
        };
        // Unknown until this sync succeeds.
        let mut previous = self.written[slot]
            .take()
            .filter(|w| !changes.full && w.node == node);
        // Checked by the periodic sync (no change, every `syncPeriod`: upstream's
        // polling interval), not by one a change triggered: the check costs
        // an `iptables` run per family, and a change must not wait on it.
        let periodic = changes.changed.is_empty();
        if periodic && previous.as_ref().is_some_and(|w| w.canary) && tables_flushed(&t, family) {
            tracing::warn!(
                ?family,
                "{CANARY} is gone from the mangle table: the tables were flushed from outside \
                 (a firewall reload?); syncing in full"
            );
            previous = None;
        }
        let mut canary = previous.as_ref().is_some_and(|w| w.canary);
        let restore = match &previous {
            // Upstream's partial sync: the shared chains are rewritten, and
            // only the changed ports' own chains; the jumps from the
            // built-in chains were ensured by a full sync.
            Some(w) => {
                let mut stale: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
                for own in changes.changed.iter().filter_map(|spn| w.services.get(spn)) {
                    for (table, chains) in own {
                        stale
                            .entry(*table)
                            .or_default()
                            .extend(chains.iter().cloned());
                    }
                }
                rules::build(&node, desired, &stale, &|spn| changes.changed.contains(spn))
            }
            None => {
                for (table, chain, args) in rules::jumps(&node) {
                    ensure_jump(&t, table, chain, &args)?;
                }
                // The restore writes nat's and filter's.
                ensure_chain(&t, "mangle", CANARY);
                canary = match chain_exists(&t, "mangle", CANARY) {
                    Ok(true) => true,
                    found => {
                        tracing::warn!(
                            ?family,
                            error = found.err().map(|e| format!("{e:#}")),
                            "cannot make {CANARY} in the mangle table: a firewall reload \
                             will be noticed by the partial sync's failure instead"
                        );
                        false
                    }
                };
                let stale = our_service_chains(&t)?;
                rules::build(&node, desired, &stale, &|_| true)
            }
        };
        if let Err(e) = run_restore(&t, &restore.text) {
            if previous.is_some() {
                self.metrics.partial_restore_failed(family);
            }
            return Err(e.context(RulesRefused));
        }
        for (table, counts) in &restore.rule_counts {
            self.metrics
                .rules(family, table, counts.written, counts.total);
        }
        self.written[slot] = Some(Written {
            node,
            services: restore.services,
            canary,
        });
        Ok(())
    }
}

/// Creates upstream's two nfacct objects unless they exist; a rule counts
/// only into one that does (an error is logged, as upstream logs it).
fn ensure_counters() -> NfacctCounters {
    let ensure = |name: &str| match nfacct::ensure(name) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                counter = name,
                error = %e,
                "cannot create the nfacct counter; its metric will not be updated"
            );
            false
        }
    };
    NfacctCounters {
        invalid_dropped: ensure(nfacct::CT_STATE_INVALID_DROPPED),
        localhost_node_ports_accepted: ensure(nfacct::LOCALHOST_NODE_PORTS_ACCEPTED),
    }
}

/// `net.netfilter.nf_conntrack_tcp_be_liberal` of this network namespace
/// is set (unreadable counts as not set, as upstream).
fn conntrack_tcp_be_liberal() -> bool {
    std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
        .is_ok_and(|v| v.trim().parse::<u32>().is_ok_and(|n| n != 0))
}

/// Upstream's canary: a chain of ours, empty, in the mangle, nat and
/// filter tables. A firewall reload deletes every chain, the canary with
/// them; the periodic sync (upstream's `Monitor` polls every `syncPeriod`,
/// the interval our syncs run at when nothing changes) then syncs in full
/// instead of attempting a restore that names deleted chains.
const CANARY: &str = "KUBE-PROXY-CANARY";
/// How long, once the mangle canary is gone, the other tables' canaries
/// are waited for, polled at the interval below: a reload in progress
/// should finish before the full sync (upstream's `iptablesFlushTimeout`
/// and `iptablesFlushPollTime`).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
const FLUSH_POLL: Duration = Duration::from_millis(100);

/// Whether `chain` is in `table`: iptables exits 1 for a chain it does not
/// find; anything else it answers (a table it cannot open, the lock) is an
/// error, not an answer.
fn chain_exists(t: &Tools, table: &str, chain: &str) -> anyhow::Result<bool> {
    let out = Command::new(t.iptables)
        .args(["-w", "-t", table, "-n", "-L", chain])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {}", t.iptables))?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!(
            "{} -t {table} -L {chain}: {}",
            t.iptables,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Whether the tables were flushed from outside since the last sync: the
/// canary is gone from mangle (a table with little in it, checked first, as
/// upstream). Then waits for the nat and filter canaries to go too. A check
/// that gets no answer counts as the canary being there, as upstream's.
fn tables_flushed(t: &Tools, family: IpFamily) -> bool {
    match chain_exists(t, "mangle", CANARY) {
        Ok(false) => {}
        Ok(true) => return false,
        Err(e) => {
            tracing::warn!(?family, error = format!("{e:#}"), "cannot check {CANARY}");
            return false;
        }
    }
    let present = |table| chain_exists(t, table, CANARY).unwrap_or(true);
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    loop {
        let others_left = present("nat") || present("filter");
        if !others_left {
            break;
        }
        if Instant::now() >= deadline {
            tracing::info!(
                ?family,
                "inconsistent iptables state: {CANARY} is gone from mangle only"
            );
            break;
        }
        std::thread::sleep(FLUSH_POLL);
    }
    true
}

/// Creates `chain` in `table` unless it exists (upstream's EnsureChain).
fn ensure_chain(t: &Tools, table: &str, chain: &str) {
    let _ = Command::new(t.iptables)
        .args(["-w", "-t", table, "-N", chain])
        .stderr(Stdio::null())
        .status();
}

/// Adds `-A`-style `args` at the top of `chain` unless present (upstream's EnsureRule).
pub(crate) fn ensure_jump(
    t: &Tools,
    table: &str,
    chain: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    // The target chain must exist before a rule can jump to it.
    ensure_chain(t, table, args.last().copied().unwrap_or_default());
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
            .filter(|c| rules::is_service_chain(c))
            .map(str::to_owned)
            .collect();
        out.insert(table, chains);
    }
    Ok(out)
}

pub(crate) fn run_restore(t: &Tools, text: &str) -> anyhow::Result<()> {
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
    type Error = FamilySyncError;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Self::Error> {
        sync_each_family(&IpFamily::BOTH, |family| {
            self.sync_family(family, desired, changes)
                .with_context(|| format!("syncing the {family:?} iptables rules"))?;
            self.reconciler.reconcile(family, desired);
            Ok(())
        })
    }

    fn failed_families(&self, error: &FamilySyncError) -> FamilySet {
        error.families()
    }

    fn counted_failures(&self, error: &FamilySyncError) -> FamilySet {
        error.refused()
    }
}
