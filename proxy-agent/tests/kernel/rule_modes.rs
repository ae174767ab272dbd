//! The nftables mode's tables in the real kernel: the ruleset the model
//! gives (every frontend kind, traffic policies, affinity, source ranges,
//! services without endpoints, service CIDRs) is accepted by nft in one
//! transaction per family, a second sync replaces it, a service that goes
//! leaves its chains flushed and then deleted, and the table names and
//! chain names are upstream's; `proxy-agent emit --mode nftables` prints a
//! script nft accepts. In a private network namespace. Needs root.

use std::{
    net::{IpAddr, Ipv4Addr},
    process::Command,
    time::Duration,
};

use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName, SessionAffinity},
    modes::{
        detect_local::DetectLocal,
        iptables::{IptablesBackend, proxier::IptablesProxier},
        nftables::proxier::{NftSettings, NftablesProxier},
    },
    sync::{Proxier, SyncChanges},
};

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "ns1".into(),
        name: name.into(),
        port_name: "p80".into(),
        protocol,
    }
}

fn v4(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, c, d))
}

fn state() -> DesiredState {
    let eps = vec![
        Endpoint::new(v4(2, 10), 8080),
        Endpoint::new("2001:db8:2::10".parse().unwrap(), 8080),
    ];
    let web = DesiredService {
        node_port: Some(30080),
        external_ips: vec![v4(3, 30)],
        load_balancer_ips: vec![v4(3, 20)],
        load_balancer_source_ranges: vec!["198.18.0.0/24".parse().unwrap()],
        session_affinity: SessionAffinity::ClientIp {
            timeout_seconds: 10_800,
        },
        ..DesiredService::cluster_ip(
            spn("web", Protocol::Tcp),
            vec![
                "198.19.0.10".parse().unwrap(),
                "2001:db8:ffff::10".parse().unwrap(),
            ],
            80,
            eps,
        )
    };
    let local = DesiredService {
        node_port: Some(30081),
        external_policy_local: true,
        local_endpoints: vec![Endpoint {
            is_local: true,
            ..Endpoint::new(v4(1, 10), 8080)
        }],
        ..DesiredService::cluster_ip(
            spn("local", Protocol::Udp),
            vec!["198.19.0.11".parse().unwrap()],
            53,
            vec![
                Endpoint::new(v4(1, 10), 8080),
                Endpoint::new(v4(2, 11), 8080),
            ],
        )
    };
    let empty = DesiredService::cluster_ip(
        spn("empty", Protocol::Sctp),
        vec!["198.19.0.12".parse().unwrap()],
        80,
        Vec::new(),
    );
    DesiredState {
        services: [web, local, empty]
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect(),
        service_cidrs: [
            "198.19.0.0/16".parse().unwrap(),
            "2001:db8:ffff::/108".parse().unwrap(),
        ]
        .into(),
        ..DesiredState::default()
    }
}

fn settings() -> NftSettings {
    NftSettings {
        masquerade_mark: 1 << 14,
        masquerade_all: false,
        detect_local: DetectLocal::ClusterCidr(vec!["198.18.0.0/16".parse().unwrap()]),
        node_ports_everywhere: true,
        localhost_node_ports: true,
    }
}

fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_model_becomes_upstreams_tables_and_stale_chains_go() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; nft runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let mut proxier = NftablesProxier::new(NftSettings {
            masquerade_mark: 1 << 14,
            masquerade_all: false,
            detect_local: DetectLocal::ClusterCidr(vec!["198.18.0.0/16".parse().unwrap()]),
            node_ports_everywhere: true,
            localhost_node_ports: true,
        });
        let full = SyncChanges {
            full: true,
            ..Default::default()
        };
        let s = state();
        proxier.sync(&s, &full).expect("the first sync");
        let table = nft(&["list", "table", "ip", "kube-proxy"]);
        for want in [
            "chain nat-prerouting",
            "type nat hook prerouting priority dstnat; policy accept;",
            "chain filter-output-post-dnat",
            "masquerade fully-random",
            "meta mark set meta mark | 0x00004000",
            "198.19.0.10 . tcp . 80 : goto service-",
            "tcp . 30080 : goto external-",
            "198.19.0.12 . sctp . 80 comment \"ns1/empty:p80/SCTP\" : goto reject-chain",
            "ip daddr 198.19.0.0/16 drop",
            "ip saddr != 198.18.0.0/24 drop",
            "numgen random mod 2 0 goto endpoint-",
            "dnat to 198.18.2.10:8080",
            "short-circuit pod traffic",
            "set affinity-",
        ] {
            assert!(table.contains(want), "{want:?} missing from\n{table}");
        }
        let table6 = nft(&["list", "table", "ip6", "kube-proxy"]);
        assert!(table6.contains("dnat to [2001:db8:2::10]:8080"), "{table6}");

        // The same state again: accepted, unchanged.
        proxier.sync(&s, &full).expect("a second sync");
        assert_eq!(nft(&["list", "table", "ip", "kube-proxy"]), table);

        // A service goes: its chains are emptied now, deleted by a sync a second later.
        let mut fewer = s.clone();
        fewer.services.retain(|k, _| &*k.name != "web");
        proxier.sync(&fewer, &full).expect("the sync without web");
        let after = nft(&["list", "table", "ip", "kube-proxy"]);
        assert!(!after.contains("198.19.0.10 . tcp"), "{after}");
        // A chain of someone else's that jumps to one of web's: the kernel
        // refuses to delete that one, which upstream counts and retries
        // once a full sync finds it stale again.
        let web_chain = nft(&["list", "chains", "ip"])
            .lines()
            .filter_map(|l| l.trim().strip_prefix("chain "))
            .filter_map(|l| l.split_whitespace().next())
            .find(|c| c.contains("ns1/web/tcp/p80"))
            .expect("a chain of web")
            .to_owned();
        nft(&["add", "chain", "ip", "kube-proxy", "holder"]);
        nft(&[
            "add",
            "rule",
            "ip",
            "kube-proxy",
            "holder",
            "jump",
            &web_chain,
        ]);
        std::thread::sleep(Duration::from_millis(1_100));
        proxier.sync(&fewer, &full).expect("the next sync");
        let failures =
            r#"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv4"} 1"#;
        let metrics = scrape(proxier.metrics());
        assert!(
            metrics.lines().any(|l| l == failures),
            "{failures} missing from\n{metrics}"
        );
        assert!(nft(&["list", "chains", "ip"]).contains(&web_chain));
        nft(&["delete", "chain", "ip", "kube-proxy", "holder"]);
        proxier.sync(&fewer, &full).expect("a full sync");
        std::thread::sleep(Duration::from_millis(1_100));
        proxier.sync(&fewer, &full).expect("the next sync");
        let chains = nft(&["list", "chains", "ip"]);
        assert!(!chains.contains("ns1/web/tcp/p80"), "{chains}");
        assert!(chains.contains("ns1/local/udp/p80"), "{chains}");
    })
    .join()
    .unwrap();
}

