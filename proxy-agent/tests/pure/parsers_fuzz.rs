//! Bad input never takes the agent down: thousands of mutated configuration
//! files, manifest files and API objects (deterministic, seeded) go through
//! the real parsers. Each is either accepted or refused with an error naming
//! the file and what is wrong; a bad API object never keeps the good ones
//! from being programmed; nothing panics.

use std::{fs, net::IpAddr, path::Path};

use k8s_openapi::api::core::v1::Service;
use proxy_agent::model::endpoint_slice::EndpointSlice;
use proxy_agent::{
    model::{EndpointsChangeTracker, NodeTopology, ServiceChangeTracker, build_desired_state_for},
    options::{Environment, ProxyMode, mode::FixedSupport, parse},
    sources::manifests,
};
use serde_json::{Value, json};

const CASES: usize = 3_000;

/// xorshift64*: enough randomness for mutations, and every run is the same.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Tokens that break YAML, types, ranges and formats.
const TOKENS: &[&str] = &[
    "",
    "-1",
    "0",
    "65536",
    "99999999999999999999",
    "1.5",
    "true",
    "null",
    "~",
    "[]",
    "{}",
    "\"\"",
    "'",
    ":",
    "- x",
    "198.18.0.999",
    "::gg",
    "10.0.0.0/33",
    "1h-2m",
    "💥",
    "\t",
    "&anchor",
    "*alias",
    "!!binary AA",
    "{a: [",
    "0x10",
    "SCTP",
    "ICMP",
    "IPv7",
];

