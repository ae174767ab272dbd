//! Upstream's metrics of the rule modes' own work: the iptables rules kube-proxy
//! owns and last wrote per table, the partial restores that failed, and the
//! nftables transactions that could not delete stale chains.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _},
    metrics::{
        TypedMetric as _,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::Gauge,
    },
};

use super::proxy::FamilyLabel;
use crate::model::IpFamily;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub ip_family: &'static str,
    pub table: &'static str,
}

/// The iptables tables kube-proxy writes.
pub const TABLES: [&str; 2] = ["filter", "nat"];

fn family_label(family: IpFamily) -> FamilyLabel {
    FamilyLabel {
        ip_family: family.api_name(),
    }
}

/// Upstream's two counters read from nfacct objects at each scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfacctMetric {
    CtStateInvalidDropped,
    LocalhostNodePortsAccepted,
}

impl NfacctMetric {
    /// Registered name (a counter: its sample is named `..._total`).
    fn name(self) -> &'static str {
        match self {
            Self::CtStateInvalidDropped => "iptables_ct_state_invalid_dropped_packets",
            Self::LocalhostNodePortsAccepted => "iptables_localhost_nodeports_accepted_packets",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Self::CtStateInvalidDropped => {
                "[ALPHA] packets dropped by iptables to work around conntrack problems"
            }
            Self::LocalhostNodePortsAccepted => {
                "[ALPHA] Number of packets accepted on nodeports of loopback interface"
            }
        }
    }
}

/// Reads an nfacct object's packet count.
pub type NfacctReader = fn(&str) -> std::io::Result<u64>;

/// The iptables mode's rule counts and partial restore failures; clones
/// share their values.
#[derive(Clone, Debug, Default)]
pub struct IptablesMetrics {
    total: Family<TableLabel, Gauge>,
    last: Family<TableLabel, Gauge>,
    partial_restore_failures: Family<FamilyLabel, Counter>,
    /// The nfacct-backed counters, the objects they read, and how.
    nfacct: Vec<(NfacctMetric, &'static str)>,
    read_nfacct: Option<NfacctReader>,
}

impl IptablesMetrics {
    /// With every series of `families` from the start.
    pub fn new(families: &[IpFamily]) -> Self {
        let metrics = Self::default();
        for family in families {
            for table in TABLES {
                let label = TableLabel {
                    ip_family: family.api_name(),
                    table,
                };
                drop(metrics.total.get_or_create(&label));
                drop(metrics.last.get_or_create(&label));
            }
            drop(
                metrics
                    .partial_restore_failures
                    .get_or_create(&family_label(*family)),
            );
        }
        metrics
    }

    /// After a sync of `family` wrote `written` rules to `table`, which
    /// now holds `total` of kube-proxy's (the written ones and those of the
    /// service ports a partial sync left as they were).
    pub fn rules(&self, family: IpFamily, table: &'static str, written: usize, total: usize) {
        let label = TableLabel {
            ip_family: family.api_name(),
            table,
        };
        self.last.get_or_create(&label).set(written as i64);
        self.total.get_or_create(&label).set(total as i64);
    }

    /// Serves `counters` (metric, nfacct object), read with `read` at each
    /// scrape; a counter that cannot be read is left out of that scrape, as
    /// upstream's collector leaves it.
    pub fn reading_nfacct(
        mut self,
        counters: Vec<(NfacctMetric, &'static str)>,
        read: NfacctReader,
    ) -> Self {
        self.nfacct = counters;
        self.read_nfacct = Some(read);
        self
    }

    /// A partial sync's restore failed (the next sync is full).
    pub fn partial_restore_failed(&self, family: IpFamily) {
        self.partial_restore_failures
            .get_or_create(&family_label(family))
            .inc();
    }
}

impl Collector for IptablesMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let total = encoder.encode_descriptor(
            "sync_proxy_rules_iptables_total",
            "[ALPHA] Total number of iptables rules owned by kube-proxy",
            None,
            Gauge::<i64>::TYPE,
        )?;
        self.total.encode(total)?;
        let last = encoder.encode_descriptor(
            "sync_proxy_rules_iptables_last",
            "[ALPHA] Number of iptables rules written by kube-proxy in last sync",
            None,
            Gauge::<i64>::TYPE,
        )?;
        self.last.encode(last)?;
        let failures = encoder.encode_descriptor(
            "sync_proxy_rules_iptables_partial_restore_failures",
            "[ALPHA] Cumulative proxy iptables partial restore failures",
            None,
            Counter::<u64>::TYPE,
        )?;
        self.partial_restore_failures.encode(failures)?;
        let Some(read) = self.read_nfacct else {
            return Ok(());
        };
        for (metric, object) in &self.nfacct {
            if let Ok(packets) = read(object) {
                let counter = encoder.encode_descriptor(
                    metric.name(),
                    metric.help(),
                    None,
                    Counter::<u64>::TYPE,
                )?;
                ConstCounter::new(packets).encode(counter)?;
            }
        }
        Ok(())
    }
}

