//! The ipvs proxier: each sync, per family, as upstream's
//! `syncProxyRules`: `kube-ipvs0` exists, the ipsets hold the service
//! addresses (`ipset restore`), the IPVS virtual and real servers match
//! the model (generic netlink, removed TCP backends draining at weight 0),
//! the companion iptables rules are written (`iptables-restore`), and the
//! interface holds exactly the addresses the services need.

use std::{
    collections::BTreeSet,
    io::Write as _,
    net::IpAddr,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::{
    cleanup::{DUMMY_IFACE, GenlTransport, check_replies},
    dummy::DummyDevice,
    ipsets, messages,
    reconcile::{self, Applied},
    rules::{self, RuleSettings},
    virtual_servers::{self, Frontend, VirtualServer},
};
use crate::{
    model::{DesiredState, FamilySet, IpFamily},
    modes::{
        iptables::{
            IptablesBackend,
            proxier::{ensure_jump, run_restore},
            rules::NodeRules,
        },
        nftables::proxier::NftSettings,
    },
    sync::{FamilySyncError, Proxier, RulesRefused, SyncChanges, sync_each_family},
};

pub struct IpvsProxier {
    settings: NftSettings,
    scheduler: String,
    ipvs: Box<dyn GenlTransport + Send>,
    /// The IPVS generic netlink family id.
    family_id: u16,
    dummy: Box<dyn DummyDevice + Send>,
    iptables: IptablesBackend,
    seq: u32,
    /// Deletes stale UDP flows after each family's sync, as upstream.
    reconciler: crate::modes::conntrack::Reconciler,
}

impl IpvsProxier {
    pub fn new(
        settings: NftSettings,
        scheduler: &str,
        ipvs: Box<dyn GenlTransport + Send>,
        family_id: u16,
        dummy: Box<dyn DummyDevice + Send>,
        iptables: IptablesBackend,
    ) -> Self {
        Self {
            settings,
            scheduler: scheduler.to_owned(),
            ipvs,
            family_id,
            dummy,
            iptables,
            seq: 0,
            reconciler: Default::default(),
        }
    }

    /// The conntrack reconciler's metrics, to be served.
    pub fn conntrack_metrics(&self) -> crate::metrics::ConntrackReconcilerMetrics {
        self.reconciler.metrics()
    }

    fn request(
        &mut self,
        build: impl FnOnce(u16, u32) -> Vec<u8>,
    ) -> std::io::Result<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let msg = build(self.family_id, self.seq);
        self.ipvs.request(&msg)
    }

    /// The virtual servers of `family` the kernel holds, with their real servers.
    fn applied(&mut self, family: IpFamily) -> anyhow::Result<Vec<Applied>> {
        let f = self.family_id;
        let replies = self
            .request(messages::list_services)
            .context("listing IPVS services")?;
        check_replies(&replies, "listing IPVS services")?;
        let servers: Vec<VirtualServer> = replies
            .iter()
            .filter_map(|m| messages::parse_service(m, f))
            .filter(|vs| vs.family() == family)
            .collect();
        let mut out = Vec::new();
        for server in servers {
            let replies = self
                .request(|f, seq| messages::list_dests(f, seq, &server))
                .context("listing IPVS destinations")?;
            check_replies(&replies, "listing IPVS destinations")?;
            let reals = replies
                .iter()
                .filter_map(|m| messages::parse_dest(m, f, &server))
                .collect();
            out.push(Applied { server, reals });
        }
        Ok(out)
    }

    fn sync_family(&mut self, family: IpFamily, desired: &DesiredState) -> anyhow::Result<()> {
        let of = |a: &IpAddr| IpFamily::of(a) == family;
        self.dummy
            .ensure()
            .with_context(|| format!("creating the dummy interface {DUMMY_IFACE}"))?;
        let already: BTreeSet<IpAddr> = self
            .dummy
            .addresses()
            .with_context(|| format!("listing the addresses of {DUMMY_IFACE}"))?
            .into_iter()
            .filter(of)
            .collect();
        let FamilyPlan {
            servers: wanted,
            bound,
            sets,
            rules: rules_text,
        } = plan(&self.settings, &self.scheduler, family, desired);
        let existing = ipsets::parse_save(&run("ipset", &["save"], None)?);
        run(
            "ipset",
            &["restore"],
            Some(&ipsets::restore(&sets, &existing)),
        )?;

        let current = self.applied(family)?;
        for op in reconcile::reconcile(&current, &wanted) {
            let replies = self.request(|f, seq| messages::op_request(f, seq, &op))?;
            // As upstream: one service failing does not stop the others.
            if let Err(e) = check_replies(&replies, "IPVS") {
                tracing::warn!(?op, error = %e, "an IPVS change failed");
            }
        }
        for ip in bound.difference(&already) {
            self.dummy
                .bind(*ip)
                .with_context(|| format!("binding {ip} to {DUMMY_IFACE}"))?;
        }

        let t = self.iptables.tools(family);
        for (table, chain, args) in rules::jumps() {
            ensure_jump(&t, table, chain, &args)?;
        }
        run_restore(&t, &rules_text).context(RulesRefused)?;

        for ip in already.difference(&bound) {
            if let Err(e) = self.dummy.unbind(*ip) {
                tracing::warn!(%ip, error = %e, "could not unbind an address from {DUMMY_IFACE}");
            }
        }
        Ok(())
    }
}