/// One random edit of a text file, line-wise or byte-wise.
fn mutate_text(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        return rng.pick(TOKENS).to_string();
    }
    for _ in 0..=rng.below(3) {
        let i = rng.below(lines.len());
        match rng.below(6) {
            0 => {
                lines.remove(i);
                if lines.is_empty() {
                    lines.push(String::new());
                }
            }
            1 => {
                let line = lines[i].clone();
                lines.insert(i, line);
            }
            2 => {
                // Replace a value.
                let line = &lines[i];
                let replaced = match line.split_once(": ") {
                    Some((k, _)) => format!("{k}: {}", rng.pick(TOKENS)),
                    None => format!("{line} {}", rng.pick(TOKENS)),
                };
                lines[i] = replaced;
            }
            3 => {
                let indent = " ".repeat(rng.below(6));
                lines.insert(
                    i,
                    format!("{indent}{}: {}", rng.pick(TOKENS), rng.pick(TOKENS)),
                );
            }
            4 => {
                let line = &mut lines[i];
                let cut = rng.below(line.len() + 1);
                line.truncate(line.floor_char_boundary(cut));
            }
            _ => {
                let mut bytes = lines[i].clone().into_bytes();
                if !bytes.is_empty() {
                    let at = rng.below(bytes.len());
                    bytes[at] = b" :-[]{}#&*!|>'\"%@`"[rng.below(18)];
                }
                lines[i] = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
    }
    lines.join("\n")
}

#[test]
fn mutated_configuration_files_are_accepted_or_refused_naming_the_file() {
    let seed = include_str!("options_fixtures/seed004-kube-proxy-config.yaml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let support = FixedSupport {
        supported: ProxyMode::ALL.to_vec(),
    };
    let env = Environment {
        support: &support,
        hostname: Some("node-a".into()),
    };
    let mut rng = Rng(0x5eed_c0f1);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..CASES {
        let text = mutate_text(&mut rng, seed);
        fs::write(&path, &text).unwrap();
        let args = ["kube-proxy", "--config", path.to_str().unwrap()];
        match parse(args, &env) {
            Ok(_) => accepted += 1,
            Err(e) => {
                refused += 1;
                let msg = e.to_string();
                // Decoding errors name the file; validation errors the field, as upstream.
                let names_field = [
                    ": Invalid value:",
                    ": Unsupported value:",
                    ": Required value",
                    ": Forbidden",
                    ": Duplicate value",
                ]
                .iter()
                .any(|kind| msg.contains(kind));
                assert!(
                    msg.contains("config.yaml") || names_field,
                    "case {case}: an error that names neither the file nor a field: {msg:?}\n{text}"
                );
                assert!(!msg.contains('\n'), "case {case}: one line: {msg:?}");
            }
        }
    }
    println!("configuration: {accepted} accepted, {refused} refused");
    assert!(
        refused > CASES / 10 && accepted > CASES / 20,
        "{accepted}/{refused}"
    );
}

const SERVICE_YAML: &str = "apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  type: NodePort
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  externalIPs: [198.18.3.1]
  ports:
    - name: http
      protocol: TCP
      port: 80
      targetPort: 8080
      nodePort: 30080
";

const SLICE_YAML: &str = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
  - name: http
    protocol: TCP
    port: 8080
endpoints:
  - addresses: [198.18.1.10]
    conditions: {ready: true}
    nodeName: node-a
";

fn check_manifests(dir: &Path, case: usize, text: &str) -> bool {
    match manifests::load_dir(dir) {
        Ok(_) => true,
        Err(e) => {
            assert!(
                e.file.ends_with("web.yaml"),
                "case {case}: the error names {} instead of the bad file\n{text}",
                e.file.display()
            );
            assert!(!e.message.is_empty(), "case {case}");
            false
        }
    }
}

#[test]
fn mutated_manifests_are_accepted_or_refused_naming_the_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("slice.yaml"), SLICE_YAML).unwrap();
    let mut rng = Rng(0x5eed_f11e);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..CASES {
        let text = mutate_text(&mut rng, SERVICE_YAML);
        fs::write(dir.path().join("web.yaml"), &text).unwrap();
        if check_manifests(dir.path(), case, &text) {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    println!("manifests: {accepted} accepted, {refused} refused");
    assert!(
        refused > CASES / 10 && accepted > CASES / 20,
        "{accepted}/{refused}"
    );
}

/// One random edit of a JSON value: a field removed, or replaced by a value
/// of another type or an out-of-range one.
fn mutate_json(rng: &mut Rng, value: &mut Value) {
    let replacements = [
        json!(null),
        json!(-1),
        json!(65536),
        json!("198.18.0.999"),
        json!("not-an-ip"),
        json!(""),
        json!([]),
        json!({}),
        json!("SCTP"),
        json!("IPv6"),
        json!("2001:db8::1"),
        json!(true),
    ];
    match value {
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = rng.pick(&keys).clone();
            match rng.below(3) {
                0 => {
                    map.remove(&key);
                }
                1 => mutate_json(rng, map.get_mut(&key).unwrap()),
                _ => {
                    map.insert(key, rng.pick(&replacements).clone());
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.below(items.len());
            mutate_json(rng, &mut items[i]);
        }
        other => *other = rng.pick(&replacements).clone(),
    }
}

fn service(name: &str, vip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"type": "LoadBalancer", "clusterIP": vip, "clusterIPs": [vip], "ipFamilies": ["IPv4"],
            "externalIPs": ["198.18.3.1"], "loadBalancerSourceRanges": ["198.18.0.0/16"],
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "sessionAffinity": "None",
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.4.1"}]}}})
}

fn slice(name: &str, service: &str, ip: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "demo", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": "node-a", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}}]})
}

#[test]
fn mutated_api_objects_never_keep_the_good_ones_from_being_programmed() {
    let mut rng = Rng(0x05ee_da91);
    let mut decoded = 0;
    for case in 0..CASES {
        let mut bad_service = service("bad", "198.19.0.11");
        let mut bad_slice = slice("bad-1", "bad", "198.18.1.11");
        for _ in 0..=rng.below(3) {
            mutate_json(&mut rng, &mut bad_service);
            mutate_json(&mut rng, &mut bad_slice);
        }
        // What the apiserver would never send does not decode: kube-rs
        // reports that object's event as an error and goes on.
        let mut services =
            vec![serde_json::from_value::<Service>(service("good", "198.19.0.10")).unwrap()];
        let mut slices = vec![
            serde_json::from_value::<EndpointSlice>(slice("good-1", "good", "198.18.1.10"))
                .unwrap(),
        ];
        if let Ok(s) = serde_json::from_value::<Service>(bad_service.clone()) {
            services.push(s);
            decoded += 1;
        }
        if let Ok(s) = serde_json::from_value::<EndpointSlice>(bad_slice.clone()) {
            slices.push(s);
        }
        let desired = build_desired_state_for(&services, &slices, &NodeTopology::new("node-a"));
        let good: Vec<_> = desired
            .services
            .values()
            .filter(|s| &*s.name.name == "good")
            .collect();
        assert_eq!(good.len(), 1, "case {case}: {bad_service} {bad_slice}");
        assert_eq!(
            good[0].cluster_ips,
            vec!["198.19.0.10".parse::<IpAddr>().unwrap()],
            "case {case}"
        );
        assert_eq!(good[0].cluster_endpoints.len(), 1, "case {case}");

        // The trackers take the same objects one by one without panicking.
        let mut tracker = ServiceChangeTracker::default();
        let mut endpoints = EndpointsChangeTracker::new("node-a");
        for s in &services {
            tracker.update(s);
        }
        for s in &slices {
            endpoints.update(s);
        }
        tracker.apply();
        endpoints.apply();
    }
    println!("API objects: {decoded} of {CASES} mutated services decoded and were modelled");
    assert!(decoded > CASES / 4, "{decoded}");
}
