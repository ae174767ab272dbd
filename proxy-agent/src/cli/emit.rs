//! `proxy-agent emit --mode nftables|iptables`: the exact rules the agent would
//! program on a node, from manifests and a configuration as `explain`
//! takes them, printed rather than applied, so operators can review and
//! diff what a mode does without touching a node. Needs no privilege.

use std::{collections::BTreeSet, net::IpAddr, path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::anyhow;
use clap::{Args, ValueEnum};

use super::explain::{args::Offline, offline};
use crate::{
    model::{NodeModel, NodeSettings, NodeTopology, ServiceCidrs, build_desired_state_for},
    modes::iptables,
    modes::nftables::{
        nft::{Family, Listing},
        proxier::NftSettings,
        ruleset,
    },
    sources::{
        host::{HostInterface, HostNetwork},
        manifests,
    },
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EmitMode {
    Nftables,
    Iptables,
    Ipvs,
}

/// Prints the rules a proxy mode would program for a node.
#[derive(Debug, Args)]
pub struct EmitArgs {
    /// The proxy mode whose rules to print
    #[arg(long, value_enum)]
    pub mode: EmitMode,
    /// Services, EndpointSlices, ServiceCIDRs and the Node (as for the agent)
    #[arg(long, value_name = "DIR")]
    pub manifests: PathBuf,
    /// KubeProxyConfiguration (clusterCIDR, detectLocalMode, nodePortAddresses, masqueradeAll, ...)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// This node's name [default: the config's, else the hostname]
    #[arg(long = "hostname-override", value_name = "NODE")]
    pub hostname: Option<String>,
    /// The node's addresses [default: the Node object's InternalIP and ExternalIP]
    #[arg(long = "local-address", value_name = "IP")]
    pub local_addresses: Vec<IpAddr>,
}

pub fn main(args: EmitArgs) -> ExitCode {
    match emit(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => super::fail(format!("{e:#}")),
    }
}

/// The options and the desired state the agent would sync for the node
/// `args` describe (its Node object, addresses, services, endpoints).
pub fn prepare(
    args: &EmitArgs,
) -> anyhow::Result<(crate::options::ProxyOptions, crate::model::DesiredState)> {
    let offline_args = Offline {
        manifests: args.manifests.clone(),
        config: args.config.clone(),
        ebpf_config: None,
        hostname: args.hostname.clone(),
        local_addresses: args.local_addresses.clone(),
    };
    let opts = offline::options(&offline_args)?;
    let objects = manifests::load_dir(&args.manifests).map_err(|e| anyhow!("--manifests: {e}"))?;
    let node = objects
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(opts.node_name.as_str()))
        .cloned();
    let addresses = offline::local_addresses(&offline_args, node.as_ref(), &opts.node_name)?;
    let topology = NodeTopology {
        node_name: opts.node_name.clone(),
        labels: node
            .as_ref()
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default(),
    };
    let mut desired =
        build_desired_state_for(&objects.services, &objects.endpoint_slices, &topology);
    let mut cidrs = ServiceCidrs::with_configured(opts.ebpf.service_cidrs());
    for obj in &objects.service_cidrs {
        cidrs.apply(obj);
    }
    desired.service_cidrs = cidrs.effective().into_iter().collect::<BTreeSet<_>>();
    // The node's addresses on one interface stand for its host network.
    let host = HostNetwork {
        interfaces: vec![HostInterface {
            name: "eth0".into(),
            index: 2,
            master: None,
            peer_in_other_netns: false,
            ipv4: addresses
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V4(a) => Some(*a),
                    IpAddr::V6(_) => None,
                })
                .collect(),
            ipv6: addresses
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V6(a) => Some(*a),
                    IpAddr::V4(_) => None,
                })
                .collect(),
        }],
        default_route_interface: Some("eth0".into()),
        ..HostNetwork::default()
    };
    desired.node = NodeModel::build(
        &NodeSettings::from_options(&opts),
        topology,
        node.as_ref(),
        Arc::new(host),
    );
    Ok((opts, desired))
}

/// The rules, as text.
pub fn emit(args: &EmitArgs) -> anyhow::Result<String> {
    let (opts, desired) = prepare(args)?;
    if args.mode == EmitMode::Ipvs {
        return Ok(emit_ipvs(&opts, &desired));
    }
    let settings = NftSettings::from_options(&opts);
    let mut out = String::new();
    for family in [Family::Ip, Family::Ip6] {
        let node = settings.node_rules(family, &desired.node);
        if args.mode == EmitMode::Iptables {
            let ip_family = family.ip_family();
            let rules = iptables::rules::NodeRules::new(&settings, ip_family, &desired.node);
            let restore = iptables::rules::build(&rules, &desired, &Default::default(), &|_| true);
            let tool = match ip_family {
                crate::model::IpFamily::V4 => "iptables-restore",
                crate::model::IpFamily::V6 => "ip6tables-restore",
            };
            out.push_str(&format!("# {tool} --noflush\n"));
            out.push_str(&restore.text);
            continue;
        }
        let (tx, _, _) = ruleset::build(&node, &desired, &Listing::default());
        out.push_str(&format!("# {} {}\n", family.name(), ruleset::TABLE));
        out.push_str(&tx.render());
    }
    Ok(out)
}

/// The ipvs mode's writes per family: the virtual servers as `ipvsadm
/// --save -n` lists them, the addresses of `kube-ipvs0`, the `ipset
/// restore` input and the companion `iptables-restore` input.
fn emit_ipvs(opts: &crate::options::ProxyOptions, desired: &crate::model::DesiredState) -> String {
    use crate::{
        model::IpFamily,
        modes::ipvs::{cleanup::DUMMY_IFACE, ipsets, proxier, virtual_servers},
    };
    let settings = NftSettings::from_options(opts);
    let mut out = String::new();
    for family in IpFamily::BOTH {
        let plan = proxier::plan(&settings, &opts.config.ipvs.scheduler, family, desired);
        out.push_str(&format!(
            "# ipvs {family:?} virtual servers (ipvsadm --save -n)\n"
        ));
        out.push_str(&virtual_servers::render(&plan.servers));
        out.push_str(&format!("# {DUMMY_IFACE} {family:?} addresses\n"));
        for a in &plan.bound {
            out.push_str(&format!("{a}\n"));
        }
        out.push_str(&format!("# ipset restore ({family:?})\n"));
        out.push_str(&ipsets::restore(&plan.sets, &Default::default()));
        let tool = match family {
            IpFamily::V4 => "iptables-restore",
            IpFamily::V6 => "ip6tables-restore",
        };
        out.push_str(&format!("# {tool} --noflush\n"));
        out.push_str(&plan.rules);
    }
    out
}