/// What one family's sync writes.
pub struct FamilyPlan {
    pub servers: Vec<VirtualServer>,
    /// The addresses `kube-ipvs0` holds.
    pub bound: BTreeSet<IpAddr>,
    pub sets: ipsets::Ipsets,
    /// The companion rules, as `iptables-restore` input.
    pub rules: String,
}

/// The virtual servers, `kube-ipvs0` addresses, ipsets and rules of
/// `family` for `desired` (what a sync writes, and `emit --mode ipvs` prints).
pub fn plan(
    settings: &NftSettings,
    scheduler: &str,
    family: IpFamily,
    desired: &DesiredState,
) -> FamilyPlan {
    let of = |a: &IpAddr| IpFamily::of(a) == family;
    // External and LB IPs that are the node's own are not bound again.
    let node_addresses: BTreeSet<IpAddr> = desired
        .node
        .host
        .interfaces
        .iter()
        .filter(|i| i.name != DUMMY_IFACE)
        .flat_map(|i| {
            i.ipv4
                .iter()
                .copied()
                .map(IpAddr::V4)
                .chain(i.ipv6.iter().copied().map(IpAddr::V6))
        })
        .collect();
    let servers = virtual_servers::virtual_servers(desired, family, scheduler);
    let bound: BTreeSet<IpAddr> = servers
        .iter()
        .filter(|vs| match vs.frontend {
            Frontend::ClusterIp => true,
            Frontend::ExternalIp | Frontend::LoadBalancer => !node_addresses.contains(&vs.address),
            Frontend::NodePort => false,
        })
        .map(|vs| vs.address)
        .collect();
    let node_ips: Vec<IpAddr> = desired
        .node
        .node_port_addresses
        .iter()
        .copied()
        .filter(|a| of(a) && !a.is_loopback())
        .collect();
    let sets = ipsets::ipsets(desired, family, &node_ips, &bound);
    let node = NodeRules::new(settings, family, &desired.node);
    let rule_settings = RuleSettings {
        family,
        masquerade_mark: node.masquerade_mark,
        masquerade_all: node.masquerade_all,
        local: node.local,
        lb_no_node_access: lb_no_node_access(desired, family, node.node_ip),
    };
    let rules = rules::build(&rule_settings, &sets);
    FamilyPlan {
        servers,
        bound,
        sets,
        rules,
    }
}

/// LB frontends whose source ranges leave the node out (upstream blocks the
/// node's own access to them in `KUBE-IPVS-OUT-FILTER`).
fn lb_no_node_access(
    desired: &DesiredState,
    family: IpFamily,
    node_ip: Option<IpAddr>,
) -> Vec<(IpAddr, crate::model::Protocol, u16)> {
    let mut out = Vec::new();
    for svc in desired.services.values() {
        let ranges: Vec<_> = svc
            .load_balancer_source_ranges
            .iter()
            .filter(|n| IpFamily::of(&n.addr()) == family)
            .collect();
        if ranges.is_empty() || node_ip.is_some_and(|n| ranges.iter().any(|r| r.contains(&n))) {
            continue;
        }
        for ip in svc
            .load_balancer_ips
            .iter()
            .filter(|a| IpFamily::of(a) == family)
        {
            out.push((*ip, svc.protocol, svc.port));
        }
    }
    out
}

/// Runs a tool, feeding it `input`; its stdout, or an error with its stderr.
fn run(cmd: &str, args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd}"))?;
    if let Some(text) = input {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())
            .with_context(|| format!("writing to {cmd}"))?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Proxier for IpvsProxier {
    type Error = FamilySyncError;

    fn sync(&mut self, desired: &DesiredState, _: &SyncChanges) -> Result<(), Self::Error> {
        sync_each_family(&IpFamily::BOTH, |family| {
            self.sync_family(family, desired)
                .with_context(|| format!("syncing the {family:?} IPVS services"))?;
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
