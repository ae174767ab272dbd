//! The nftables proxier: each sync writes both families' `kube-proxy`
//! tables in one `nft` transaction each, from the model, as upstream's
//! nftables proxier does (a full rewrite of its maps and the chains of
//! every service; stale service chains are flushed, then deleted by a sync
//! at least a second later, when no map element can still name them).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{
    nft::{self, Family, Object},
    ruleset::{self, LocalDetector, NodeRules, TABLE},
};
use crate::{
    metrics::NftablesMetrics,
    model::{DesiredState, FamilySet, IpFamily, NodeModel},
    modes::ebpf::node::DetectLocal,
    options::{NodePortAddresses, ProxyOptions},
    sync::{FamilySyncError, Proxier, RulesRefused, SyncChanges, sync_each_family},
};

/// The settings every sync applies, from the options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftSettings {
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    pub detect_local: DetectLocal,
    /// `nodePortAddresses` is empty: NodePorts on every local address.
    pub node_ports_everywhere: bool,
    /// `iptables.localhostNodePorts` (the iptables mode's alone, as upstream).
    pub localhost_node_ports: bool,
}

impl NftSettings {
    pub fn from_options(opts: &ProxyOptions) -> Self {
        let bit = opts.masquerade_bit().clamp(0, 31) as u32;
        NftSettings {
            masquerade_mark: 1 << bit,
            masquerade_all: opts.masquerade_all(),
            detect_local: DetectLocal::from_options(opts),
            node_ports_everywhere: matches!(opts.node_port_addresses(), NodePortAddresses::All),
            localhost_node_ports: opts.config.iptables.localhost_node_ports.unwrap_or(true),
        }
    }

    /// One family's node-dependent part of the ruleset.
    pub fn node_rules(&self, family: Family, node: &NodeModel) -> NodeRules {
        let of_family = |a: &IpAddr| match family {
            Family::Ip => a.is_ipv4(),
            Family::Ip6 => a.is_ipv6(),
        };
        let first_cidr = |cidrs: &[ipnet::IpNet]| {
            cidrs
                .iter()
                .find(|c| of_family(&c.addr()))
                .map_or(LocalDetector::None, |c| LocalDetector::Cidr(c.trunc()))
        };
        let local = match &self.detect_local {
            DetectLocal::None => LocalDetector::None,
            DetectLocal::ClusterCidr(cidrs) => first_cidr(cidrs),
            DetectLocal::NodeCidr => first_cidr(&node.pod_cidrs),
            DetectLocal::BridgeInterface(name) => LocalDetector::Bridge(name.clone()),
            DetectLocal::InterfaceNamePrefix(p) => LocalDetector::InterfacePrefix(p.clone()),
        };
        NodeRules {
            family,
            masquerade_mark: self.masquerade_mark,
            masquerade_all: self.masquerade_all,
            local,
            node_port_ips: (!self.node_ports_everywhere).then(|| {
                node.node_port_addresses
                    .iter()
                    .copied()
                    .filter(of_family)
                    .collect()
            }),
            node_ip: match family {
                Family::Ip => node.primary_ipv4.map(IpAddr::V4),
                Family::Ip6 => node.primary_ipv6.map(IpAddr::V6),
            },
        }
    }
}

/// Both families' proxiers.
pub struct NftablesProxier {
    settings: NftSettings,
    /// Service chains no longer used, by family, and since when.
    stale: BTreeMap<&'static str, BTreeMap<String, Instant>>,
    /// What each family's table holds, as the last successful sync wrote it
    /// (`None`: unknown, the next sync is full).
    written: BTreeMap<&'static str, Option<Written>>,
    /// Deletes stale UDP flows after each family's sync, as upstream.
    reconciler: crate::modes::conntrack::Reconciler,
    /// Failed deletions of stale chains, as upstream counts them.
    metrics: NftablesMetrics,
}

/// One family's table as written: what a partial sync builds on.
struct Written {
    node: ruleset::NodeRules,
    service_cidrs: std::collections::BTreeSet<ipnet::IpNet>,
    services: BTreeMap<crate::model::ServicePortName, ruleset::ServiceObjects>,
}

