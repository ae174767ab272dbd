//! `proxy-agent explain --online`, the built binary reading a running agent's
//! pinned maps in a testbed node, and the agent's pins themselves. The
//! offline form is in the kernel tier. Needs root.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use serde_json::Value;

use crate::cleanup_common::BpfFs;
use crate::explain_common::*;
use crate::support::{Agent, wait_for};

/// The agent binary in `ns`, pinning under `root` and removing its pins on a clean exit.
fn pinning_agent(ns: &str, manifests: &Path, log: PathBuf, root: &Path) -> Agent {
    Agent::start_as(
        ns,
        "node-a",
        manifests,
        log,
        &[
            "--detect-local-mode",
            "NodeCIDR",
            "--ebpf-pin-root",
            root.to_str().unwrap(),
            "--ebpf-detach-on-exit",
            // `auto` leaves a veth to TC; the walks below start at XDP.
            "--ebpf-xdp-mode",
            "generic",
        ],
    )
}

/// Where an agent pinning under `root` pins its maps.
fn maps_dir(root: &Path) -> PathBuf {
    root.join(format!("v{}/maps", proxy_common::ABI_VERSION))
}

fn online(ns: &str, pin_dir: Option<&Path>, env_dir: Option<&Path>, args: &[String]) -> Output {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, BIN, "explain", "--online"]);
    if let Some(dir) = pin_dir {
        cmd.arg("--pin-dir").arg(dir);
    }
    if let Some(dir) = env_dir {
        cmd.env("KUBE_EBPF_PROXY_PIN_DIR", dir);
    }
    cmd.args(args).args(["--output", "json"]).output().unwrap()
}

fn online_json(ns: &str, pin_dir: &Path, args: &[String]) -> Value {
    let out = online(ns, Some(pin_dir), None, args);
    assert!(
        out.status.success(),
        "explain --online failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The verdict once the agent has pinned and programmed its maps.
fn once_forwarded(ns: &str, pin_dir: &Path, args: &[String]) -> Option<Value> {
    let out = online(ns, Some(pin_dir), None, args);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    (out.status.success() && v["verdict"] == "forwarded").then_some(v)
}

/// Entries of a pinned conntrack map, read from this process.
fn conntrack_entries(pin_dir: &Path) -> usize {
    let data = aya::maps::MapData::from_pin(pin_dir.join("CONNTRACK")).unwrap();
    let map: aya::maps::HashMap<_, proxy_common::CtKey, proxy_common::CtValue> =
        aya::maps::Map::from_map_data(data)
            .unwrap()
            .try_into()
            .unwrap();
    map.keys().filter_map(Result::ok).count()
}

#[test]
fn online_explain_answers_from_the_running_agents_pinned_maps() {
    use testbed::cluster::{Cluster, NodeId};

    let mut cluster = Cluster::new().unwrap();
    assert_eq!(cluster.node(NodeId::A).ip, NODE_A);
    let web_a = cluster.add_pod(NodeId::A, "web-a").unwrap();
    let client_a = cluster.add_pod(NodeId::A, "client-a").unwrap();
    let web_b = cluster.add_pod(NodeId::B, "web-b").unwrap();
    assert_eq!((web_a.ip, client_a.ip, web_b.ip), (WEB_A, POD_A, WEB_B));
    let ns = cluster.node(NodeId::A).ns.clone();

    let manifests = tempfile::tempdir().unwrap();
    write_manifests(manifests.path());
    let bpffs = BpfFs::new();
    let root = bpffs.dir.join("kube-ebpf-proxy");
    let pin_dir = maps_dir(&root);
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("agent.log"),
        &root,
    );

    // The agent pins at start-up and programs the services within a second.
    let nodeport = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    // Masquerading needs the node's address, known once the Node object is read.
    wait_for(
        Duration::from_secs(20),
        "the agent's maps to serve the NodePort, masqueraded",
        || once_forwarded(&ns, &pin_dir, &nodeport).filter(|v| v["masqueraded"] == true),
    );
    // The maps serve before the programs are attached: the first sync's
    // report comes once they are, and explain names what runs.
    agent.wait_programs_attached();
    let v = once_forwarded(&ns, &pin_dir, &nodeport).expect("forwarded once attached");
    let mut pins: Vec<String> = fs::read_dir(&pin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pins.sort();
    for map in [
        "BACKENDS",
        "CONFIG",
        "CONNTRACK",
        "IFACES",
        "LOCAL_POD_CIDRS",
        "SERVICES",
        "SOURCE_RANGES",
        "SOCKETS",
        "STATS",
    ] {
        assert!(pins.iter().any(|p| p == map), "{map} pinned: {pins:?}");
    }
    assert!(
        agent.log_text().contains("maps pinned"),
        "{}",
        agent.log_text()
    );

    assert_eq!(v["mode"], "online");
    assert_forwarded(&v, WEB_B, true);
    assert_eq!(*source_of(&v).ip(), NODE_A);
    assert_eq!(v["frontend"]["kind"], "NodePort");
    assert_eq!(v["frontend"]["service"], Value::Null, "no model online");
    assert_eq!(
        v["steps"][0]["program"], "xdp_from_netdev",
        "the agent attached XDP to eth0 (generic mode)"
    );
    // XDP looked it up, as the live one would (the private load has the
    // agent's XDP filter, not an empty one that passes all to TC), and left
    // it to TC: the backend is behind another interface.
    assert_eq!(v["counters"]["xdp_pass"], 1, "{v:#}");

    let ct_before = conntrack_entries(&pin_dir);
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("tcp", CLIENT, NODE_A, LOCAL_NODEPORT, "outside"),
    );
    assert_eq!(v["verdict"], "dropped", "{v:#}");
    assert_eq!(v["reason"], "drop_no_local_endpoints");
    let v = online_json(&ns, &pin_dir, &packet("tcp", POD_A, REMOTE_VIP, 80, "pod"));
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["steps"][0]["program"], "tc_from_pod");
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("udp", CLIENT, EMPTY_LB, 80, "outside"),
    );
    assert_eq!(v["verdict"], "rejected", "{v:#}");
    assert_eq!(v["reject"], "icmp_port_unreachable");
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("tcp", DENIED, RANGED_LB, 80, "outside"),
    );
    assert_eq!(v["reason"], "drop_source_range", "{v:#}");
    // The node's own connection: the socket hook of a private load, run
    // where `ip netns exec` leaves no cgroup v2 mount (explain mounts one).
    let v = online_json(
        &ns,
        &pin_dir,
        &packet("udp", NODE_A, REMOTE_VIP, 80, "host"),
    );
    assert_forwarded(&v, WEB_B, false);
    assert_eq!(v["exit"], "socket", "{v:#}");
    let v = online_json(&ns, &pin_dir, &packet("tcp", NODE_A, EMPTY_VIP, 80, "host"));
    assert_eq!(v["reject"], "connection_refused", "{v:#}");
    let mut flows = packet("tcp", POD_A, TRIO_VIP, 80, "pod");
    flows.extend(["--flows".into(), "300".into()]);
    let v = online_json(&ns, &pin_dir, &flows);
    assert_eq!(v["verdicts"]["forwarded"], 300, "{v:#}");
    assert_eq!(v["endpoints"].as_array().unwrap().len(), 3, "{v:#}");
    assert_eq!(
        conntrack_entries(&pin_dir),
        ct_before,
        "explain never writes the live conntrack"
    );

    // The environment variable names the directory as well as --pin-dir.
    let out = online(&ns, None, Some(&pin_dir), &nodeport);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!pin_dir.exists(), "pins removed on a clean exit");
    let out = online(&ns, Some(&pin_dir), None, &nodeport);
    assert_one_line_error(&out, "--pin-dir: ");
}