/// `proxy-agent emit --mode nftables` prints a script nft accepts, and it is
/// the table the agent's proxier writes for the same state.
#[test]
fn emit_prints_what_nft_accepts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("web.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  type: NodePort\n  clusterIP: 198.19.0.60\n  clusterIPs: [198.19.0.60]\n  sessionAffinity: ClientIP\n  ports:\n    - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30660}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports:\n  - {name: http, protocol: TCP, port: 8080}\nendpoints:\n  - addresses: [198.18.2.10]\n    conditions: {ready: true}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
        .args([
            "emit",
            "--mode",
            "nftables",
            "--hostname-override",
            "node-a",
            "--local-address",
            "198.18.0.1",
            "--manifests",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(
        script
            .contains("add element ip kube-proxy service-nodeports { tcp . 30660 : goto external-"),
        "{script}"
    );
    std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread; nft runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let done = child.wait_with_output().unwrap();
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let table = nft(&["list", "table", "ip", "kube-proxy"]);
        assert!(table.contains("dnat to 198.18.2.10:8080"), "{table}");
        assert!(table.contains("update @affinity-"), "{table}");
    })
    .join()
    .unwrap();

    // The iptables form: what iptables-restore (IPv4 part) accepts.
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
        .args([
            "emit",
            "--mode",
            "iptables",
            "--hostname-override",
            "node-a",
            "--local-address",
            "198.18.0.1",
            "--manifests",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let ipv4: String = text.split("# ip6tables-restore").next().unwrap().to_owned();
    assert!(
        ipv4.contains("-j DNAT --to-destination 198.18.2.10:8080"),
        "{ipv4}"
    );
    std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread; iptables runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let mut child = Command::new("iptables-nft-restore")
            .args(["-w", "--noflush"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ipv4.as_bytes())
            .unwrap();
        let done = child.wait_with_output().unwrap();
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        assert!(iptables_save("nat").contains("KUBE-SVC-"));
    })
    .join()
    .unwrap();

    // The ipvs form: the virtual servers and what kube-ipvs0 holds.
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-agent"))
        .args([
            "emit",
            "--mode",
            "ipvs",
            "--hostname-override",
            "node-a",
            "--local-address",
            "198.18.0.1",
            "--manifests",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "-A -t 198.19.0.60:80 -s rr -p 10800\n-a -t 198.19.0.60:80 -r 198.18.2.10:8080 -m -w 1\n",
        "-A -t 198.18.0.1:30660 -s rr -p 10800\n",
        "# kube-ipvs0 V4 addresses\n198.19.0.60\n",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
}

/// A mode's own metrics as a scrape shows them.
fn scrape(collectors: Vec<Box<dyn prometheus_client::collector::Collector>>) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("kubeproxy");
    for c in collectors {
        registry.register_collector(c);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

fn iptables_save(table: &str) -> String {
    let out = Command::new("iptables-nft-save")
        .args(["-t", table])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_model_becomes_upstreams_iptables_chains_and_stale_chains_go() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; iptables runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let mut proxier = IptablesProxier::with_backend(settings(), IptablesBackend::Nft);
        let full = SyncChanges {
            full: true,
            ..Default::default()
        };
        let s = state();
        proxier.sync(&s, &full).expect("the first sync");
        let nat = iptables_save("nat");
        let filter = iptables_save("filter");
        for want in [
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-d 198.19.0.10/32 -p tcp -m comment --comment \"ns1/web:p80/TCP cluster IP\" -m tcp --dport 80 -j KUBE-SVC-",
            "-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-",
            "-j DNAT --to-destination 198.18.2.10:8080",
            "-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-",
            "-A KUBE-NODEPORTS -p tcp -m comment --comment \"ns1/web:p80/TCP\" -m tcp --dport 30080 -j KUBE-EXT-",
        ] {
            assert!(nat.contains(want), "{want:?} missing from\n{nat}");
        }
        assert!(
            filter.contains("-d 198.19.0.12/32 -p sctp -m comment --comment \"ns1/empty:p80/SCTP has no endpoints\"")
                || filter.contains("has no endpoints"),
            "{filter}"
        );
        assert!(filter.contains("-j REJECT --reject-with icmp-port-unreachable"), "{filter}");
        assert!(filter.contains("traffic not accepted by KUBE-FW-"), "{filter}");

        // The same state again: the same rules.
        proxier.sync(&s, &full).expect("a second sync");
        assert_eq!(iptables_save("nat").lines().filter(|l| l.starts_with('-')).count(), nat.lines().filter(|l| l.starts_with('-')).count());

        // A service goes: its chains go with it.
        let mut fewer = s.clone();
        fewer.services.retain(|k, _| &*k.name != "web");
        proxier.sync(&fewer, &full).expect("the sync without web");
        let after = iptables_save("nat");
        assert!(!after.contains("ns1/web:p80"), "{after}");
        assert!(after.contains("ns1/local:p80"), "{after}");
    })
    .join()
    .unwrap();
}

/// A partial sync rewrites the changed service ports only: their elements
/// and chains change, nothing else is touched (a marker rule added by hand
/// to the `services` chain survives it; a full sync would flush it), and the
/// table ends as a full sync of the new state would leave it.
#[test]
fn a_partial_nftables_sync_touches_only_the_changed_service_ports() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; nft runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let settings = NftSettings {
            masquerade_mark: 1 << 14,
            masquerade_all: false,
            detect_local: DetectLocal::ClusterCidr(vec!["198.18.0.0/16".parse().unwrap()]),
            node_ports_everywhere: true,
            localhost_node_ports: true,
        };
        let mut proxier = NftablesProxier::new(settings.clone());
        let s = state();
        proxier
            .sync(
                &s,
                &SyncChanges {
                    full: true,
                    ..Default::default()
                },
            )
            .unwrap();
        nft(&[
            "add",
            "rule",
            "ip",
            "kube-proxy",
            "services",
            "counter",
            "comment",
            "\"marker\"",
        ]);

        // web gains an endpoint, empty goes, extra comes.
        let mut next = s.clone();
        let web = next
            .services
            .keys()
            .find(|k| &*k.name == "web")
            .unwrap()
            .clone();
        next.services
            .get_mut(&web)
            .unwrap()
            .cluster_endpoints
            .push(Endpoint::new(v4(2, 12), 8080));
        let empty = next
            .services
            .keys()
            .find(|k| &*k.name == "empty")
            .unwrap()
            .clone();
        next.services.remove(&empty);
        let extra = DesiredService::cluster_ip(
            spn("extra", Protocol::Tcp),
            vec!["198.19.0.13".parse().unwrap()],
            80,
            vec![Endpoint::new(v4(2, 13), 8080)],
        );
        next.services.insert(extra.name.clone(), extra.clone());
        let changed = SyncChanges {
            full: false,
            changed: [web, empty, extra.name.clone()].into(),
        };
        proxier.sync(&next, &changed).expect("a partial sync");
        let table = nft(&["list", "table", "ip", "kube-proxy"]);
        assert!(
            table.contains("comment \"marker\""),
            "a partial sync left the rest alone\n{table}"
        );
        assert!(table.contains("dnat to 198.18.2.12:8080"), "{table}");
        assert!(
            table.contains("198.19.0.13 . tcp . 80 : goto service-"),
            "{table}"
        );
        assert!(!table.contains("198.19.0.12 . sctp"), "{table}");
        assert!(
            table.lines().any(
                |l| l.contains("numgen random mod 2 0 goto") && l.contains("ns1/web/tcp/p80__")
            ) && table.lines().any(|l| l.trim().starts_with("goto endpoint-")
                && l.contains("ns1/web/tcp/p80__198.18.2.12/8080")),
            "web's chain rewritten: {table}"
        );

        // The same as a fresh full sync of the new state, rule for rule and
        // element for element (the listing orders elements as it likes).
        let partial = normalized(&table);
        nft(&["delete", "table", "ip", "kube-proxy"]);
        NftablesProxier::new(settings)
            .sync(
                &next,
                &SyncChanges {
                    full: true,
                    ..Default::default()
                },
            )
            .unwrap();
        let full = normalized(&nft(&["list", "table", "ip", "kube-proxy"]));
        let only_partial: Vec<_> = partial.difference(&full).collect();
        let only_full: Vec<_> = full.difference(&partial).collect();
        assert!(
            only_partial.is_empty() && only_full.is_empty(),
            "partial only: {only_partial:#?}\nfull only: {only_full:#?}"
        );
    })
    .join()
    .unwrap();
}

