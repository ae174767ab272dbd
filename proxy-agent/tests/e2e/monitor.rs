//! `proxy-agent monitor`, the built binary, against a running agent in a
//! testbed node: two monitors at once (drops only; flows of one service),
//! real traffic that is dropped (source ranges), rejected (no endpoints) and
//! balanced, text and JSON output, and the lease off once they exit. Needs root.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use aya::maps::{Array, Map, MapData, RingBuf};
use proxy_agent::modes::ebpf::monitor::{Events, monotonic_ns};
use proxy_common::MonitorSlot;
use serde_json::Value;
use testbed::{
    clients::{ConnectOutcome, tcp_connect_outcome},
    cluster::NodeId,
};

use crate::explain_common::*;
use crate::support::{PinnedScene, wait_for};

const TIMEOUT: Duration = Duration::from_millis(800);

/// A monitor running in `ns`, its stdout and stderr in files.
struct Monitor {
    child: Child,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Monitor {
    fn start(ns: &str, dir: &Path, name: &str, pins: (&Path, &Path), args: &[&str]) -> Self {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns, BIN, "monitor"])
            .args(args)
            .arg("--pin-dir")
            .arg(pins.0)
            .arg("--state-dir")
            .arg(pins.1)
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let monitor = Monitor { child, out, err };
        wait_for(Duration::from_secs(10), "the monitor to start", || {
            fs::read_to_string(&monitor.err)
                .unwrap()
                .contains("monitoring")
                .then_some(())
        });
        monitor
    }

    /// Waits for it to exit on its own; its stdout.
    fn finish(mut self) -> String {
        let status = wait_for(Duration::from_secs(20), "the monitor to exit", || {
            self.child.try_wait().unwrap()
        });
        let err = fs::read_to_string(&self.err).unwrap();
        assert!(status.success(), "monitor failed: {err}");
        fs::read_to_string(&self.out).unwrap()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

fn connect(ns: &str, src: Ipv4Addr, ip: Ipv4Addr, port: u16) -> ConnectOutcome {
    tcp_connect_outcome(ns, Some(src), SocketAddrV4::new(ip, port), TIMEOUT)
}

#[test]
fn monitors_stream_drops_rejects_and_flows_and_leave_the_datapath_quiet() {
    let scene = PinnedScene::start();
    scene
        .cluster
        .client_add_route("198.18.3.0/24", NodeId::A)
        .unwrap();
    let (ns, client_ns) = (scene.ns.clone(), scene.client_ns.clone());
    let (pin_dir, dir) = (scene.pin_dir.clone(), &scene.dir);
    let pins = (pin_dir.as_path(), scene.state_dir.as_path());

    let drops = Monitor::start(
        &ns,
        dir.path(),
        "drops",
        pins,
        &["--output", "json", "--duration", "4s"],
    );
    let flows = Monitor::start(
        &ns,
        dir.path(),
        "flows",
        pins,
        &[
            "--flows",
            "--service",
            "e2e/remote",
            "--output",
            "json",
            "--duration",
            "4s",
        ],
    );
    // Dropped: outside the LB's source ranges. Rejected: a service without endpoints.
    let denied = connect(&client_ns, DENIED, RANGED_LB, 80);
    assert!(matches!(denied, ConnectOutcome::TimedOut), "{denied:?}");
    let empty = connect(&client_ns, CLIENT, NODE_A, EMPTY_NODEPORT);
    assert!(matches!(empty, ConnectOutcome::Refused { .. }), "{empty:?}");
    // Balanced: through the NodePort from outside, the ClusterIP from a pod.
    assert_eq!(
        connect(&client_ns, CLIENT, NODE_A, REMOTE_NODEPORT).identity(),
        Some("web-b")
    );
    assert_eq!(
        connect(&scene.client_a.ns, POD_A, REMOTE_VIP, 80).identity(),
        Some("web-b")
    );

    let drops = json_lines(&drops.finish());
    let denied = drops
        .iter()
        .find(|e| e["reason"] == "drop_source_range")
        .unwrap_or_else(|| panic!("no source-range drop in {drops:#?}"));
    assert_eq!(denied["kind"], "drop");
    assert_eq!(denied["program"], "xdp_from_netdev");
    assert_eq!(denied["interface"], "eth0");
    assert_eq!(denied["protocol"], "TCP");
    assert!(
        denied["source"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{DENIED}:"))
    );
    assert_eq!(denied["destination"], format!("{RANGED_LB}:80"));
    let rejected = drops
        .iter()
        .find(|e| e["reason"] == "reject_no_endpoints")
        .unwrap_or_else(|| panic!("no reject in {drops:#?}"));
    assert_eq!(rejected["kind"], "reject");
    assert_eq!(rejected["program"], "tc_from_netdev");
    assert_eq!(
        rejected["destination"],
        format!("{NODE_A}:{EMPTY_NODEPORT}")
    );
    assert!(
        drops.iter().all(|e| e["kind"] != "flow"),
        "a drops monitor shows no flows: {drops:#?}"
    );

    let flows = json_lines(&flows.finish());
    assert!(
        flows.iter().all(|e| e["service"] == "e2e/remote:tcp/TCP"),
        "--service e2e/remote: {flows:#?}"
    );
    let node_port = flows
        .iter()
        .find(|e| e["kind"] == "flow" && e["destination"] == format!("{NODE_A}:{REMOTE_NODEPORT}"))
        .unwrap_or_else(|| panic!("no NodePort flow in {flows:#?}"));
    assert_eq!(
        node_port["translated_destination"],
        format!("{WEB_B}:{BACKEND_PORT}")
    );
    assert_eq!(node_port["snat"], true, "masqueraded to reach node-b");
    assert_eq!(node_port["reason"], "new_flow");
    let cluster_ip = flows
        .iter()
        .find(|e| e["destination"] == format!("{REMOTE_VIP}:80"))
        .unwrap_or_else(|| panic!("no ClusterIP flow in {flows:#?}"));
    assert_eq!(cluster_ip["program"], "tc_from_pod");
    assert!(
        cluster_ip["source"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{POD_A}:"))
    );
    assert_eq!(
        cluster_ip["translated_destination"],
        format!("{WEB_B}:{BACKEND_PORT}")
    );
    assert!(cluster_ip["backend_id"].as_u64().is_some());

    // Text, one event, filtered by address.
    let text = Monitor::start(
        &ns,
        dir.path(),
        "text",
        pins,
        &["--address", &DENIED.to_string(), "--count", "1"],
    );
    connect(&client_ns, CLIENT, NODE_A, EMPTY_NODEPORT);
    connect(&client_ns, DENIED, RANGED_LB, 80);
    let line = text.finish();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains(" DROP ")
            && line.contains("drop_source_range")
            && line.contains(&format!("{DENIED}:")),
        "{line}"
    );

    // Every monitor left: the lease is off, the programs report nothing.
    let control: Array<MapData, MonitorSlot> =
        Map::from_map_data(MapData::from_pin(pin_dir.join("MONITOR")).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    let now = monotonic_ns();
    let leases: Vec<MonitorSlot> = control.iter().map(Result::unwrap).collect();
    assert!(
        leases
            .iter()
            .all(|s| s.drops_until_ns <= now && s.flows_until_ns <= now),
        "{leases:?} at {now}"
    );
    let mut rings: Vec<Events> = proxy_common::maps::MONITOR_RINGS
        .iter()
        .map(|name| {
            let data = MapData::from_pin(pin_dir.join(name)).unwrap();
            let ring: RingBuf<MapData> = Map::from_map_data(data).unwrap().try_into().unwrap();
            Events::new(ring)
        })
        .collect();
    rings.iter_mut().for_each(|r| drop(r.drain()));
    connect(&client_ns, DENIED, RANGED_LB, 80);
    assert!(
        rings.iter_mut().all(|r| r.drain().is_empty()),
        "reports without a monitor"
    );

    // A mistake names the flag.
    let bad = Command::new("ip")
        .args(["netns", "exec", &ns, BIN, "monitor", "--service", "nope"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--service"), "{err}");
}