#[test]
fn the_agent_takes_over_a_killed_agents_pins_and_runs_without_a_bpf_filesystem() {
    use testbed::cluster::{Cluster, NodeId};

    let cluster = Cluster::new().unwrap();
    let ns = cluster.node(NodeId::A).ns.clone();
    let manifests = tempfile::tempdir().unwrap();
    write_manifests(manifests.path());

    // An agent killed outright leaves its pins behind.
    let bpffs = BpfFs::new();
    let root = bpffs.dir.join("kube-ebpf-proxy");
    let pin_dir = maps_dir(&root);
    let old = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("old.log"),
        &root,
    );
    let nodeport = packet("tcp", CLIENT, NODE_A, REMOTE_NODEPORT, "outside");
    wait_for(Duration::from_secs(20), "the first agent's maps", || {
        once_forwarded(&ns, &pin_dir, &nodeport)
    });
    drop(old); // SIGKILL
    assert!(
        pin_dir.join("SERVICES").exists(),
        "a killed agent leaves its pins"
    );

    // The next agent takes them over, and explain reads them.
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("new.log"),
        &root,
    );
    wait_for(Duration::from_secs(20), "the new agent's maps", || {
        agent
            .log_text()
            .contains("took over the pinned service maps")
            .then_some(())?;
        once_forwarded(&ns, &pin_dir, &nodeport)
    });
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!pin_dir.exists(), "--ebpf-detach-on-exit removes every pin");

    // Without a BPF filesystem at the pin root (as /sys/fs/bpf under
    // `ip netns exec`): no pins, a warning, and the agent serves anyway.
    let tmp = tempfile::tempdir().unwrap();
    let mut agent = pinning_agent(
        &ns,
        manifests.path(),
        manifests.path().join("nofs.log"),
        &tmp.path().join("kube-ebpf-proxy"),
    );
    wait_for(Duration::from_secs(20), "the agent to sync", || {
        agent.log_text().contains("datapath synced").then_some(())
    });
    let log = agent.log_text();
    assert!(log.contains("running without pinned maps"), "{log}");
    assert!(log.contains("not on a BPF filesystem"), "{log}");
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert!(!tmp.path().join("kube-ebpf-proxy").exists());
}