/// A table listing as a set of its rules and its set/map elements, without
/// the hand-made marker.
fn normalized(listing: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut in_elements = false;
    let mut chunk = String::new();
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("elements = {") {
            in_elements = true;
            chunk.clear();
            chunk.push_str(rest);
        } else if in_elements {
            chunk.push(' ');
            chunk.push_str(line);
        } else if !line.is_empty() && !line.contains("marker") {
            out.insert(line.to_owned());
            continue;
        }
        if in_elements && chunk.trim_end().ends_with('}') {
            in_elements = false;
            let body = chunk.trim_end().trim_end_matches('}');
            for e in body.split(',') {
                out.insert(format!("element {}", e.trim()));
            }
        }
    }
    out
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `-A` rules and the chain names of one table, as a set.
fn rule_set(save: &str) -> std::collections::BTreeSet<String> {
    save.lines()
        .filter(|l| l.starts_with("-A") || l.starts_with(':'))
        .map(|l| l.split(" [").next().unwrap().to_owned())
        .filter(|l| !l.contains("marker"))
        .collect()
}

fn full_sync() -> SyncChanges {
    SyncChanges {
        full: true,
        ..Default::default()
    }
}

/// Runs `test` in a network namespace of its own, on an iptables proxier
/// that synced [`state`] in full.
fn with_synced_iptables(test: impl FnOnce(IptablesProxier, DesiredState) + Send + 'static) {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; iptables runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let mut proxier = IptablesProxier::with_backend(settings(), IptablesBackend::Nft);
        let s = state();
        proxier.sync(&s, &full_sync()).expect("the first sync");
        test(proxier, s);
    })
    .join()
    .unwrap();
}

