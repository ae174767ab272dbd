//! The rule modes at scale: 10,000 service ports x 10 endpoints (or
//! `RULE_MODES_SERVICES`) through
//! the nftables and iptables proxiers, in a throwaway network namespace,
//! with the real `nft` and `iptables-restore`: the first (full) sync, one
//! endpoint change (nftables: a partial sync of that port; iptables: a full
//! restore, as every sync is), and the size of what each writes. Each
//! figure is also given as a ratio to the full sync of the same mode in
//! the same run; upstream publishes 141 ms for adding one service at 10,000
//! in its nftables mode (its own machine).
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
        iptables::proxier::IptablesProxier,
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
            name: format!("svc-{i}"),
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
    };
    let full = SyncChanges {
        full: true,
        ..Default::default()
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
    let partial = SyncChanges {
        full: false,
        changed: BTreeSet::from([spn]),
    };

    println!(
        "{} service ports x {ENDPOINTS} endpoints, one run each\n",
        service_count()
    );
    println!(
        "{:<10} {:>14} {:>16} {:>10} {:>14}",
        "mode", "full sync ms", "one change ms", "/full", "rules"
    );
    {
        let mut p = NftablesProxier::new(settings.clone());
        let t = Instant::now();
        p.sync(&s, &full).map_err(|e| anyhow::anyhow!("{e}"))?;
        let full_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        p.sync(&changed_state, &partial)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let change_ms = t.elapsed().as_secs_f64() * 1e3;
        let listing = std::process::Command::new("nft")
            .args(["list", "table", "ip", "kube-proxy"])
            .output()
            .context("nft list")?;
        let lines = String::from_utf8_lossy(&listing.stdout).lines().count();
        println!(
            "{:<10} {full_ms:>14.0} {change_ms:>16.1} {:>10.4} {:>9} lines",
            "nftables",
            change_ms / full_ms,
            lines
        );
    }
    {
        let mut p = IptablesProxier::new(settings);
        let t = Instant::now();
        p.sync(&s, &full).map_err(|e| anyhow::anyhow!("{e}"))?;
        let full_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        p.sync(&changed_state, &partial)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let change_ms = t.elapsed().as_secs_f64() * 1e3;
        let save = std::process::Command::new("iptables-save")
            .output()
            .context("iptables-save")?;
        let rules = String::from_utf8_lossy(&save.stdout)
            .lines()
            .filter(|l| l.starts_with("-A"))
            .count();
        println!(
            "{:<10} {full_ms:>14.0} {change_ms:>16.1} {:>10.4} {:>9} rules",
            "iptables",
            change_ms / full_ms,
            rules
        );
    }
    println!(
        "\n(both include the UDP conntrack cleanup after each sync; upstream: 141 ms to add one service at 10,000 in nftables mode)"
    );
    Ok(())
}
