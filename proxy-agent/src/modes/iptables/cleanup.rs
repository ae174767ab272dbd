//! iptables leftovers: every `KUBE-*` chain kube-proxy (upstream's iptables/ipvs modes, or ours,
//! which use the same names) created, and every rule elsewhere that jumps to one — but not
//! the chains kubelet owns. Removal is one `iptables-restore --noflush` transaction per table.

use crate::cleanup::exec::CommandRunner;
use crate::cleanup::{Removed, Report};

pub const TABLES: [&str; 4] = ["nat", "filter", "mangle", "raw"];

/// Chains created by kubelet, not kube-proxy; never removed.
pub const KUBELET_CHAINS: [&str; 4] = [
    "KUBE-FIREWALL",
    "KUBE-MARK-DROP",
    "KUBE-KUBELET-CANARY",
    "KUBE-IPTABLES-HINT",
];

/// (save, restore, family label, the kernel's list of the network
/// namespace's tables when the backend is the legacy one) for every backend
/// that may hold leftovers.
pub const BINARIES: [(&str, &str, &str, Option<&str>); 4] = [
    ("iptables-nft-save", "iptables-nft-restore", "IPv4", None),
    ("ip6tables-nft-save", "ip6tables-nft-restore", "IPv6", None),
    (
        "iptables-legacy-save",
        "iptables-legacy-restore",
        "IPv4 legacy",
        Some("/proc/net/ip_tables_names"),
    ),
    (
        "ip6tables-legacy-save",
        "ip6tables-legacy-restore",
        "IPv6 legacy",
        Some("/proc/net/ip6_tables_names"),
    ),
];

/// The legacy tables that exist in the network namespace, from the kernel's
/// list `names` (read where `run` runs commands); `None` when it cannot be
/// read, and every table is looked at. A legacy table exists in a namespace
/// only once something asked for it: `iptables-legacy-save -t nat` would
/// create an empty one, whose hooks (and for nat, connection tracking) every
/// packet of the node would then pass.
fn legacy_tables(run: &mut dyn CommandRunner, names: &str) -> Option<Vec<String>> {
    match run.run("cat", &[names], None) {
        Ok(o) if o.success => Some(o.stdout.lines().map(|l| l.trim().to_owned()).collect()),
        // No such file: the legacy tables' module is not loaded, so no namespace has one.
        Ok(_) => Some(Vec::new()),
        Err(_) => None,
    }
}

pub fn is_ours(chain: &str) -> bool {
    chain.starts_with("KUBE-") && !KUBELET_CHAINS.contains(&chain)
}

/// What to remove from one table, planned from its `iptables-save` dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablePlan {
    pub table: String,
    pub chains: Vec<String>,
    /// `-A ...` rule specs (as dumped) in chains we keep that jump to a removed chain.
    pub jump_rules: Vec<String>,
}

impl TablePlan {
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.jump_rules.is_empty()
    }

    /// The `iptables-restore --noflush` payload.
    pub fn restore_payload(&self) -> String {
        let mut s = format!("*{}\n", self.table);
        for rule in &self.jump_rules {
            s.push_str(&format!("-D{}\n", &rule[2..]));
        }
        for c in &self.chains {
            s.push_str(&format!(":{c} - [0:0]\n"));
        }
        for c in &self.chains {
            s.push_str(&format!("-F {c}\n"));
        }
        for c in &self.chains {
            s.push_str(&format!("-X {c}\n"));
        }
        s.push_str("COMMIT\n");
        s
    }
}

/// Plans the removal for `table` from an `iptables-save -t table` dump.
pub fn plan(table: &str, dump: &str) -> TablePlan {
    let mut chains = Vec::new();
    let mut rules = Vec::new();
    let mut in_table = false;
    for line in dump.lines() {
        if let Some(t) = line.strip_prefix('*') {
            in_table = t == table;
            continue;
        }
        if !in_table {
            continue;
        }
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if is_ours(name) {
                chains.push(name.to_string());
            }
        } else if line.starts_with("-A ") {
            rules.push(line.to_string());
        }
    }
    let jump_rules = rules
        .into_iter()
        .filter(|r| {
            let mut words = r.split_whitespace();
            let chain = words.nth(1).unwrap_or("");
            if chains.iter().any(|c| c == chain) {
                return false; // flushed with its chain
            }
            let words: Vec<&str> = r.split_whitespace().collect();
            words
                .windows(2)
                .any(|w| (w[0] == "-j" || w[0] == "-g") && chains.iter().any(|c| c == w[1]))
        })
        .collect();
    TablePlan {
        table: table.to_string(),
        chains,
        jump_rules,
    }
}

/// Removes the leftovers from every table of every installed iptables backend.
pub fn cleanup(run: &mut dyn CommandRunner, report: &mut Report) {
    for (save, restore, family, names) in BINARIES {
        let existing = names.and_then(|names| legacy_tables(run, names));
        for table in TABLES {
            if existing
                .as_ref()
                .is_some_and(|tables| !tables.iter().any(|t| t == table))
            {
                continue;
            }
            let dump = match run.run(save, &["-t", table], None) {
                Ok(o) if o.success => o.stdout,
                Ok(_) => continue, // table not present in this kernel / backend
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => {
                    report.errors.push(format!("{save} -t {table}: {e}"));
                    continue;
                }
            };
            let p = plan(table, &dump);
            if p.is_empty() {
                continue;
            }
            match run.run(restore, &["--noflush"], Some(&p.restore_payload())) {
                Ok(o) if o.success => {
                    for rule in &p.jump_rules {
                        report.removed.push(Removed::IptablesRule {
                            family,
                            table: table.into(),
                            rule: rule.clone(),
                        });
                    }
                    for c in &p.chains {
                        report.removed.push(Removed::IptablesChain {
                            family,
                            table: table.into(),
                            chain: c.clone(),
                        });
                    }
                }
                Ok(o) => report
                    .errors
                    .push(format!("{restore} ({family} {table}): {}", o.stderr.trim())),
                Err(e) => report
                    .errors
                    .push(format!("{restore} ({family} {table}): {e}")),
            }
        }
    }
}