/// web's IPv4 endpoint 198.18.2.10 becomes 198.18.2.14; web's name.
fn move_webs_first_endpoint(state: &mut DesiredState) -> ServicePortName {
    let web = state
        .services
        .keys()
        .find(|k| &*k.name == "web")
        .unwrap()
        .clone();
    state.services.get_mut(&web).unwrap().cluster_endpoints[0] = Endpoint::new(v4(2, 14), 8080);
    web
}

/// Upstream's partial sync in iptables mode: the shared chains are
/// rewritten, only the changed ports' own chains are (a marker in an
/// unchanged port's chain survives; a full sync declares, so flushes, every
/// chain), the chains a changed port no longer uses are deleted, and the
/// result equals a full sync of the new state.
#[test]
fn a_partial_iptables_sync_rewrites_only_the_changed_ports_chains() {
    with_synced_iptables(|mut proxier, s| {
        let full = full_sync();
        let before = iptables_save("nat");
        let svc_chain = |save: &str, name: &str| -> String {
            save.lines()
                .find(|l| l.contains(&format!("ns1/{name}:p80")) && l.contains("-j KUBE-SVC-"))
                .and_then(|l| l.rsplit(' ').next())
                .unwrap()
                .to_owned()
        };
        let local_svc = svc_chain(&before, "local");
        run(
            "iptables-nft",
            &[
                "-t",
                "nat",
                "-A",
                &local_svc,
                "-m",
                "comment",
                "--comment",
                "marker",
            ],
        );

        // web loses its IPv4 endpoint for another, extra comes, empty goes.
        let mut next = s.clone();
        let old_sep: Vec<String> = before
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SEP-") && l.contains("198.18.2.10:8080"))
            .filter_map(|l| l.split(' ').nth(1).map(str::to_owned))
            .collect();
        let web = move_webs_first_endpoint(&mut next);
        let empty = next
            .services
            .keys()
            .find(|k| &*k.name == "empty")
            .unwrap()
            .clone();
        next.services.remove(&empty);
        let extra = DesiredService::cluster_ip(
            spn("extra", Protocol::Tcp),
            vec!["198.19.0.13".parse().unwrap()],
            80,
            vec![Endpoint::new(v4(2, 13), 8080)],
        );
        next.services.insert(extra.name.clone(), extra.clone());
        let changes = SyncChanges {
            full: false,
            changed: [web, empty, extra.name.clone()].into(),
        };
        proxier.sync(&next, &changes).expect("a partial sync");
        let after = iptables_save("nat");
        assert!(
            after.contains("--comment marker"),
            "the unchanged port's chain was left alone\n{after}"
        );
        // Upstream's counts: every rule of ours the kernel holds (the
        // unchanged port's too, not the hand-made marker), of which the
        // unchanged port's were not written.
        let metrics = scrape(proxier.metrics());
        for (table, save) in [("nat", after.clone()), ("filter", iptables_save("filter"))] {
            let held = save
                .lines()
                .filter(|l| l.starts_with("-A KUBE-") && !l.contains("marker"))
                .count();
            let series = |name: &str| {
                let series = format!(r#"{name}{{ip_family="IPv4",table="{table}"}} "#);
                metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(&series)?.parse::<usize>().ok())
                    .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
            };
            let total = series("kubeproxy_sync_proxy_rules_iptables_total");
            let last = series("kubeproxy_sync_proxy_rules_iptables_last");
            assert_eq!(total, held, "{table}\n{save}");
            if table == "nat" {
                assert!(
                    last < total,
                    "nat: the unchanged port's rules were written: {last}"
                );
            }
        }
        assert!(
            after.contains("DNAT --to-destination 198.18.2.14:8080"),
            "{after}"
        );
        assert!(
            after.contains("DNAT --to-destination 198.18.2.13:8080"),
            "{after}"
        );
        assert!(!old_sep.is_empty());
        for sep in &old_sep {
            assert!(
                !after.contains(sep.as_str()),
                "{sep} (198.18.2.10) deleted\n{after}"
            );
        }
        assert!(!iptables_save("filter").contains("ns1/empty:p80"));

        // The same rules as a full sync of the new state.
        let partial = (rule_set(&after), rule_set(&iptables_save("filter")));
        proxier.sync(&next, &full).expect("a full sync");
        let fresh = (
            rule_set(&iptables_save("nat")),
            rule_set(&iptables_save("filter")),
        );
        assert_eq!(partial, fresh);
        assert!(
            !iptables_save("nat").contains("marker"),
            "a full sync rewrites every chain"
        );
    });
}

