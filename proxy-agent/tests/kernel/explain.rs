//! `proxy-agent explain`, the built binary against the real kernel, offline
//! (`--manifests`; it loads the programs in a namespace of its own): every
//! frontend kind (ClusterIP, NodePort, LB IP, external IP) and every verdict
//! (forwarded with and without masquerade, dropped and why, rejected with a
//! RST or ICMP, passed through), `--flows`, JSON output and bad input. The
//! online form is in the e2e tier. Needs root.

use std::{
    fs,
    net::Ipv4Addr,
    process::{Command, Output},
};

use serde_json::Value;

use crate::explain_common::*;

#[test]
fn cluster_ip_from_a_local_pod_is_forwarded_with_its_own_source() {
    let o = Offline::new();
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 80, "pod")));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["source"], "198.18.1.11:40000");
    assert_eq!(v["mode"], "offline");
    assert_eq!(v["frontend"]["kind"], "ClusterIP");
    assert_eq!(v["frontend"]["service"], "e2e/remote:tcp/TCP");
    assert_eq!(v["frontend"]["endpoints"], 1);
    assert_eq!(
        v["exit"], "fib_redirect",
        "the FIB routes the remote pod via the node's default route"
    );
    assert_eq!(v["steps"][0]["program"], "tc_from_pod");
    assert_eq!(v["steps"][0]["action"], "TC_ACT_REDIRECT");
    assert_eq!(v["counters"]["new_flow"], 1);

    let text = o.text(&refs(&packet("udp", POD_A, REMOTE_VIP, 80, "pod")));
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        "forwarded to endpoint 198.18.2.10:8080, source kept (198.18.1.11:40000)"
    );
    assert!(text.contains("frontend   ClusterIP of e2e/remote:udp/UDP, internalTrafficPolicy Cluster, 1 endpoint\n"), "{text}");
}

#[test]
fn node_port_lb_ip_and_external_ip_from_outside_are_masqueraded_to_the_node() {
    let o = Offline::new();
    for (dst, port, kind) in [
        (NODE_A, REMOTE_NODEPORT, "NodePort"),
        (REMOTE_LB, 80, "LoadBalancer"),
        (REMOTE_EXTERNAL_IP, 80, "ExternalIP"),
    ] {
        for proto in ["tcp", "udp"] {
            let v = o.json(&refs(&packet(proto, CLIENT, dst, port, "outside")));
            assert_forwarded(&v, WEB_B, true);
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["frontend"]["policy_field"], "externalTrafficPolicy");
            assert_eq!(v["frontend"]["policy"], "Cluster");
            let source = source_of(&v);
            assert_eq!(
                *source.ip(),
                NODE_A,
                "eTP Cluster masquerades to the node: {v:#}"
            );
            assert!(is_masquerade_port(source.port()), "{v:#}");
            // One-armed node: the endpoint is behind the arrival interface, so XDP finishes the job.
            assert_eq!(v["steps"].as_array().unwrap().len(), 1, "{v:#}");
            assert_eq!(v["steps"][0]["program"], "xdp_from_netdev");
            assert_eq!(v["steps"][0]["action"], "XDP_TX");
            assert_eq!(v["exit"], "xdp_tx");
            assert_eq!(v["counters"]["masqueraded"], 1);
        }
    }
    let text = o.text(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        REMOTE_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with("forwarded to endpoint 198.18.2.10:8080, masqueraded to 198.18.0.1:"),
        "{text}"
    );
    assert!(
        text.contains("  programs   xdp_from_netdev XDP_TX\n"),
        "{text}"
    );
}

