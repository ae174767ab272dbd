//! The rule modes at scale: 10,000 service ports x 10 endpoints (or
//! `RULE_MODES_SERVICES`) through the nftables and iptables proxiers
//! (`RULE_MODES`: any of nftables, iptables-legacy, iptables-nft), in a
//! throwaway network namespace, with the real `nft` and `iptables-restore`:
//! the first (full) sync, one endpoint change and one service added (partial
//! syncs of that port), a full resync over the written rules, and the size
//! of what each writes. Upstream publishes 141 ms for adding one service at
//! 10,000 in its nftables mode (its own machine).
//!
//! `cargo bench -p proxy-agent --bench rule_modes` (root).

mod common;

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

use anyhow::Context as _;
use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::{
        detect_local::DetectLocal,
        iptables::{IptablesBackend, proxier::IptablesProxier},
        nftables::proxier::{NftSettings, NftablesProxier},
    },
    sync::{Proxier, SyncChanges},
};

/// `RULE_MODES_SERVICES` overrides it (the default is the scale).
fn service_count() -> u32 {
    std::env::var("RULE_MODES_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}
const ENDPOINTS: u32 = 10;

fn state() -> DesiredState {
    let mut services = Vec::new();
    for i in 0..service_count() {
        let vip = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i));
        let endpoints = (0..ENDPOINTS)
            .map(|e| {
                let n = i * ENDPOINTS + e;
                Endpoint::new(
                    IpAddr::V4(Ipv4Addr::from(
                        u32::from(Ipv4Addr::new(198, 18, 0, 0)) + 256 + n,
                    )),
                    8080,
                )
            })
            .collect();
        let spn = ServicePortName {
            namespace: "bench".into(),
            name: format!("svc-{i}").into(),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
        };
        services.push(DesiredService::cluster_ip(spn, vec![vip], 80, endpoints));
    }
    DesiredState {
        services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
        ..DesiredState::default()
    }
}

fn main() {
    common::main("rule_modes", run);
}

fn run() -> anyhow::Result<()> {
    common::enter_throwaway_netns()?;
    let settings = NftSettings {
        masquerade_mark: 1 << 14,
        masquerade_all: false,
        detect_local: DetectLocal::ClusterCidr(vec!["198.18.0.0/16".parse().unwrap()]),
        node_ports_everywhere: true,
        localhost_node_ports: true,
    };
    let s = state();
    // One endpoint of one service port replaced.
    let mut changed_state = s.clone();
    let spn = changed_state
        .services
        .keys()
        .nth(changed_state.services.len() / 2)
        .unwrap()
        .clone();
    changed_state
        .services
        .get_mut(&spn)
        .unwrap()
        .cluster_endpoints[3] = Endpoint::new("198.18.255.250".parse().unwrap(), 8080);
    // One service port added (upstream's published figure).
    let mut added_state = changed_state.clone();
    let mut added = s.services[&spn].clone();
    added.name.name = "added".into();
    added.cluster_ips = vec!["198.19.255.250".parse().unwrap()];
    let added_spn = added.name.clone();
    added_state.services.insert(added_spn.clone(), added);
    let steps = [
        (
            &s,
            SyncChanges {
                full: true,
                ..Default::default()
            },
        ),
        (
            &changed_state,
            SyncChanges {
                full: false,
                changed: BTreeSet::from([spn]),
            },
        ),
        (
            &added_state,
            SyncChanges {
                full: false,
                changed: BTreeSet::from([added_spn]),
            },
        ),
        (
            &added_state,
            SyncChanges {
                full: true,
                ..Default::default()
            },
        ),
    ];

    println!(
        "{} service ports x {ENDPOINTS} endpoints, one run each\n",
        service_count()
    );
    println!(
        "{:<16} {:>12} {:>12} {:>12} {:>12} {:>9} {:>12}",
        "mode", "full ms", "change ms", "add svc ms", "resync ms", "change/full", "rules/lines"
    );
    for mode in modes() {
        let mut proxier: SyncFn = match mode {
            "nftables" => {
                let mut p = NftablesProxier::new(settings.clone());
                Box::new(move |d, c| p.sync(d, c).map_err(|e| anyhow::anyhow!("{e}")))
            }
            backend => {
                let backend = match backend {
                    "iptables-legacy" => IptablesBackend::Legacy,
                    "iptables-nft" => IptablesBackend::Nft,
                    other => anyhow::bail!("RULE_MODES: unknown mode {other:?}"),
                };
                let mut p = IptablesProxier::with_backend(settings.clone(), backend);
                Box::new(move |d, c| p.sync(d, c).map_err(|e| anyhow::anyhow!("{e}")))
            }
        };
        let mut ms = Vec::new();
        for (desired, changes) in &steps {
            let t = Instant::now();
            proxier(desired, changes).with_context(|| mode.to_string())?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let rules = rule_count(mode)?;
        println!(
            "{mode:<16} {:>12.0} {:>12.1} {:>12.1} {:>12.0} {:>9.4} {rules:>12}",
            ms[0],
            ms[1],
            ms[2],
            ms[3],
            ms[1] / ms[0]
        );
        cleanup(mode)?;
    }
    println!(
        "\n(each includes the UDP conntrack cleanup after the sync; upstream: 141 ms to add one service at 10,000 in nftables mode)"
    );
    Ok(())
}

/// One mode's proxier, as the bench drives it.
type SyncFn = Box<dyn FnMut(&DesiredState, &SyncChanges) -> anyhow::Result<()>>;

/// `RULE_MODES` (comma-separated) overrides it.
fn modes() -> Vec<&'static str> {
    let all = ["nftables", "iptables-legacy", "iptables-nft"];
    match std::env::var("RULE_MODES") {
        Ok(v) => all
            .into_iter()
            .filter(|m| v.split(',').any(|w| w == *m))
            .collect(),
        Err(_) => all.to_vec(),
    }
}

/// The IPv4 rules a mode wrote.
fn rule_count(mode: &str) -> anyhow::Result<usize> {
    let (cmd, args): (&str, &[&str]) = match mode {
        "nftables" => ("nft", &["list", "table", "ip", "kube-proxy"]),
        "iptables-legacy" => ("iptables-legacy-save", &[]),
        _ => ("iptables-nft-save", &[]),
    };
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(if mode == "nftables" {
        text.lines().count()
    } else {
        text.lines().filter(|l| l.starts_with("-A")).count()
    })
}

/// Leaves the namespace empty for the next mode.
fn cleanup(mode: &str) -> anyhow::Result<()> {
    let status = match mode {
        "nftables" => std::process::Command::new("nft").args(["flush", "ruleset"]).status(),
        "iptables-legacy" => std::process::Command::new("sh")
            .args(["-c", "iptables-legacy -t nat -F && iptables-legacy -t nat -X && iptables-legacy -F && iptables-legacy -X"])
            .status(),
        _ => std::process::Command::new("nft").args(["flush", "ruleset"]).status(),
    }
    .context("cleaning up")?;
    anyhow::ensure!(status.success(), "cleaning up after {mode} failed");
    Ok(())
}
