//! `--write-config-to` / `--ebpf-write-config-to`: the fully defaulted document as YAML, keys
//! sorted like upstream's output, so that loading it back yields the same configuration.
//!
//! The KubeProxyConfiguration is written the way upstream converts its internal configuration
//! back to v1alpha1 (config_rules.md §2): the unified sync periods and `masqueradeAll` exist
//! once internally, so they are written only into the section of the active mode (iptables for
//! iptables, ebpf and blank; ipvs; nftables). The other sections keep their zero values
//! (`syncPeriod: 0s`, `minSyncPeriod: 0s`, `masqueradeAll: false`), which a reload defaults
//! again. Values are written as Go's encoder writes them: `qps: 5`, an empty
//! `nodePortAddresses` / `excludeCIDRs` as `null`.
//!
//! The one setting a file cannot carry is `--iptables-min-sync-period=0`: upstream's defaulter
//! turns `minSyncPeriod: 0s` in a file into 1s, so such a file loads with 1s, as upstream's
//! does.

use std::path::Path;

use serde::Serialize;
use serde_yaml::{Mapping, Value};

use super::duration::GoDuration;
use super::ebpf::EbpfDatapathConfiguration;
use super::error::OptionsError;
use super::types::KubeProxyConfiguration;

/// A document `--write-config-to` / `--ebpf-write-config-to` can write.
pub trait ConfigDocument {
    /// The value written (before key sorting).
    fn written(&self) -> Value;
}

impl ConfigDocument for KubeProxyConfiguration {
    fn written(&self) -> Value {
        to_value(&as_written(self))
    }
}

impl ConfigDocument for EbpfDatapathConfiguration {
    fn written(&self) -> Value {
        to_value(self)
    }
}

fn to_value<T: Serialize>(doc: &T) -> Value {
    serde_yaml::to_value(doc).expect("config types always serialise")
}

/// The configuration as upstream's internal -> v1alpha1 conversion writes it: sync periods
/// and `masqueradeAll` only in the active mode's section.
pub fn as_written(c: &KubeProxyConfiguration) -> KubeProxyConfiguration {
    let mut out = c.clone();
    match c.mode.as_str() {
        "ipvs" => {
            clear_iptables_sync(&mut out);
            clear_nftables_sync(&mut out);
            out.nftables.masquerade_all = false;
        }
        "nftables" => {
            clear_iptables_sync(&mut out);
            clear_ipvs_sync(&mut out);
            out.iptables.masquerade_all = false;
        }
        _ => {
            clear_ipvs_sync(&mut out);
            clear_nftables_sync(&mut out);
            out.nftables.masquerade_all = false;
        }
    }
    out
}

fn clear_iptables_sync(c: &mut KubeProxyConfiguration) {
    c.iptables.sync_period = GoDuration::ZERO;
    c.iptables.min_sync_period = GoDuration::ZERO;
}

fn clear_nftables_sync(c: &mut KubeProxyConfiguration) {
    c.nftables.sync_period = GoDuration::ZERO;
    c.nftables.min_sync_period = GoDuration::ZERO;
}

fn clear_ipvs_sync(c: &mut KubeProxyConfiguration) {
    c.ipvs.sync_period = GoDuration::ZERO;
    c.ipvs.min_sync_period = GoDuration::ZERO;
}

fn sorted(v: Value) -> Value {
    match v {
        Value::Mapping(m) => {
            let mut entries: Vec<(Value, Value)> =
                m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.as_str().unwrap_or("").cmp(b.0.as_str().unwrap_or("")));
            Value::Mapping(entries.into_iter().collect::<Mapping>())
        }
        Value::Sequence(s) => Value::Sequence(s.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The YAML text for `doc`.
pub fn to_yaml<T: ConfigDocument>(doc: &T) -> String {
    serde_yaml::to_string(&sorted(doc.written())).expect("a YAML value always serialises")
}

pub fn write_file<T: ConfigDocument>(path: &Path, doc: &T) -> Result<(), OptionsError> {
    std::fs::write(path, to_yaml(doc)).map_err(|source| OptionsError::WriteConfig {
        path: path.to_path_buf(),
        source,
    })
}
