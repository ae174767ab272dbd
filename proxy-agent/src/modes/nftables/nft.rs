//! An nftables transaction, as upstream's knftables models one: objects of
//! one table (chains, sets, maps, their elements, rules) added, flushed or
//! deleted, rendered into one `nft -f -` script so the kernel applies it
//! atomically. The rule bodies are nft's own syntax, as knftables takes
//! them; everything else (quoting, the table and family on every command)
//! is rendered here and nowhere else.
//!
//! Why not the `nftables` crate (nft's JSON schema): upstream's rules are
//! written in nft's syntax, and keeping that syntax makes ours comparable
//! with upstream's, line by line; `nft -f` applies a script as one
//! transaction all the same.

use std::{
    fmt::Write as _,
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The nftables family of one IP family's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    /// `ip` or `ip6`, as in `ip daddr`.
    pub fn expr(self) -> &'static str {
        self.name()
    }

    /// The table family of the model's `family`.
    pub fn of(family: crate::model::IpFamily) -> Self {
        match family {
            crate::model::IpFamily::V4 => Family::Ip,
            crate::model::IpFamily::V6 => Family::Ip6,
        }
    }

    /// The model's family.
    pub fn ip_family(self) -> crate::model::IpFamily {
        match self {
            Family::Ip => crate::model::IpFamily::V4,
            Family::Ip6 => crate::model::IpFamily::V6,
        }
    }

    /// The address type of sets and maps.
    pub fn addr_type(self) -> &'static str {
        match self {
            Family::Ip => "ipv4_addr",
            Family::Ip6 => "ipv6_addr",
        }
    }
}

/// A base chain's hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    /// `filter` or `nat`.
    pub kind: &'static str,
    pub hook: &'static str,
    /// As nft reads it (a number: `-110`).
    pub priority: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Table {
        comment: String,
    },
    Chain {
        name: String,
        base: Option<BaseChain>,
        comment: Option<String>,
    },
    /// A set; `flags` and `timeout_s` only for affinity sets.
    Set {
        name: String,
        kind: String,
        flags: Vec<&'static str>,
        timeout_s: Option<u32>,
        comment: Option<String>,
    },
    Map {
        name: String,
        kind: String,
        comment: Option<String>,
    },
    Element {
        set: String,
        key: Vec<String>,
        value: Option<String>,
        comment: Option<String>,
    },
    Rule {
        chain: String,
        rule: String,
        comment: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Add(Object),
    Flush(Object),
    Delete(Object),
}

/// Operations on one table, applied all or nothing.
#[derive(Clone, Debug)]
pub struct Transaction {
    family: Family,
    table: String,
    ops: Vec<Op>,
}

