//! The ipvs mode (upstream's ipvs proxier): probe (upstream's
//! `CanUseIPVSProxier` checks and errors), sysctls, cleanup, and the
//! proxier: virtual servers from the model, their netlink requests, the
//! ipsets and companion iptables rules, `kube-ipvs0`.

pub mod cleanup;
pub mod dummy;
pub mod fake;
pub mod ipsets;
pub mod messages;
pub mod proxier;
pub mod reconcile;
pub mod rules;
pub mod virtual_servers;

use super::{CleanupTools, HostFeed, Mode, Running, boxed};
use crate::{
    cleanup::Report,
    options::{ProxyMode, ProxyOptions},
};

pub struct IpvsMode;

impl Mode for IpvsMode {
    fn kind(&self) -> ProxyMode {
        ProxyMode::Ipvs
    }

    fn probe(&self) -> Result<(), String> {
        // The caller says "can't use the IPVS proxier: " before it, as upstream.
        can_use_ipvs(&mut cleanup::NetlinkTransport).map(|_| ())
    }

    fn sysctls(&self, o: &ProxyOptions) -> Vec<(&'static str, &'static str)> {
        let mut out = vec![
            ("net/ipv4/vs/conntrack", "1"),
            ("net/ipv4/vs/expire_nodest_conn", "1"),
            ("net/ipv4/vs/expire_quiescent_template", "1"),
            ("net/ipv4/ip_forward", "1"),
        ];
        if o.config.ipvs.strict_arp {
            out.push(("net/ipv4/conf/all/arp_ignore", "1"));
            out.push(("net/ipv4/conf/all/arp_announce", "2"));
        }
        out
    }

    fn cleanup(&self, tools: &mut CleanupTools<'_>, report: &mut Report) {
        cleanup::cleanup(tools.genl, tools.run, report);
    }

    fn start(&self, opts: &ProxyOptions, _: HostFeed<'_>) -> anyhow::Result<Running> {
        let family_id = can_use_ipvs(&mut cleanup::NetlinkTransport)
            .map_err(|e| anyhow::anyhow!("can't use the IPVS proxier: {e}"))?;
        let settings = crate::modes::nftables::proxier::NftSettings::from_options(opts);
        let (backend, why) = crate::modes::iptables::IptablesBackend::detect();
        tracing::info!(
            backend = backend.name(),
            why,
            "iptables backend for the ipvs mode's rules"
        );
        let proxier = proxier::IpvsProxier::new(
            settings,
            &opts.config.ipvs.scheduler,
            Box::new(cleanup::NetlinkTransport),
            family_id,
            Box::new(dummy::NetlinkDummy::open()?),
            backend,
        );
        let metrics = proxier.conntrack_metrics();
        Ok(Running {
            proxier: boxed(proxier),
            families: crate::model::IpFamily::BOTH.to_vec(),
            metrics: vec![Box::new(metrics)],
            background: Box::pin(futures::future::pending()),
            // As upstream: the rules stay when the agent stops; `--cleanup` removes them.
            stop: Box::new(|| {}),
        })
    }
}

/// Upstream's `CanUseIPVSProxier`, as far as it applies before any
/// virtual server exists: IPVS in the kernel, an ipset of at least 6.0.
/// The IPVS family id when usable; upstream's messages otherwise.
pub fn can_use_ipvs(genl: &mut dyn cleanup::GenlTransport) -> Result<u16, String> {
    let family = match cleanup::resolve_family(genl) {
        Ok(Some(f)) => f,
        Ok(None) => return Err("Ipvs not supported by the kernel".into()),
        Err(e) => return Err(e.to_string()),
    };
    let version = std::process::Command::new("ipset")
        .arg("version")
        .output()
        .map_err(|e| format!("error getting ipset version, error: {e}"))?;
    let text = String::from_utf8_lossy(&version.stdout);
    let v = ipset_version(&text)
        .ok_or_else(|| format!("error getting ipset version, error: unexpected output {text:?}"))?;
    if v < (6, 0) {
        return Err(format!(
            "ipset version: {}.{} is less than min required version: 6.0",
            v.0, v.1
        ));
    }
    Ok(family)
}

/// "ipset v7.17, protocol version: 7" → (7, 17).
fn ipset_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let v = v.trim_end_matches(',');
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.split('.').next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipset_versions_as_upstream_reads_them() {
        assert_eq!(
            ipset_version("ipset v7.17, protocol version: 7"),
            Some((7, 17))
        );
        assert_eq!(
            ipset_version("ipset v6.38, protocol version: 6"),
            Some((6, 38))
        );
        assert_eq!(ipset_version("nonsense"), None);
    }

    #[test]
    fn no_ipvs_in_the_kernel_is_upstreams_error() {
        let mut genl = cleanup::FakeGenl::default();
        // CTRL_CMD_GETFAMILY answered with ENOENT, as a kernel without ip_vs does.
        genl.replies
            .push_back(vec![cleanup::reply::ack(libc::ENOENT)]);
        assert_eq!(
            can_use_ipvs(&mut genl),
            Err("Ipvs not supported by the kernel".into())
        );
    }
}