#[test]
fn external_traffic_policy_local_drops_outside_traffic_but_local_pods_short_circuit() {
    let o = Offline::new();
    for (dst, port) in [
        (NODE_A, LOCAL_NODEPORT),
        (LOCAL_LB, 80),
        (LOCAL_EXTERNAL_IP, 80),
    ] {
        let v = o.json(&refs(&packet("tcp", CLIENT, dst, port, "outside")));
        assert_eq!(v["verdict"], "dropped", "{v:#}");
        assert_eq!(v["reason"], "drop_no_local_endpoints");
        assert_eq!(v["frontend"]["policy"], "Local");
        assert_eq!(v["frontend"]["endpoints"], 0);
        assert_eq!(v["steps"][0]["action"], "XDP_DROP");
        assert_eq!(v["endpoint"], Value::Null);
    }
    let text = o.text(&refs(&packet(
        "udp",
        CLIENT,
        NODE_A,
        LOCAL_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with("dropped: drop_no_local_endpoints (the traffic policy is Local and this node has no ready endpoint of the service)\n"),
        "{text}"
    );

    // Pods of this node bypass eTP Local and keep their address.
    let v = o.json(&refs(&packet("tcp", POD_A, NODE_A, LOCAL_NODEPORT, "pod")));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["source"], "198.18.1.11:40000");
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_for_a_local_endpoint() {
    let o = Offline::new();
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        HERE_NODEPORT,
        "outside",
    )));
    assert_forwarded(&v, WEB_A, false);
    assert_eq!(v["source"], "198.18.0.100:40000");
    assert_eq!(v["frontend"]["endpoints"], 1, "one endpoint on this node");
    // The endpoint is behind the pod interface: XDP leaves it to TC.
    assert_eq!(v["steps"][0]["action"], "XDP_PASS");
    assert_eq!(v["steps"][1]["program"], "tc_from_netdev");
    assert_eq!(v["steps"][1]["action"], "TC_ACT_REDIRECT");
}

#[test]
fn load_balancer_source_ranges_drop_other_sources_on_lb_ips_only() {
    let o = Offline::new();
    let allowed = o.json(&refs(&packet("tcp", CLIENT, RANGED_LB, 80, "outside")));
    assert_forwarded(&allowed, WEB_B, true);
    assert_eq!(allowed["frontend"]["source_ranges"], true);

    let denied = o.json(&refs(&packet("tcp", DENIED, RANGED_LB, 80, "outside")));
    assert_eq!(denied["verdict"], "dropped", "{denied:#}");
    assert_eq!(denied["reason"], "drop_source_range");
    assert_eq!(
        denied["explanation"],
        "the source is outside the service's loadBalancerSourceRanges"
    );

    let node_port = o.json(&refs(&packet(
        "tcp",
        DENIED,
        NODE_A,
        RANGED_NODEPORT,
        "outside",
    )));
    assert_forwarded(&node_port, WEB_B, true);
}

#[test]
fn services_without_endpoints_are_rejected_for_every_frontend_kind() {
    let o = Offline::new();
    let cases = [
        (POD_A, EMPTY_VIP, 80, "pod", "ClusterIP"),
        (CLIENT, NODE_A, EMPTY_NODEPORT, "outside", "NodePort"),
        (CLIENT, EMPTY_LB, 80, "outside", "LoadBalancer"),
        (CLIENT, EMPTY_EXTERNAL_IP, 80, "outside", "ExternalIP"),
    ];
    for (src, dst, port, from, kind) in cases {
        for (proto, reply) in [("tcp", "tcp_reset"), ("udp", "icmp_port_unreachable")] {
            let v = o.json(&refs(&packet(proto, src, dst, port, from)));
            assert_eq!(v["verdict"], "rejected", "{proto} {dst}:{port}: {v:#}");
            assert_eq!(v["reject"], reply);
            assert_eq!(v["reason"], "reject_no_endpoints");
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["frontend"]["endpoints"], 0);
            let last = v["steps"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(last["action"], "TC_ACT_REDIRECT", "sent back out: {v:#}");
        }
    }
    let text = o.text(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        EMPTY_NODEPORT,
        "outside",
    )));
    assert!(
        text.starts_with(
            "rejected with a TCP RST: reject_no_endpoints (the service has no endpoints)\n"
        ),
        "{text}"
    );
    let text = o.text(&refs(&packet("udp", POD_A, EMPTY_VIP, 80, "pod")));
    assert!(
        text.starts_with("rejected with an ICMP port unreachable: "),
        "{text}"
    );
}