/// Stale chains wait this long before they are deleted (upstream's second:
/// before Linux 6.2 the kernel notices a chain is unreferenced a moment
/// after the map element naming it went).
const STALE_DELAY: Duration = Duration::from_secs(1);

impl NftablesProxier {
    pub fn new(settings: NftSettings) -> Self {
        Self {
            settings,
            stale: BTreeMap::new(),
            written: BTreeMap::new(),
            reconciler: Default::default(),
            metrics: NftablesMetrics::new(&crate::model::IpFamily::BOTH),
        }
    }

    /// The mode's own metrics, to be served: the conntrack reconciler's and
    /// the failed cleanups.
    pub fn metrics(&self) -> Vec<Box<dyn prometheus_client::collector::Collector>> {
        vec![
            Box::new(self.reconciler.metrics()),
            Box::new(self.metrics.clone()),
        ]
    }

    fn sync_family(
        &mut self,
        family: Family,
        desired: &DesiredState,
        changes: &SyncChanges,
    ) -> anyhow::Result<()> {
        // Unknown until this sync succeeds.
        let written = self.written.insert(family.name(), None).flatten();
        let stale = self.stale.entry(family.name()).or_default();
        let now = Instant::now();
        let expired: Vec<String> = stale
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= STALE_DELAY)
            .map(|(c, _)| c.clone())
            .collect();
        if !expired.is_empty() {
            let mut tx = nft::Transaction::new(family, TABLE);
            for c in &expired {
                tx.delete(Object::Chain {
                    name: c.clone(),
                    base: None,
                    comment: None,
                });
            }
            match tx.run() {
                Ok(()) => tracing::debug!(
                    family = family.name(),
                    chains = expired.len(),
                    "deleted stale nftables chains"
                ),
                // Left for the next sync, as upstream does.
                Err(e) => {
                    self.metrics.cleanup_failed(family.ip_family());
                    tracing::warn!(family = family.name(), error = %format!("{e:#}"), "could not delete stale nftables chains; will retry")
                }
            }
            for c in &expired {
                stale.remove(c);
            }
        }
        let node = self.settings.node_rules(family, &desired.node);
        // A partial sync rewrites only the changed service ports, when
        // nothing else they depend on changed since the last sync.
        if let Some(mut w) = written
            && !changes.full
            && w.node == node
            && w.service_cidrs == desired.service_cidrs
        {
            let partial = ruleset::build_partial(&node, desired, &changes.changed, &w.services);
            partial.tx.run().context(RulesRefused)?;
            for (spn, objects) in partial.updated {
                match objects {
                    Some(o) => {
                        for c in &o.chains {
                            stale.remove(c);
                        }
                        w.services.insert(spn, o);
                    }
                    None => {
                        w.services.remove(&spn);
                    }
                }
            }
            for c in partial.stale_chains {
                stale.entry(c).or_insert(now);
            }
            self.written.insert(family.name(), Some(w));
            return Ok(());
        }
        let listing = nft::list(family, TABLE)?;
        let (tx, chains, services) = ruleset::build(&node, desired, &listing);
        tx.run().context(RulesRefused)?;
        for c in listing.chains.iter().filter(|c| c.contains('/')) {
            if chains.chains.contains(c) {
                stale.remove(c);
            } else {
                stale.entry(c.clone()).or_insert(now);
            }
        }
        self.written.insert(
            family.name(),
            Some(Written {
                node,
                service_cidrs: desired.service_cidrs.clone(),
                services,
            }),
        );
        Ok(())
    }
}

impl Proxier for NftablesProxier {
    type Error = FamilySyncError;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Self::Error> {
        sync_each_family(&IpFamily::BOTH, |ip_family| {
            let family = Family::of(ip_family);
            self.sync_family(family, desired, changes)
                .with_context(|| format!("syncing the {} {TABLE} table", family.name()))?;
            self.reconciler.reconcile(ip_family, desired);
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