impl Transaction {
    pub fn new(family: Family, table: &str) -> Self {
        Self {
            family,
            table: table.into(),
            ops: Vec::new(),
        }
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn add(&mut self, o: Object) {
        self.ops.push(Op::Add(o));
    }

    pub fn flush(&mut self, o: Object) {
        self.ops.push(Op::Flush(o));
    }

    pub fn delete(&mut self, o: Object) {
        self.ops.push(Op::Delete(o));
    }

    /// Appends `other`'s operations (of the same table).
    pub fn append(&mut self, other: Transaction) {
        self.ops.extend(other.ops);
    }

    /// The (set or map, key) of every element this transaction adds.
    pub fn added_elements(&self) -> Vec<(String, Vec<String>)> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Add(Object::Element { set, key, .. }) => Some((set.clone(), key.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The `nft -f` script.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let at = format!("{} {}", self.family.name(), self.table);
        for op in &self.ops {
            let (verb, o) = match op {
                Op::Add(o) => ("add", o),
                Op::Flush(o) => ("flush", o),
                Op::Delete(o) => ("delete", o),
            };
            let _ = match o {
                Object::Table { comment } => match op {
                    Op::Add(_) => writeln!(out, "add table {at} {{ comment {}; }}", quote(comment)),
                    _ => writeln!(out, "{verb} table {at}"),
                },
                Object::Chain {
                    name,
                    base,
                    comment,
                } => match (op, base) {
                    (Op::Add(_), Some(b)) => writeln!(
                        out,
                        "add chain {at} {name} {{ type {} hook {} priority {}; }}",
                        b.kind, b.hook, b.priority
                    ),
                    (Op::Add(_), None) => match comment {
                        Some(c) => {
                            writeln!(out, "add chain {at} {name} {{ comment {}; }}", quote(c))
                        }
                        None => writeln!(out, "add chain {at} {name}"),
                    },
                    _ => writeln!(out, "{verb} chain {at} {name}"),
                },
                Object::Set {
                    name,
                    kind,
                    flags,
                    timeout_s,
                    comment,
                } => match op {
                    Op::Add(_) => {
                        let mut body = format!("type {kind};");
                        if !flags.is_empty() {
                            let _ = write!(body, " flags {};", flags.join(","));
                        }
                        if let Some(t) = timeout_s {
                            let _ = write!(body, " timeout {t}s;");
                        }
                        if let Some(c) = comment {
                            let _ = write!(body, " comment {};", quote(c));
                        }
                        writeln!(out, "add set {at} {name} {{ {body} }}")
                    }
                    _ => writeln!(out, "{verb} set {at} {name}"),
                },
                Object::Map {
                    name,
                    kind,
                    comment,
                } => match op {
                    Op::Add(_) => {
                        let comment = comment
                            .as_ref()
                            .map(|c| format!(" comment {};", quote(c)))
                            .unwrap_or_default();
                        writeln!(out, "add map {at} {name} {{ type {kind};{comment} }}")
                    }
                    _ => writeln!(out, "{verb} map {at} {name}"),
                },
                Object::Element { set, key, .. } if matches!(op, Op::Delete(_)) => {
                    writeln!(out, "delete element {at} {set} {{ {} }}", key.join(" . "))
                }
                Object::Element {
                    set,
                    key,
                    value,
                    comment,
                } => {
                    let mut e = key.join(" . ");
                    if let Some(c) = comment {
                        let _ = write!(e, " comment {}", quote(c));
                    }
                    if let Some(v) = value {
                        let _ = write!(e, " : {v}");
                    }
                    writeln!(out, "{verb} element {at} {set} {{ {e} }}")
                }
                Object::Rule {
                    chain,
                    rule,
                    comment,
                } => {
                    let comment = comment
                        .as_ref()
                        .map(|c| format!(" comment {}", quote(c)))
                        .unwrap_or_default();
                    writeln!(out, "{verb} rule {at} {chain} {rule}{comment}")
                }
            };
        }
        out
    }

    /// Applies the transaction with `nft -f -` in this thread's network namespace.
    pub fn run(&self) -> anyhow::Result<()> {
        let script = self.render();
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft")?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(script.as_bytes())
            .context("writing the transaction to nft")?;
        let out = child.wait_with_output().context("waiting for nft")?;
        if !out.status.success() {
            bail!(
                "nft refused the transaction ({} operations): {}",
                self.ops.len(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// A comment or string as nft reads it (double quotes; nft has no escapes,
/// so a double quote inside becomes a single one).
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

/// The chains and sets of `table` in `family`; empty when the table does
/// not exist. Listed by kind (`list chains`, `list sets` without their
/// elements), not as the whole table: at 10,000 services the table's rules
/// make `list table` take 39 s here, the chains alone 3 s.
pub fn list(family: Family, table: &str) -> anyhow::Result<Listing> {
    let mut listing = Listing::default();
    for what in ["chains", "sets"] {
        let out = Command::new("nft")
            .args(["-j", "-t", "list", what, family.name()])
            .stdin(Stdio::null())
            .output()
            .context("running nft")?;
        if !out.status.success() {
            bail!(
                "nft list {what} {}: {}",
                family.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        listing.add(table, &out.stdout)?;
    }
    Ok(listing)
}

/// The names of the chains and sets (maps apart) of one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub chains: std::collections::BTreeSet<String>,
    pub sets: std::collections::BTreeSet<String>,
}

impl Listing {
    /// Adds the chains and sets of `table` from one of nft's JSON listings.
    pub fn add(&mut self, table: &str, json: &[u8]) -> anyhow::Result<()> {
        let v: serde_json::Value = serde_json::from_slice(json).context("nft's JSON listing")?;
        for item in v["nftables"].as_array().into_iter().flatten() {
            for (kind, names) in [("chain", &mut self.chains), ("set", &mut self.sets)] {
                let object = &item[kind];
                if object["table"].as_str() == Some(table)
                    && let Some(name) = object["name"].as_str()
                {
                    names.insert(name.to_owned());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_keeps_only_its_tables_chains_and_sets() {
        let chains = br#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 1}},
            {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1}}]}"#;
        let sets = br#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"set": {"family": "ip", "name": "affinity-X", "table": "kube-proxy", "type": "ipv4_addr"}},
            {"set": {"family": "ip", "name": "other", "table": "filter", "type": "ipv4_addr"}}]}"#;
        let mut l = Listing::default();
        l.add("kube-proxy", chains).unwrap();
        l.add("kube-proxy", sets).unwrap();
        assert_eq!(l.chains, ["services".to_owned()].into());
        assert_eq!(l.sets, ["affinity-X".to_owned()].into());
        assert!(l.add("kube-proxy", b"not json").is_err());
    }
}