#[test]
fn an_unused_port_of_a_cluster_ip_is_rejected() {
    let o = Offline::new();
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 81, "pod")));
    assert_eq!(v["verdict"], "rejected", "{v:#}");
    assert_eq!(v["reject"], "tcp_reset");
    assert_eq!(v["reason"], "reject_unknown_port");
    assert_eq!(v["frontend"], Value::Null);
}

#[test]
fn traffic_to_no_service_passes_untouched() {
    let o = Offline::new();
    for (src, dst, port, from) in [
        (POD_A, WEB_B, 8080, "pod"),
        (CLIENT, NODE_A, 22, "outside"),
        (CLIENT, Ipv4Addr::new(198, 18, 9, 9), 80, "outside"),
    ] {
        let v = o.json(&refs(&packet("tcp", src, dst, port, from)));
        assert_eq!(v["verdict"], "passed", "{dst}:{port}: {v:#}");
        assert_eq!(v["frontend"], Value::Null);
        assert_eq!(v["endpoint"], Value::Null);
        let last = v["steps"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["action"], "TC_ACT_OK");
    }
    let text = o.text(&refs(&packet("udp", POD_A, WEB_B, 8080, "pod")));
    assert!(
        text.starts_with("passed through untouched: not service traffic\n"),
        "{text}"
    );
}

#[test]
fn three_hundred_flows_reach_all_three_endpoints() {
    let o = Offline::new();
    let mut args = packet("tcp", POD_A, TRIO_VIP, 80, "pod");
    args.extend(["--flows".into(), "300".into()]);
    let v = o.json(&refs(&args));
    assert_eq!(v["flows"], 300);
    assert_eq!(v["verdicts"]["forwarded"], 300, "{v:#}");
    assert_eq!(v["verdicts"]["dropped"], 0);
    assert_eq!(v["masqueraded"], 0);
    let endpoints = v["endpoints"].as_array().unwrap();
    let reached: Vec<&str> = endpoints
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    let want: Vec<String> = TRIO.iter().map(|ip| endpoint(*ip)).collect();
    assert_eq!(reached, want, "sorted by address");
    for e in endpoints {
        let n = e["flows"].as_u64().unwrap();
        assert!(n >= 50, "a fair share for each: {v:#}");
    }

    let text = o.text(&refs(&args));
    assert!(
        text.starts_with("300 new flows: 300 forwarded to 3 endpoints\n"),
        "{text}"
    );
    for ep in &want {
        assert!(text.contains(&format!("  endpoint   {ep}")), "{text}");
    }
}

#[test]
fn flows_count_drop_reasons_too() {
    let o = Offline::new();
    let mut args = packet("udp", CLIENT, NODE_A, LOCAL_NODEPORT, "outside");
    args.extend([
        "--flows".into(),
        "20".into(),
        "--sport".into(),
        "65530".into(),
    ]);
    let v = o.json(&refs(&args));
    assert_eq!(v["verdicts"]["dropped"], 20, "{v:#}");
    assert_eq!(v["reasons"]["drop_no_local_endpoints"], 20);
    assert_eq!(v["endpoints"], Value::Array(vec![]));
}

#[test]
fn local_addresses_decide_where_node_ports_are_served() {
    let o = Offline::new();
    let extra = Ipv4Addr::new(198, 18, 0, 5);
    // By default the Node object's addresses: 198.18.0.5 is not the node's.
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        extra,
        REMOTE_NODEPORT,
        "outside",
    )));
    assert_eq!(v["verdict"], "passed", "{v:#}");

    let mut args = vec![
        "--local-address".to_string(),
        NODE_A.to_string(),
        "--local-address".into(),
        extra.to_string(),
    ];
    args.extend(packet("tcp", CLIENT, extra, REMOTE_NODEPORT, "outside"));
    let v = o.json(&refs(&args));
    assert_forwarded(&v, WEB_B, true);
    assert_eq!(v["frontend"]["kind"], "NodePort");
    assert_eq!(
        *source_of(&v).ip(),
        NODE_A,
        "the masquerade address stays the Node's InternalIP"
    );
}