/// The nftables mode's failed deletions of stale chains.
#[derive(Clone, Debug, Default)]
pub struct NftablesMetrics {
    cleanup_failures: Family<FamilyLabel, Counter>,
}

impl NftablesMetrics {
    pub fn new(families: &[IpFamily]) -> Self {
        let metrics = Self::default();
        for family in families {
            drop(
                metrics
                    .cleanup_failures
                    .get_or_create(&family_label(*family)),
            );
        }
        metrics
    }

    /// A transaction deleting `family`'s stale chains failed.
    pub fn cleanup_failed(&self, family: IpFamily) {
        self.cleanup_failures
            .get_or_create(&family_label(family))
            .inc();
    }
}

impl Collector for NftablesMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let failures = encoder.encode_descriptor(
            "sync_proxy_rules_nftables_cleanup_failures",
            "[ALPHA] Cumulative proxy nftables cleanup failures",
            None,
            Counter::<u64>::TYPE,
        )?;
        self.cleanup_failures.encode(failures)
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{collector::Collector, encoding::text::encode, registry::Registry};

    use super::{IptablesMetrics, NftablesMetrics};
    use crate::model::IpFamily;

    fn scrape(collector: Box<dyn Collector>) -> String {
        let mut registry = Registry::with_prefix("kubeproxy");
        registry.register_collector(collector);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(
                text.lines().any(|l| l == *line),
                "{line} missing from\n{text}"
            );
        }
    }

    #[test]
    fn iptables_rules_are_counted_per_family_and_table() {
        let metrics = IptablesMetrics::new(&IpFamily::BOTH);
        metrics.rules(IpFamily::V4, "nat", 12, 40);
        metrics.partial_restore_failed(IpFamily::V6);
        assert_lines(
            &scrape(Box::new(metrics)),
            &[
                "# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge",
                r#"kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} 40"#,
                r#"kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="nat"} 12"#,
                r#"kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="filter"} 0"#,
                "# TYPE kubeproxy_sync_proxy_rules_iptables_partial_restore_failures counter",
                r#"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv6"} 1"#,
                r#"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 0"#,
            ],
        );
    }

    #[test]
    fn nfacct_counters_are_read_at_each_scrape_and_left_out_when_unreadable() {
        use super::NfacctMetric::*;
        let read: super::NfacctReader = |object| match object {
            "counted" => Ok(7),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        };
        let metrics = IptablesMetrics::new(&IpFamily::BOTH).reading_nfacct(
            vec![
                (CtStateInvalidDropped, "counted"),
                (LocalhostNodePortsAccepted, "gone"),
            ],
            read,
        );
        let text = scrape(Box::new(metrics));
        assert_lines(
            &text,
            &[
                "# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets counter",
                "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7",
            ],
        );
        assert!(!text.contains("localhost_nodeports"), "{text}");
    }

    #[test]
    fn nftables_cleanup_failures_are_counted_per_family() {
        let metrics = NftablesMetrics::new(&IpFamily::BOTH);
        metrics.cleanup_failed(IpFamily::V4);
        assert_lines(
            &scrape(Box::new(metrics)),
            &[
                "# TYPE kubeproxy_sync_proxy_rules_nftables_cleanup_failures counter",
                r#"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv4"} 1"#,
                r#"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv6"} 0"#,
            ],
        );
    }
}