/// A partial sync whose restore the kernel refuses is counted as upstream
/// counts it, and the next sync is full.
#[test]
fn a_refused_partial_iptables_restore_is_counted_and_the_next_sync_is_full() {
    with_synced_iptables(|mut proxier, s| {
        // The endpoint web loses has a chain, which someone else's rule
        // jumps to: deleting it fails, and with it the whole restore.
        let old_sep = iptables_save("nat")
            .lines()
            .find(|l| l.starts_with("-A KUBE-SEP-") && l.contains("198.18.2.10:8080"))
            .and_then(|l| l.split(' ').nth(1))
            .expect("the endpoint's chain")
            .to_owned();
        let hold = [
            "-t", "nat", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-j", &old_sep,
        ];
        run("iptables-nft", &hold);
        let mut next = s.clone();
        let web = move_webs_first_endpoint(&mut next);
        let changes = SyncChanges {
            full: false,
            changed: [web].into(),
        };
        assert!(
            proxier.sync(&next, &changes).is_err(),
            "the restore was refused"
        );
        let failures = r#"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 1"#;
        let metrics = scrape(proxier.metrics());
        assert!(
            metrics.lines().any(|l| l == failures),
            "{failures} missing from\n{metrics}"
        );

        let mut release = hold;
        release[2] = "-D";
        run("iptables-nft", &release);
        // Asked for a partial sync, it syncs in full: the endpoint's chain,
        // stale since the refused restore, goes too.
        proxier.sync(&next, &changes).expect("the next sync");
        let after = iptables_save("nat");
        assert!(!after.contains(old_sep.as_str()), "{old_sep} left\n{after}");
        assert!(
            after.contains("DNAT --to-destination 198.18.2.14:8080"),
            "{after}"
        );
        let metrics = scrape(proxier.metrics());
        assert!(
            metrics.lines().any(|l| l == failures),
            "a sync that works counts nothing"
        );
    });
}