#[test]
fn json_output_has_a_stable_shape() {
    let o = Offline::new();
    let v = o.json(&refs(&packet(
        "tcp",
        CLIENT,
        NODE_A,
        REMOTE_NODEPORT,
        "outside",
    )));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = vec![
        "mode",
        "packet",
        "frontend",
        "affinity",
        "maglev",
        "verdict",
        "endpoint",
        "destination",
        "source",
        "masqueraded",
        "flow",
        "exit",
        "reject",
        "reason",
        "explanation",
        "steps",
        "counters",
    ];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(
        v["packet"],
        serde_json::json!({
            "protocol": "tcp",
            "source": "198.18.0.100:40000",
            "destination": "198.18.0.1:30080",
            "from": "outside",
        })
    );
    let frontend_keys: Vec<&str> = v["frontend"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        frontend_keys.len(),
        6,
        "kind, service, policy_field, policy, endpoints, source_ranges: {frontend_keys:?}"
    );
}

fn explain_raw(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("explain")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_input_is_one_line_naming_the_flag() {
    let o = Offline::new();
    let good = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    let with = |extra: &[&'static str]| {
        let mut a = refs(&good);
        a.extend(extra);
        a
    };
    assert_one_line_error(&o.run(&with(&["--dport", "x"])), "--dport: given twice");
    let mut a = refs(&good);
    a[7] = "70000";
    assert_one_line_error(&o.run(&a), "--dport: \"70000\" is not a port");
    let mut a = refs(&good);
    a[3] = "198.18.0";
    assert_one_line_error(
        &o.run(&a),
        "--src: \"198.18.0\" is not an IPv4 or IPv6 address",
    );
    assert_one_line_error(&o.run(&with(&["--flows", "0"])), "--flows:");
    assert_one_line_error(&o.run(&with(&["--output", "yaml"])), "--output:");
    assert_one_line_error(&o.run(&with(&["--bogus"])), "--bogus: unknown flag");
    assert_one_line_error(
        &explain_raw(&refs(&good)),
        "--manifests: required (or --online",
    );
    assert_one_line_error(
        &explain_raw(&[&["--manifests", "/nonexistent/dir"], &refs(&good)[..]].concat()),
        "--manifests: /nonexistent/dir",
    );
    // No Node object to take addresses from.
    assert_one_line_error(
        &o.run(&[&["--hostname-override", "node-z"], &refs(&good)[..]].concat()),
        "--hostname-override: given twice",
    );
    let out = Command::new(BIN)
        .arg("explain")
        .arg("--manifests")
        .arg(o.dir.path())
        .args(["--hostname-override", "node-z"])
        .args(refs(&good))
        .output()
        .unwrap();
    assert_one_line_error(&out, "--local-address: required");
    // A configuration the agent would refuse.
    let bad_config = o.dir.path().join("bad.cfg");
    fs::write(&bad_config, CONFIG.replace("NodeCIDR", "Sideways")).unwrap();
    let out = Command::new(BIN)
        .arg("explain")
        .arg("--manifests")
        .arg(o.dir.path())
        .arg("--config")
        .arg(&bad_config)
        .args(refs(&good))
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "--config: failed validate: detectLocalMode: Unsupported value: \"Sideways\"",
    );
    assert_one_line_error(
        &explain_raw(&[&["--online", "--pin-dir", "/nonexistent"], &refs(&good)[..]].concat()),
        "--pin-dir: /nonexistent holds no pinned maps",
    );

    let offline_flag_online = [
        &["--online", "--local-address", "192.0.2.1"],
        &refs(&good)[..],
    ];
    assert_one_line_error(
        &explain_raw(&offline_flag_online.concat()),
        "--local-address: not used with --online",
    );

    // Help wins, even over a mistake before it.
    for args in [&["--help"][..], &["--src", "x", "--help"], &["-h"]] {
        let help = explain_raw(args);
        assert!(help.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("proxy-agent explain --online"),
            "{args:?}"
        );
    }
}

