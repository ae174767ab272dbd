//! `proxy-agent inspect`, the built binary, against a running agent in a
//! testbed node: real TCP through a NodePort (from the external client) and
//! a ClusterIP (from a pod), then every view in text and JSON, checked
//! against what this test counts in the pinned maps itself. Needs root.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    os::unix::fs::MetadataExt as _,
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use aya::maps::{HashMap, Map, MapData};
use proxy_common::{CtDirection, CtKey, CtValue, ServiceKey, ServiceValue};
use serde_json::Value;
use testbed::{clients::tcp_connect_outcome, cluster::NodeId};

use crate::explain_common::*;
use crate::support::PinnedScene;

const TIMEOUT: Duration = Duration::from_millis(800);
const NODEPORT_CONNECTIONS: usize = 3;
const CLUSTER_IP_CONNECTIONS: usize = 2;

fn inspect(ns: &str, pin_dir: &Path, state_dir: &Path, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns, BIN, "inspect"])
        .args(args)
        .arg("--pin-dir")
        .arg(pin_dir)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .unwrap()
}

fn text(ns: &str, pin_dir: &Path, state_dir: &Path, args: &[&str]) -> String {
    let out = inspect(ns, pin_dir, state_dir, args);
    assert!(
        out.status.success(),
        "inspect {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(ns: &str, pin_dir: &Path, state_dir: &Path, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["--output", "json"]);
    serde_json::from_str(&text(ns, pin_dir, state_dir, &args)).unwrap()
}

fn pinned<K: aya::Pod, V: aya::Pod>(pin_dir: &Path, name: &str) -> (HashMap<MapData, K, V>, u32) {
    let data = MapData::from_pin(pin_dir.join(name)).unwrap();
    let capacity = data.info().unwrap().max_entries();
    (
        Map::from_map_data(data).unwrap().try_into().unwrap(),
        capacity,
    )
}

/// The conntrack entries, read by this process.
fn conntrack(pin_dir: &Path) -> Vec<(CtKey, CtValue)> {
    pinned::<CtKey, CtValue>(pin_dir, "CONNTRACK")
        .0
        .iter()
        .map(Result::unwrap)
        .collect()
}

fn be(ip: Ipv4Addr) -> u32 {
    u32::from(ip).to_be()
}

fn counters(ns: &str, pin_dir: &Path, state_dir: &Path) -> BTreeMap<String, u64> {
    let v = json(ns, pin_dir, state_dir, &["counters"]);
    serde_json::from_value(v["counters"].clone()).unwrap()
}

fn connect(ns: &str, src: Option<Ipv4Addr>, ip: Ipv4Addr, port: u16) {
    let outcome = tcp_connect_outcome(ns, src, SocketAddrV4::new(ip, port), TIMEOUT);
    assert_eq!(
        outcome.identity(),
        Some("web-b"),
        "{ip}:{port}: {outcome:?}"
    );
}

#[test]
fn inspect_shows_a_running_agents_services_flows_counters_maps_and_attachments() {
    let mut scene = PinnedScene::start();
    let (ns, client_ns, pin_dir, state_dir) = (
        scene.ns.clone(),
        scene.client_ns.clone(),
        scene.pin_dir.clone(),
        scene.state_dir.clone(),
    );
    let eth0 = scene.cluster.node(NodeId::A).eth0.clone();
    let client_a = scene.client_a.clone();

    // Traffic: through the NodePort from outside, through the ClusterIP from a pod.
    let before = counters(&ns, &pin_dir, &state_dir);
    for _ in 0..NODEPORT_CONNECTIONS {
        connect(&client_ns, Some(CLIENT), NODE_A, REMOTE_NODEPORT);
    }
    for _ in 0..CLUSTER_IP_CONNECTIONS {
        connect(&client_a.ns, None, REMOTE_VIP, 80);
    }
    let after = counters(&ns, &pin_dir, &state_dir);
    let moved = |c: &str| after[c] - before[c];
    let flows = (NODEPORT_CONNECTIONS + CLUSTER_IP_CONNECTIONS) as u64;
    assert!(moved("new_flow") >= flows, "{before:?} -> {after:?}");
    assert!(
        moved("masqueraded") >= NODEPORT_CONNECTIONS as u64,
        "{after:?}"
    );
    assert!(moved("packets") > moved("new_flow"), "{after:?}");
    let listed = text(&ns, &pin_dir, &state_dir, &["counters"]);
    assert!(listed.contains("new_flow"), "{listed}");

    // Services: named, with policies and backends.
    let v = json(&ns, &pin_dir, &state_dir, &["services"]);
    assert_eq!(v["names"]["state"], "current", "{v:#}");
    let frontends = v["frontends"].as_array().unwrap();
    let find = |address: &str, port: u64, kind: &str| {
        frontends
            .iter()
            .find(|f| {
                f["address"] == address
                    && f["port"] == port
                    && f["kind"] == kind
                    && f["protocol"] == "TCP"
                    && f["scope"] == "primary"
            })
            .unwrap_or_else(|| panic!("{kind} {address}:{port} in {v:#}"))
    };
    let cluster_ip = find(&REMOTE_VIP.to_string(), 80, "ClusterIP");
    assert_eq!(cluster_ip["service"], "e2e/remote:tcp/TCP");
    assert_eq!(cluster_ip["internal_traffic_policy"], "Cluster");
    let backends = cluster_ip["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 1, "{cluster_ip:#}");
    assert_eq!(backends[0]["address"], WEB_B.to_string());
    assert_eq!(backends[0]["port"], BACKEND_PORT);
    assert_eq!(backends[0]["node"], "node-b");
    assert_eq!(backends[0]["ready"], true);
    let node_port = find(&NODE_A.to_string(), u64::from(REMOTE_NODEPORT), "NodePort");
    assert_eq!(node_port["service"], "e2e/remote:tcp/TCP");
    assert_eq!(node_port["external_traffic_policy"], "Cluster");
    assert_eq!(node_port["service_id"], cluster_ip["service_id"]);
    let local = find(&NODE_A.to_string(), u64::from(LOCAL_NODEPORT), "NodePort");
    assert_eq!(local["external_traffic_policy"], "Local");
    assert_eq!(local["policy_local"], true);
    let (services_map, _) = pinned::<ServiceKey, ServiceValue>(&pin_dir, "SERVICES");
    let frontends_in_map = services_map
        .iter()
        .map(Result::unwrap)
        .filter(|(k, v)| {
            k.slot == 0 && v.flags & proxy_common::service::flags::CLUSTER_IP_MARKER == 0
        })
        .count();
    assert_eq!(frontends.len(), frontends_in_map, "every frontend listed");
    let only = json(
        &ns,
        &pin_dir,
        &state_dir,
        &["services", "--service", "e2e/remote:tcp"],
    );
    let only = only["frontends"].as_array().unwrap();
    assert!(!only.is_empty() && only.iter().all(|f| f["service"] == "e2e/remote:tcp/TCP"));
    let table = text(&ns, &pin_dir, &state_dir, &["services"]);
    assert!(
        table.contains("e2e/remote:tcp/TCP")
            && table.contains("NodePort")
            && table.contains(&format!("{WEB_B}:{BACKEND_PORT}")),
        "{table}"
    );

    // Backends, and the endpoint filter.
    let v = json(
        &ns,
        &pin_dir,
        &state_dir,
        &["backends", "--endpoint", &format!("{WEB_B}:{BACKEND_PORT}")],
    );
    let listed = v["backends"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "TCP and UDP: {v:#}");
    assert!(
        listed
            .iter()
            .all(|b| b["node"] == "node-b" && b["ready"] == true && b["local"] == false)
    );

    // Conntrack: the flows this test made, counted here independently.
    let entries = conntrack(&pin_dir);
    let client_forward = entries
        .iter()
        .filter(|(k, v)| k.saddr_be == be(CLIENT) && v.direction() == CtDirection::Forward)
        .count();
    assert_eq!(client_forward, NODEPORT_CONNECTIONS);
    let pod_forward = entries
        .iter()
        .filter(|(k, v)| k.saddr_be == be(POD_A) && v.direction() == CtDirection::Forward)
        .count();
    assert_eq!(pod_forward, CLUSTER_IP_CONNECTIONS);
    let client = CLIENT.to_string();
    let v = json(
        &ns,
        &pin_dir,
        &state_dir,
        &["conntrack", "--client", &client],
    );
    assert_eq!(v["total"], entries.len(), "{v:#}");
    assert!(
        v["collector"]["sweeps"].as_u64().is_some_and(|n| n >= 1),
        "the running agent swept conntrack once its programs loaded: {v:#}"
    );
    assert_eq!(
        v["matched"],
        2 * NODEPORT_CONNECTIONS,
        "both directions of each flow: {v:#}"
    );
    for e in v["entries"].as_array().unwrap() {
        assert!(
            e["client"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{CLIENT}:")),
            "{e:#}"
        );
        assert_eq!(e["backend"], format!("{WEB_B}:{BACKEND_PORT}"));
        assert_eq!(e["service"], "e2e/remote:tcp/TCP");
        if e["direction"] == "forward" {
            assert_eq!(e["destination"], format!("{NODE_A}:{REMOTE_NODEPORT}"));
            assert!(
                e["snat"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{NODE_A}:")),
                "{e:#}"
            );
        }
    }
    let filtered = json(
        &ns,
        &pin_dir,
        &state_dir,
        &[
            "conntrack",
            "--client",
            &client,
            "--service",
            "e2e/remote:tcp",
            "--endpoint",
            &WEB_B.to_string(),
        ],
    );
    assert_eq!(filtered["matched"], 2 * NODEPORT_CONNECTIONS);
    let none = json(
        &ns,
        &pin_dir,
        &state_dir,
        &["conntrack", "--client", &client, "--service", "e2e/local"],
    );
    assert_eq!(none["matched"], 0);
    let v = json(
        &ns,
        &pin_dir,
        &state_dir,
        &["conntrack", "--top", "10", "--limit", "0"],
    );
    assert_eq!(v["entries"].as_array().unwrap().len(), 0);
    let top = &v["top"];
    let clients: BTreeMap<String, u64> = top["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["key"].as_str().unwrap().to_owned(),
                h["entries"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(clients[&client], 2 * NODEPORT_CONNECTIONS as u64, "{top:#}");
    assert_eq!(
        clients[&POD_A.to_string()],
        2 * CLUSTER_IP_CONNECTIONS as u64,
        "{top:#}"
    );
    let counts: Vec<u64> = top["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["entries"].as_u64().unwrap())
        .collect();
    assert!(
        counts.windows(2).all(|w| w[0] >= w[1]),
        "heaviest first: {top:#}"
    );
    let services_total: u64 = top["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["entries"].as_u64().unwrap())
        .sum();
    assert_eq!(services_total, entries.len() as u64, "{top:#}");
    assert_eq!(top["services"][0]["key"], "e2e/remote:tcp/TCP");
    let table = text(
        &ns,
        &pin_dir,
        &state_dir,
        &["conntrack", "--client", &client, "--top", "3"],
    );
    assert!(
        table.contains(&format!(
            "{} of {} entries match",
            2 * NODEPORT_CONNECTIONS,
            entries.len()
        )),
        "{table}"
    );

    // Maps: the fill equals what this test counts.
    let v = json(&ns, &pin_dir, &state_dir, &["maps"]);
    let maps: BTreeMap<String, Value> = v["maps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_owned(), m.clone()))
        .collect();
    let (ct_map, ct_capacity) = pinned::<CtKey, CtValue>(&pin_dir, "CONNTRACK");
    assert_eq!(maps["CONNTRACK"]["entries"], ct_map.keys().count());
    assert_eq!(maps["CONNTRACK"]["capacity"], ct_capacity);
    let (svc_map, svc_capacity) = pinned::<ServiceKey, ServiceValue>(&pin_dir, "SERVICES");
    assert_eq!(maps["SERVICES"]["entries"], svc_map.keys().count());
    assert_eq!(maps["SERVICES"]["capacity"], svc_capacity);
    for name in std::fs::read_dir(&pin_dir).unwrap() {
        let name = name.unwrap().file_name().to_string_lossy().into_owned();
        assert!(maps.contains_key(&name), "{name} listed: {v:#}");
    }
    assert!(text(&ns, &pin_dir, &state_dir, &["maps"]).contains("CONNTRACK"));

    // Interfaces: what the kernel runs where.
    let v = json(&ns, &pin_dir, &state_dir, &["interfaces"]);
    let hooks_of = |name: &str| -> Vec<(String, String)> {
        v["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {v:#}"))["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["hook"].as_str().unwrap().to_owned(),
                    a["program"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let hooks = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .collect()
    };
    assert_eq!(
        hooks_of(&eth0),
        hooks(&[
            ("xdp_generic", "xdp_from_netdev"),
            ("tc_ingress", "tc_from_netdev"),
            ("tc_egress", "tc_from_host")
        ]),
        "the scene asks for generic XDP on its veth"
    );
    assert_eq!(
        hooks_of(&client_a.host_veth),
        hooks(&[("tc_ingress", "tc_from_pod"), ("tc_egress", "tc_from_host")])
    );
    let cgroup = scene.agent.cgroup.as_ref().expect("the agent's own cgroup");
    let cgroup_id = std::fs::metadata(&cgroup.path).unwrap().ino();
    let mut socket_hooks: Vec<&str> = v["cgroup_hooks"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|h| assert_eq!(h["cgroup_id"], cgroup_id, "{h:#}"))
        .map(|h| h["program"].as_str().unwrap())
        .collect();
    socket_hooks.sort();
    assert_eq!(
        socket_hooks,
        [
            "sock_connect4",
            "sock_connect6",
            "sock_getpeername4",
            "sock_peername6",
            "sock_recvmsg4",
            "sock_recvmsg6",
            "sock_release",
            "sock_sendmsg4",
            "sock_sendmsg6"
        ]
    );
    let table = text(&ns, &pin_dir, &state_dir, &["interfaces"]);
    assert!(
        table.contains(&eth0) && table.contains("xdp_generic"),
        "{table}"
    );

    // Programs, and whether the kernel accounts their run time.
    let v = json(&ns, &pin_dir, &state_dir, &["programs"]);
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap();
    let expected = if sysctl.trim() == "1" { "on" } else { "off" };
    assert_eq!(v["bpf_stats"], expected);
    let names: Vec<&str> = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for program in [
        "tc_from_pod",
        "tc_from_netdev",
        "tc_from_host",
        "xdp_from_netdev",
        "sock_getpeername4",
    ] {
        assert!(names.contains(&program), "{program} in {names:?}");
    }
    let summary = json(&ns, &pin_dir, &state_dir, &["summary"]);
    assert_eq!(summary["frontends"], frontends_in_map);
    assert!(text(&ns, &pin_dir, &state_dir, &["summary"]).contains("frontends"));

    // Without the names file: ids only, said so; with one the maps outgrew: stale.
    let elsewhere = scene.dir.path().join("no-state");
    let v = json(&ns, &pin_dir, &elsewhere, &["services"]);
    assert_eq!(v["names"]["state"], "missing");
    assert!(
        v["frontends"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["service"].is_null())
    );
    let table = text(&ns, &pin_dir, &elsewhere, &["services"]);
    assert!(
        table.contains("showing ids only") && table.contains("id "),
        "{table}"
    );
    let out = inspect(
        &ns,
        &pin_dir,
        &elsewhere,
        &["conntrack", "--service", "e2e/remote"],
    );
    assert_one_line_error(&out, "--service: needs the names");
    let stale_dir = scene.dir.path().join("stale");
    std::fs::create_dir(&stale_dir).unwrap();
    let mut published: Value =
        serde_json::from_slice(&std::fs::read(state_dir.join("datapath-names.json")).unwrap())
            .unwrap();
    published["services"].as_array_mut().unwrap().pop();
    std::fs::write(stale_dir.join("datapath-names.json"), published.to_string()).unwrap();
    let v = json(&ns, &pin_dir, &stale_dir, &["services"]);
    assert_eq!(v["names"]["state"], "stale", "{:#}", v["names"]);
    assert!(
        v["frontends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["service"].is_string())
    );

    // Mistakes name the flag.
    assert_one_line_error(
        &inspect(&ns, &pin_dir, &state_dir, &["conntrack", "--top", "0"]),
        "--top: ",
    );
    assert_one_line_error(
        &inspect(
            &ns,
            &pin_dir,
            &state_dir,
            &["maps", "--client", "198.18.0.100"],
        ),
        "--client: ",
    );
    assert_one_line_error(
        &inspect(
            &ns,
            &pin_dir,
            &state_dir,
            &["conntrack", "--service", "remote"],
        ),
        "--service: ",
    );
    assert_one_line_error(
        &inspect(
            &ns,
            &pin_dir,
            &state_dir,
            &["conntrack", "--service", "e2e/nothing"],
        ),
        "--service: no service port",
    );

    assert!(scene.agent.stop().success(), "{}", scene.agent.log_text());
    assert!(
        !state_dir.join("datapath-names.json").exists(),
        "names removed with the datapath"
    );
    assert_one_line_error(
        &inspect(&ns, &pin_dir, &state_dir, &["maps"]),
        "--pin-dir: ",
    );
}