/// As upstream's canary: after a firewall reload (every table flushed,
/// every chain deleted, in both families) the periodic sync (a partial
/// sync without changes) finds `KUBE-PROXY-CANARY` gone from mangle and
/// syncs in full: the jumps from
/// the built-in chains, every service chain and the canary come back.
/// (Without it, the partial restore names service chains that no longer
/// exist and is refused; the retry is full.)
#[test]
fn a_partial_iptables_sync_after_a_firewall_reload_is_full() {
    with_synced_iptables(|mut proxier, s| {
        let tables = ["mangle", "nat", "filter"];
        let save_all = || {
            let mut saved: Vec<_> = tables.iter().map(|t| rule_set(&iptables_save(t))).collect();
            for table in tables {
                saved.push(rule_set(&run("ip6tables-nft-save", &["-t", table])));
            }
            saved
        };
        let before = save_all();
        assert!(
            before[0].contains(":KUBE-PROXY-CANARY -"),
            "a full sync makes the canary\n{before:?}"
        );
        assert!(
            before[1].contains(
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            ),
            "{:?}",
            before[1]
        );
        assert!(
            before[4].contains(":KUBE-SERVICES -"),
            "IPv6 rules\n{:?}",
            before[4]
        );
        for tool in ["iptables-nft", "ip6tables-nft"] {
            for table in tables {
                run(tool, &["-t", table, "-F"]);
                run(tool, &["-t", table, "-X"]);
            }
        }
        proxier
            .sync(&s, &SyncChanges::default())
            .expect("the partial sync after the reload");
        assert_eq!(save_all(), before);
    });
}

/// As upstream, forwarded packets conntrack finds INVALID are dropped
/// unless `nf_conntrack_tcp_be_liberal` is set when the proxier starts.
#[test]
fn invalid_packets_are_dropped_unless_conntrack_is_liberal() {
    for liberal in [false, true] {
        std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread; iptables runs as its
            // child, and /proc/sys/net is this thread's namespace's.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            let sysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";
            std::fs::write(sysctl, if liberal { "1" } else { "0" }).unwrap();
            let mut proxier = IptablesProxier::with_backend(settings(), IptablesBackend::Nft);
            proxier.sync(&state(), &full_sync()).expect("the sync");
            let filter = iptables_save("filter");
            assert_eq!(
                filter.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID"),
                !liberal,
                "tcp_be_liberal {liberal}\n{filter}"
            );
        })
        .join()
        .unwrap();
    }
}

/// As upstream: the rules count into nfacct objects the proxier creates,
/// the INVALID drops (both families) and what NodePorts accept on
/// 127.0.0.0/8, and the metrics read the counts back at each scrape.
#[test]
fn nfacct_objects_count_what_upstreams_metrics_report() {
    use proxy_agent::modes::iptables::nfacct;
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; iptables and ip run as
        // its children, and nfacct objects belong to its namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        run("ip", &["link", "set", "lo", "up"]);
        let mut proxier = IptablesProxier::with_backend(settings(), IptablesBackend::Nft);
        proxier.sync(&state(), &full_sync()).expect("the sync");
        // iptables-save prints two spaces after --nfacct-name.
        let squeezed = |s: String| s.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ");
        let count_invalid = "--ctstate INVALID -m comment --comment \"kubernetes forwarding rules\" -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";
        let filter = squeezed(iptables_save("filter"));
        assert!(filter.contains(count_invalid), "{filter}");
        let ip6 = squeezed(run("ip6tables-nft-save", &["-t", "filter"]));
        assert!(ip6.contains(count_invalid), "{ip6}");
        let nat = squeezed(iptables_save("nat"));
        assert!(
            nat.contains("-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"ns1/web:p80/TCP\" -m tcp --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-"),
            "{nat}"
        );

        // A connection to the NodePort on 127.0.0.1 (its backend is not
        // there: the SYN is counted all the same).
        let before = nfacct::packets(nfacct::LOCALHOST_NODE_PORTS_ACCEPTED).unwrap();
        let _ = std::net::TcpStream::connect_timeout(
            &"127.0.0.1:30080".parse().unwrap(),
            Duration::from_millis(100),
        );
        let after = nfacct::packets(nfacct::LOCALHOST_NODE_PORTS_ACCEPTED).unwrap();
        assert_eq!(after, before + 1);
        let metrics = scrape(proxier.metrics());
        let accepted = format!("kubeproxy_iptables_localhost_nodeports_accepted_packets_total {after}");
        assert!(metrics.lines().any(|l| l == accepted), "{accepted} missing from\n{metrics}");
        assert!(
            metrics
                .lines()
                .any(|l| l == "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 0"),
            "{metrics}"
        );
    })
    .join()
    .unwrap();
}