#[test]
fn kube_proxy_flags_still_parse_flat_next_to_the_subcommand() {
    // `explain` is only a subcommand in first position; the agent's own
    // parsing is untouched (an unknown flag is still kube-proxy's error).
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let out = Command::new(BIN)
        .args(["--hostname-override", "explain", "--bogus-flag"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("proxy-agent explain"),
        "not taken for the subcommand"
    );
}

#[test]
fn the_nodes_own_connections_are_explained_through_the_socket_hook() {
    let o = Offline::new();
    let frontends = [
        (REMOTE_VIP, 80, "ClusterIP"),
        (NODE_A, REMOTE_NODEPORT, "NodePort"),
        (Ipv4Addr::LOCALHOST, REMOTE_NODEPORT, "NodePort"),
        (REMOTE_LB, 80, "LoadBalancer"),
        (REMOTE_EXTERNAL_IP, 80, "ExternalIP"),
        // eTP Local: the node's own clients go to any endpoint, as upstream.
        (NODE_A, LOCAL_NODEPORT, "NodePort"),
    ];
    for (dst, port, kind) in frontends {
        for proto in ["tcp", "udp"] {
            let v = o.json(&refs(&packet(proto, NODE_A, dst, port, "host")));
            assert_forwarded(&v, WEB_B, false);
            assert_eq!(v["exit"], "socket", "{v:#}");
            assert_eq!(v["frontend"]["kind"], kind);
            assert_eq!(v["steps"][0]["program"], "sock_connect4");
            assert_eq!(v["steps"][0]["action"], "SOCK_ALLOW");
            assert_eq!(v["counters"]["sock_translated"], 1);
            assert_eq!(v["counters"]["new_flow"], Value::Null, "no per-packet NAT");
        }
    }
    for (dst, port) in [(EMPTY_VIP, 80), (NODE_A, EMPTY_NODEPORT), (REMOTE_VIP, 81)] {
        let v = o.json(&refs(&packet("tcp", NODE_A, dst, port, "host")));
        assert_eq!(v["verdict"], "rejected", "{dst}:{port}: {v:#}");
        assert_eq!(v["reject"], "connection_refused");
        assert_eq!(v["reason"], "sock_refused");
        assert_eq!(v["steps"][0]["action"], "SOCK_REFUSE");
    }
    let v = o.json(&refs(&packet(
        "tcp",
        NODE_A,
        Ipv4Addr::new(198, 19, 9, 9),
        80,
        "host",
    )));
    assert_eq!(v["verdict"], "passed", "{v:#}");
    let text = o.text(&refs(&packet("tcp", NODE_A, REMOTE_VIP, 80, "host")));
    assert!(
        text.starts_with(&format!("forwarded to endpoint {}", endpoint(WEB_B)))
            && text.contains("connected there by the socket hook: no per-packet NAT"),
        "{text}"
    );
    let flows = o.json(&refs(
        &[
            packet("tcp", NODE_A, TRIO_VIP, 80, "host"),
            vec!["--flows".into(), "30".into()],
        ]
        .concat(),
    ));
    assert_eq!(flows["verdicts"]["forwarded"], 30, "{flows:#}");
    assert_eq!(flows["endpoints"].as_array().unwrap().len(), 3, "{flows:#}");
}

#[test]
fn an_unallocated_address_of_a_service_cidr_is_dropped_and_the_node_refused() {
    let unallocated = Ipv4Addr::new(198, 19, 0, 99);
    let check = |o: &Offline| {
        let v = o.json(&refs(&packet("tcp", POD_A, unallocated, 80, "pod")));
        assert_eq!(v["verdict"], "dropped", "{v:#}");
        assert_eq!(v["reason"], "drop_unallocated_cluster_ip");
        assert_eq!(
            v["explanation"],
            "the address is inside a service CIDR but no service holds it (an unallocated cluster IP)"
        );
        let v = o.json(&refs(&packet("udp", NODE_A, unallocated, 80, "host")));
        assert_eq!(v["verdict"], "rejected", "{v:#}");
        assert_eq!(v["reject"], "connection_refused");
        assert_eq!(v["reason"], "drop_unallocated_cluster_ip");
        // Allocated cluster IPs are served as before.
        let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 80, "pod")));
        assert_forwarded(&v, WEB_B, false);
    };
    // Without service CIDRs nothing is dropped so.
    let o = Offline::new();
    let v = o.json(&refs(&packet("tcp", POD_A, unallocated, 80, "pod")));
    assert_eq!(v["verdict"], "passed", "{v:#}");

    // From a ServiceCIDR object.
    fs::write(
        o.dir.path().join("service-cidr.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [198.19.0.0/16]}\n",
    )
    .unwrap();
    check(&o);

    // From the extension's serviceCIDRs, where the cluster has no object.
    let o = Offline::new();
    let ebpf = o.dir.path().join("ebpf.yaml");
    fs::write(
        &ebpf,
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nserviceCIDRs: [198.19.0.0/16]\n",
    )
    .unwrap();
    let flags = [
        vec!["--ebpf-config".to_string(), ebpf.display().to_string()],
        packet("tcp", POD_A, unallocated, 80, "pod"),
    ]
    .concat();
    let v = o.json(&refs(&flags));
    assert_eq!(v["reason"], "drop_unallocated_cluster_ip", "{v:#}");
}

