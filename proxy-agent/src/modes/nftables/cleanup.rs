//! nftables leftovers: upstream's `kube-proxy` tables (ip and ip6) and our own table.

use crate::cleanup::exec::CommandRunner;
use crate::cleanup::{Removed, Report};

/// Table names removed in any of the ip, ip6 and inet families.
pub const TABLES: [&str; 2] = ["kube-proxy", "kube-ebpf-proxy"];
const FAMILIES: [&str; 3] = ["ip", "ip6", "inet"];

/// (family, name) of the tables to delete, from `nft list tables`.
pub fn plan(listing: &str) -> Vec<(String, String)> {
    listing
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("table"), Some(fam), Some(name))
                    if FAMILIES.contains(&fam) && TABLES.contains(&name) =>
                {
                    Some((fam.to_string(), name.to_string()))
                }
                _ => None,
            }
        })
        .collect()
}

pub fn cleanup(run: &mut dyn CommandRunner, report: &mut Report) {
    let listing = match run.run("nft", &["list", "tables"], None) {
        Ok(o) if o.success => o.stdout,
        Ok(o) => {
            report
                .errors
                .push(format!("nft list tables: {}", o.stderr.trim()));
            return;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            report.errors.push(format!("nft list tables: {e}"));
            return;
        }
    };
    for (family, name) in plan(&listing) {
        match run.run("nft", &["delete", "table", &family, &name], None) {
            Ok(o) if o.success => report.removed.push(Removed::NftTable { family, name }),
            Ok(o) => report.errors.push(format!(
                "nft delete table {family} {name}: {}",
                o.stderr.trim()
            )),
            Err(e) => report
                .errors
                .push(format!("nft delete table {family} {name}: {e}")),
        }
    }
}
