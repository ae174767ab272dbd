//! The offline form: a datapath programmed from a manifests directory and a
//! configuration exactly as the agent would program it (the same options
//! processing, desired-state build, node facts, `NodeProgrammer` and
//! `Programmer`), inside a private network namespace that stands in for the
//! node.

use std::{collections::BTreeSet, ffi::OsString, net::IpAddr};

use anyhow::{Context as _, anyhow, bail};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::{args::Offline, frontend, sandbox, trace::Datapath};
use crate::{
    model::{
        DesiredState, NodeModel, NodeSettings, NodeTopology, ServiceCidrs, build_desired_state_for,
        node_pod_cidrs,
    },
    modes::ebpf::{
        self, KernelMaps, MapSizes, NodeProgrammer, Programmer,
        node::{EbpfNodeSettings, node_facts},
    },
    options::{
        self, Environment, OptionsError, Parsed, ProxyOptions,
        ebpf::{XdpMode, conntrack_params},
        error::Document,
    },
    sources::manifests,
};

pub fn prepare(args: &Offline) -> anyhow::Result<(Datapath, frontend::Names)> {
    let opts = options(args)?;
    let objects = manifests::load_dir(&args.manifests).map_err(|e| anyhow!("--manifests: {e}"))?;
    let node = objects
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(opts.node_name.as_str()))
        .cloned();
    let local_addresses = local_addresses(args, node.as_ref(), &opts.node_name)?;
    let topology = NodeTopology {
        node_name: opts.node_name.clone(),
        labels: node
            .as_ref()
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default(),
    };
    let desired = build_desired_state_for(&objects.services, &objects.endpoint_slices, &topology);

    let settings = EbpfNodeSettings::from_options(&opts);
    let layout = sandbox::Layout::new(
        &settings,
        local_addresses,
        pod_routes(node.as_ref(), &desired),
    );
    let sandbox = sandbox::enter(&layout)?;
    let model = NodeModel::build(
        &NodeSettings::from_options(&opts),
        topology,
        node.as_ref(),
        std::sync::Arc::new(sandbox.host.clone()),
    );
    let mut service_cidrs = ServiceCidrs::with_configured(opts.ebpf.service_cidrs());
    for obj in &objects.service_cidrs {
        service_cidrs.apply(obj);
    }
    let facts = node_facts(&settings, &model).with_service_cidrs(&service_cidrs.effective());

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let sizes = MapSizes {
        services: opts.ebpf.maps.services,
        backends: opts.ebpf.maps.backends,
        conntrack: conntrack_params(&opts.config, &opts.ebpf, cpus).max_entries,
        maglev: opts.ebpf.maglev_chunks(),
        slots: opts.ebpf.maps.backend_slots,
    };
    let mut ebpf = ebpf::load_with(sizes)?;
    let (mut maps, stats) = KernelMaps::take(&mut ebpf)?;
    // The agent's order (EbpfProxier::new, then its first full sync).
    NodeProgrammer::new()
        .apply(&facts, &mut maps)
        .context("writing the node facts")?;
    let mut programmer = Programmer::new();
    programmer.set_capacity(maps.capacity());
    programmer.set_maglev(settings.maglev);
    programmer
        .set_node_addresses(
            &facts.addresses,
            &facts.addresses6,
            &DesiredState::default(),
            &mut maps,
        )
        .context("writing the node addresses")?;
    programmer
        .sync(&desired, &mut maps)
        .context("programming the services")?;

    let node_ports: Vec<IpAddr> = (facts.addresses.node_ports.iter().map(|a| IpAddr::V4(*a)))
        .chain(facts.addresses6.node_ports.iter().map(|a| IpAddr::V6(*a)))
        .collect();
    let names = frontend::names(&desired, &node_ports);
    Ok((
        Datapath {
            ebpf,
            maps,
            stats,
            pod_ifindex: sandbox.pod_ifindex,
            external_ifindex: sandbox.external_ifindex,
            xdp: opts.ebpf.xdp_mode != XdpMode::Disabled,
        },
        names,
    ))
}

/// The agent's options processing, on the flags explain passes through.
pub(crate) fn options(args: &Offline) -> anyhow::Result<ProxyOptions> {
    let mut argv: Vec<OsString> = vec!["proxy-agent".into()];
    if let Some(config) = &args.config {
        argv.extend(["--config".into(), config.into()]);
    }
    if let Some(config) = &args.ebpf_config {
        argv.extend(["--ebpf-config".into(), config.into()]);
    }
    if let Some(name) = &args.hostname {
        argv.extend(["--hostname-override".into(), name.into()]);
    }
    match options::parse(argv, &Environment::default()) {
        Ok(Parsed::Run(opts)) => Ok(*opts),
        Ok(_) => bail!("unexpected options outcome"),
        Err(e) => Err(anyhow!("{}: {e}", flag_of(&e))),
    }
}

/// The explain flag an options error comes from.
fn flag_of(e: &OptionsError) -> &'static str {
    let doc = |d: &Document| match d {
        Document::KubeProxy => "--config",
        Document::Ebpf => "--ebpf-config",
    };
    match e {
        OptionsError::ReadFile { doc: d, .. }
        | OptionsError::Decode { doc: d, .. }
        | OptionsError::UnknownField { doc: d, .. }
        | OptionsError::WrongKind { doc: d, .. }
        | OptionsError::MissingKind { doc: d, .. }
        | OptionsError::MissingVersion { doc: d, .. } => doc(d),
        OptionsError::EbpfValidation(_) => "--ebpf-config",
        OptionsError::EmptyHostnameOverride | OptionsError::Hostname(_) => "--hostname-override",
        _ => "--config",
    }
}

/// `--local-address`, else the Node object's addresses of both families.
pub(crate) fn local_addresses(
    args: &Offline,
    node: Option<&Node>,
    node_name: &str,
) -> anyhow::Result<Vec<IpAddr>> {
    let mut seen = BTreeSet::new();
    if !args.local_addresses.is_empty() {
        return Ok(args
            .local_addresses
            .iter()
            .copied()
            .filter(|a| seen.insert(*a))
            .collect());
    }
    let Some(node) = node else {
        bail!(
            "--local-address: required, as {} holds no Node named {node_name:?} to take addresses from",
            args.manifests.display()
        );
    };
    let addresses: Vec<IpAddr> = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.trim().parse().ok())
        .filter(|a| seen.insert(*a))
        .collect();
    if addresses.is_empty() {
        bail!("--local-address: required, as Node {node_name:?} has no InternalIP or ExternalIP");
    }
    Ok(addresses)
}

/// This node's pods, in both families: its podCIDRs and every local endpoint.
fn pod_routes(node: Option<&Node>, desired: &DesiredState) -> Vec<IpNet> {
    let mut routes: BTreeSet<IpNet> = node
        .map(node_pod_cidrs)
        .unwrap_or_default()
        .into_iter()
        .collect();
    for svc in desired.services.values() {
        for ep in svc.cluster_endpoints.iter().chain(&svc.local_endpoints) {
            if ep.is_local && !routes.iter().any(|r| r.contains(&ep.ip)) {
                routes.insert(IpNet::from(ep.ip));
            }
        }
    }
    routes.into_iter().collect()
}