#[test]
fn session_affinity_is_shown_with_the_endpoint_and_how_long_the_pin_lasts() {
    let o = Offline::new();
    // The trio service with ClientIP affinity.
    let trio = o.dir.path().join("trio-svc.yaml");
    let yaml = fs::read_to_string(&trio).unwrap().replace(
        "spec:\n",
        "spec:\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
    );
    fs::write(&trio, yaml).unwrap();

    let v = o.json(&refs(&packet("tcp", POD_A, TRIO_VIP, 80, "pod")));
    let pinned = v["endpoint"].as_str().unwrap().to_owned();
    assert_eq!(v["affinity"]["timeout_seconds"], 600, "{v:#}");
    assert_eq!(v["affinity"]["endpoint"], pinned.as_str());
    assert_eq!(v["affinity"]["already_pinned"], false);
    let left = v["affinity"]["expires_in_seconds"].as_u64().unwrap();
    assert!((598..=600).contains(&left), "{v:#}");

    // 60 connections of one client: one endpoint, and the pin holds.
    let flows = o.json(&refs(
        &[
            packet("tcp", POD_A, TRIO_VIP, 80, "pod"),
            vec!["--flows".into(), "60".into()],
        ]
        .concat(),
    ));
    assert_eq!(flows["verdicts"]["forwarded"], 60, "{flows:#}");
    assert_eq!(flows["endpoints"].as_array().unwrap().len(), 1, "{flows:#}");
    assert_eq!(flows["affinity"]["already_pinned"], true, "{flows:#}");
    assert_eq!(flows["counters"], Value::Null, "a tally has no counters");

    let text = o.text(&refs(&packet("tcp", POD_A, TRIO_VIP, 80, "pod")));
    assert!(
        text.contains("  affinity   ClientIP, 600 s: this client is now pinned to 198.18."),
        "{text}"
    );
    // Without affinity, no such line and a null field.
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 80, "pod")));
    assert_eq!(v["affinity"], Value::Null);
}