/// `localhostNodePorts`: on (upstream's default) NodePorts answer on
/// 127.0.0.1 and `KUBE-FIREWALL` drops non-local traffic to 127.0.0.0/8;
/// off, loopback is excluded from the NodePorts jump. IPv6 never.
#[test]
fn localhost_node_ports_as_upstream() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; iptables runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let full = SyncChanges {
            full: true,
            ..Default::default()
        };
        let np_jump = |save: &str| -> String {
            save.lines()
                .find(|l| l.contains("-j KUBE-NODEPORTS") && l.starts_with("-A KUBE-SERVICES"))
                .unwrap_or_default()
                .to_owned()
        };
        IptablesProxier::with_backend(settings(), IptablesBackend::Nft)
            .sync(&state(), &full)
            .expect("a sync");
        let filter = iptables_save("filter");
        assert!(filter.contains("-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"), "{filter}");
        assert!(filter.contains("-A INPUT -j KUBE-FIREWALL") && filter.contains("-A OUTPUT -j KUBE-FIREWALL"), "{filter}");
        let jump = np_jump(&iptables_save("nat"));
        assert!(jump.contains("--dst-type LOCAL") && !jump.contains("127.0.0.0/8"), "{jump}");
        let v6 = np_jump(&run("ip6tables-nft-save", &["-t", "nat"]));
        assert!(v6.contains("! -d ::1/128"), "{v6}");

        let off = NftSettings {
            localhost_node_ports: false,
            ..settings()
        };
        run("iptables-nft", &["-t", "filter", "-F", "KUBE-FIREWALL"]);
        IptablesProxier::with_backend(off, IptablesBackend::Nft)
            .sync(&state(), &full)
            .expect("a sync");
        let jump = np_jump(&iptables_save("nat"));
        assert!(jump.contains("! -d 127.0.0.0/8"), "{jump}");
        assert!(!iptables_save("filter").contains("block incoming localnet"));
    })
    .join()
    .unwrap();
}

/// The backend kubelet uses wins: with its hint chain in the legacy
/// tables, the rules go there and nft's tables stay empty.
#[test]
fn the_iptables_backend_follows_kubelets() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; iptables runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        assert_eq!(
            IptablesBackend::detect().0,
            IptablesBackend::Nft,
            "nothing there: nft"
        );
        run(
            "iptables-legacy",
            &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
        );
        let mut proxier = IptablesProxier::new(settings());
        assert_eq!(proxier.backend(), IptablesBackend::Legacy);
        proxier
            .sync(
                &state(),
                &SyncChanges {
                    full: true,
                    ..Default::default()
                },
            )
            .expect("a sync");
        assert!(run("iptables-legacy-save", &["-t", "nat"]).contains("-j KUBE-SVC-"));
        assert!(!iptables_save("nat").contains("KUBE-SVC-"));
    })
    .join()
    .unwrap();
}