#[test]
fn maglev_shows_the_bucket_slot_and_endpoint_and_agrees_with_the_forwarding() {
    let o = Offline::new();
    // The trio service, balanced by Maglev through the annotation.
    let trio = o.dir.path().join("trio-svc.yaml");
    let yaml = fs::read_to_string(&trio).unwrap().replace(
        "metadata: {name: trio, namespace: e2e}",
        "metadata: {name: trio, namespace: e2e, annotations: {kube-ebpf-proxy.io/lb-algorithm: maglev}}",
    );
    assert!(yaml.contains("lb-algorithm"), "{yaml}");
    fs::write(&trio, yaml).unwrap();

    let ebpf = o.dir.path().join("ebpf.yaml");
    fs::write(
        &ebpf,
        "apiVersion: ebpf.kube-ebpf-proxy.io/v1alpha1\nkind: EbpfDatapathConfiguration\nloadBalancing: {maglevTableSize: 251}\n",
    )
    .unwrap();
    let small = ["--ebpf-config".to_string(), ebpf.display().to_string()];
    for sport in [40000u16, 40001, 40002, 50000] {
        let flags = [
            packet("tcp", POD_A, TRIO_VIP, 80, "pod"),
            vec!["--sport".into(), sport.to_string()],
            small.iter().map(|s| s.to_string()).collect(),
        ]
        .concat();
        let v = o.json(&refs(&flags));
        assert_eq!(v["verdict"], "forwarded", "{v:#}");
        assert_eq!(v["maglev"]["table_size"], 251, "{v:#}");
        // The bucket is the one every node computes for this tuple.
        let bucket = proxy_agent::modes::ebpf::maglev::bucket(
            std::net::SocketAddr::new(POD_A.into(), sport),
            80,
            6,
            251,
        );
        assert_eq!(v["maglev"]["bucket"], bucket, "{v:#}");
        // The table's endpoint is the one the programs forwarded to.
        assert_eq!(v["maglev"]["endpoint"], v["endpoint"], "{v:#}");
    }

    // The same tuple, asked again, reaches the same endpoint (a fresh load each time).
    let flags = [
        packet("tcp", POD_A, TRIO_VIP, 80, "pod"),
        small.iter().map(|s| s.to_string()).collect(),
    ]
    .concat();
    let first = o.json(&refs(&flags))["endpoint"].clone();
    for _ in 0..3 {
        assert_eq!(o.json(&refs(&flags))["endpoint"], first);
    }
    let text = o.text(&refs(&flags));
    assert!(text.contains("  maglev     bucket "), "{text}");
    assert!(text.contains(" of 251: slot "), "{text}");

    // The node's own connections take a random bucket.
    let host = [
        packet("tcp", NODE_A, TRIO_VIP, 80, "host"),
        small.iter().map(|s| s.to_string()).collect(),
    ]
    .concat();
    let v = o.json(&refs(&host));
    assert_eq!(v["maglev"]["bucket"], Value::Null, "{v:#}");

    // Without the annotation (nor the configured algorithm), no such field.
    let v = o.json(&refs(&packet("tcp", POD_A, REMOTE_VIP, 80, "pod")));
    assert_eq!(v["maglev"], Value::Null);
}

#[test]
fn sctp_is_explained_for_pods_and_outside_and_refused_for_the_node_itself() {
    let o = Offline::new();
    fs::write(
        o.dir.path().join("signal.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: signal, namespace: e2e}\nspec:\n  type: NodePort\n  clusterIP: 198.19.0.30\n  clusterIPs: [198.19.0.30]\n  ports:\n    - {name: sctp, protocol: SCTP, port: 80, targetPort: 8080, nodePort: 30090}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: signal-1\n  namespace: e2e\n  labels: {kubernetes.io/service-name: signal}\naddressType: IPv4\nports:\n  - {name: sctp, protocol: SCTP, port: 8080}\nendpoints:\n  - addresses: [198.18.2.10]\n    conditions: {ready: true}\n    nodeName: node-b\n",
    )
    .unwrap();
    let vip = Ipv4Addr::new(198, 19, 0, 30);
    let v = o.json(&refs(&packet("sctp", POD_A, vip, 80, "pod")));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["packet"]["protocol"], "sctp", "{v:#}");
    assert_eq!(v["frontend"]["service"], "e2e/signal:sctp/SCTP", "{v:#}");

    let v = o.json(&refs(&packet("sctp", CLIENT, NODE_A, 30090, "outside")));
    assert_forwarded(&v, WEB_B, true);

    // Another port of the cluster IP: an ICMP port unreachable, as upstream rejects SCTP.
    let v = o.json(&refs(&packet("sctp", POD_A, vip, 81, "pod")));
    assert_eq!(v["verdict"], "rejected", "{v:#}");
    assert_eq!(v["reject"], "icmp_port_unreachable", "{v:#}");

    assert_one_line_error(
        &o.run(&refs(&packet("sctp", NODE_A, vip, 80, "host"))),
        "--proto sctp --from host: the node's own SCTP connections are not balanced",
    );
}
