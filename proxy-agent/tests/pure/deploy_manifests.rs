//! deploy/: every manifest against the Kubernetes schemas (kubernetes-validate,
//! installed by `cargo xtask setup`), the kustomization's resource list, the
//! DaemonSet's command line and ConfigMap through the agent's own option parsing,
//! and the metric names of the Grafana dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use proxy_agent::options::checks::{self, NodeFacts};
use proxy_agent::options::mode::FixedSupport;
use proxy_agent::options::{Environment, Parsed, ProxyMode, ProxyOptions, parse};
use serde::Deserialize;
use serde_yaml::Value;

use crate::options_common::TempDir;

/// The Kubernetes releases the manifests must be valid for: the one whose
/// kube-proxy the agent mirrors, and the newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];

/// Every sample name the agent's metrics server can show in ebpf mode:
/// a scrape of the real registry of upstream's metrics (every labelled
/// series exists from the start; the health counters once answered) and
/// the names the datapath collector emits.
fn known_metrics() -> BTreeSet<String> {
    use proxy_agent::{
        metrics::ProxyMetrics, model::IpFamily, modes::ebpf::metrics::sample_names,
        options::ProxyMode,
    };
    let metrics = ProxyMetrics::new(vec![IpFamily::V4]);
    metrics.health_answered(false, 200);
    metrics.health_answered(true, 200);
    let mut registry = prometheus_client::registry::Registry::with_prefix("kubeproxy");
    metrics.register(&mut registry, ProxyMode::Ebpf);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let strip = |name: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name)
            .to_owned()
    };
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| strip(l.split(['{', ' ']).next().unwrap()))
        .chain(sample_names())
        .collect()
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every YAML document of a file.
fn documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("expected a string at {key:?} in {v:?}"))
}

fn seq_at<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_sequence().map(Vec::as_slice).unwrap_or_default()
}

/// The `resources` of deploy/kustomization.yaml, as listed.
fn kustomization_resources() -> Vec<String> {
    let k = &documents(&deploy_dir().join("kustomization.yaml"))[0];
    seq_at(k, "resources")
        .iter()
        .map(|r| r.as_str().expect("a resource is a path").to_owned())
        .collect()
}

/// Every manifest deploy/ holds: the kustomization's resources and the one-off
/// manifests under rollback/.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = kustomization_resources()
        .iter()
        .map(|r| deploy_dir().join(r))
        .collect();
    let rollback = deploy_dir().join("rollback");
    let mut extra: Vec<PathBuf> = std::fs::read_dir(&rollback)
        .unwrap_or_else(|e| panic!("reading {}: {e}", rollback.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    extra.sort();
    files.extend(extra);
    files
}

/// The one object of `kind` among the kustomization's resources.
fn resource(kind: &str) -> Value {
    let mut found: Vec<Value> = kustomization_resources()
        .iter()
        .flat_map(|r| documents(&deploy_dir().join(r)))
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} in deploy/");
    found.remove(0)
}

// --- 1. The Kubernetes schemas -------------------------------------------------

/// Where `cargo xtask setup` installs the validator (xtask/src/setup.rs), unless
/// `KUBERNETES_VALIDATE` names another.
fn validator() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBERNETES_VALIDATE") {
        return PathBuf::from(path);
    }
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/root/.local/share"))
        .join("kube-ebpf-proxy/kubernetes-validate/bin/kubernetes-validate")
}

/// Strict validation (unknown fields are errors) of `files` against Kubernetes
/// `version`: the validator's output when every document passed. A document of a
/// kind the schemas do not know only gets a warning from the validator; here it
/// fails too.
fn validate(files: &[PathBuf], version: &str) -> Result<String, String> {
    let validator = validator();
    assert!(
        validator.is_file(),
        "the Kubernetes schema validator is missing ({}): run `cargo xtask setup`",
        validator.display()
    );
    let out = Command::new(&validator)
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", validator.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let documents: usize = files.iter().map(|f| documents(f).len()).sum();
    let passed = text
        .lines()
        .filter(|l| l.contains("passed for resource"))
        .count();
    let complaints = text
        .lines()
        .any(|l| l.starts_with("ERROR") || l.starts_with("WARN"));
    if out.status.success() && !complaints && passed == documents {
        Ok(text)
    } else {
        Err(format!(
            "{} against Kubernetes {version}: {} (exit status), {passed} of {documents} documents passed:\n{text}",
            validator.display(),
            out.status
        ))
    }
}

#[test]
fn every_manifest_is_valid_against_the_kubernetes_schemas() {
    let files = manifest_files();
    assert!(files.len() >= 5, "{files:?}");
    for version in KUBERNETES_VERSIONS {
        if let Err(e) = validate(&files, version) {
            panic!("{e}");
        }
    }
}

/// A copy of `file` with the first `from` replaced by `to` (which must change it).
fn mutated(dir: &TempDir, file: &str, from: &str, to: &str) -> PathBuf {
    let text = read(&deploy_dir().join(file));
    assert!(text.contains(from), "{file} has no {from:?} to mutate");
    dir.file(file, &text.replacen(from, to, 1))
}

#[test]
fn the_validator_rejects_a_misspelt_field_and_an_unknown_kind() {
    let dir = TempDir::new("deploy-mutated");
    let version = KUBERNETES_VERSIONS[0];
    // Deep inside the pod template: strictness reaches nested objects.
    let misspelt = mutated(&dir, "daemonset.yaml", "capabilities:", "capabilites:");
    let e = validate(&[misspelt], version).expect_err("a misspelt field must fail");
    assert!(e.contains("capabilites"), "{e}");
    let wrong_type = mutated(&dir, "rbac.yaml", "verbs: [list, watch]", "verbs: list");
    let e = validate(&[wrong_type], version).expect_err("a string for a list must fail");
    assert!(e.contains("ERROR"), "{e}");
    let unknown_kind = mutated(
        &dir,
        "serviceaccount.yaml",
        "kind: ServiceAccount",
        "kind: ServiceAcount",
    );
    let e = validate(&[unknown_kind], version).expect_err("an unknown kind must fail");
    assert!(e.contains("ServiceAcount"), "{e}");
}

// --- 2. The kustomization ------------------------------------------------------

#[test]
fn the_kustomization_lists_exactly_the_resource_files() {
    let listed = kustomization_resources();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(unique.len(), listed.len(), "listed twice: {listed:?}");
    let present: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| (n.ends_with(".yaml") || n.ends_with(".yml")) && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        unique, present,
        "kustomization.yaml resources vs. deploy/*.yaml"
    );
    let k = &documents(&deploy_dir().join("kustomization.yaml"))[0];
    assert_eq!(str_at(k, "namespace"), "kube-system");
    let images = seq_at(k, "images");
    let container_image =
        str_at(&pod_container(&daemonset_pod(), "kube-ebpf-proxy"), "image").to_owned();
    assert!(
        images.iter().any(|i| str_at(i, "name") == container_image),
        "the kustomization sets no image named {container_image:?}: {images:?}"
    );
}

// --- 3. The agent's own option parsing ------------------------------------------

const NODE_NAME: &str = "node-a";

fn daemonset_pod() -> Value {
    resource("DaemonSet")["spec"]["template"]["spec"].clone()
}

fn pod_container(pod: &Value, name: &str) -> Value {
    seq_at(pod, "containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name:?}"))
        .clone()
}

/// command + args, with `$(VAR)` references to the container's downward-API
/// variables substituted as the kubelet does.
fn command_line(container: &Value) -> Vec<String> {
    let mut vars = BTreeMap::new();
    for env in seq_at(container, "env") {
        if env["valueFrom"]["fieldRef"]["fieldPath"].as_str() == Some("spec.nodeName") {
            vars.insert(format!("$({})", str_at(env, "name")), NODE_NAME);
        }
    }
    seq_at(container, "command")
        .iter()
        .chain(seq_at(container, "args"))
        .map(|a| {
            let mut arg = a.as_str().expect("arguments are strings").to_owned();
            for (var, value) in &vars {
                arg = arg.replace(var.as_str(), value);
            }
            assert!(!arg.contains("$("), "unresolved variable in {arg:?}");
            arg
        })
        .collect()
}

/// The files of a ConfigMap volume laid out in `dir` as the kubelet would (its
/// data keys, or its `items`), and where the container mounts that volume.
fn lay_out_config_map(pod: &Value, container: &Value, config_map: &Value, dir: &Path) -> String {
    let name = str_at(&config_map["metadata"], "name");
    let volume = seq_at(pod, "volumes")
        .iter()
        .find(|v| v["configMap"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no volume of ConfigMap {name}"));
    let mount = seq_at(container, "volumeMounts")
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("the container does not mount ConfigMap {name}"));
    let data = config_map["data"].as_mapping().expect("ConfigMap data");
    let items = seq_at(&volume["configMap"], "items");
    let files: Vec<(&str, &str)> = if items.is_empty() {
        data.iter()
            .map(|(k, _)| (k.as_str().unwrap(), k.as_str().unwrap()))
            .collect()
    } else {
        items
            .iter()
            .map(|i| (str_at(i, "key"), str_at(i, "path")))
            .collect()
    };
    for (key, path) in files {
        let content = data[key]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap key {key}"));
        std::fs::write(dir.join(path), content).unwrap();
    }
    str_at(mount, "mountPath").trim_end_matches('/').to_owned()
}

/// The container's mount path of the hostPath volume of `host_path`.
fn host_path_mount(pod: &Value, container: &Value, host_path: &str) -> String {
    let volume = seq_at(pod, "volumes")
        .iter()
        .find(|v| v["hostPath"]["path"].as_str() == Some(host_path))
        .unwrap_or_else(|| panic!("no hostPath volume of {host_path}"));
    let mount = seq_at(container, "volumeMounts")
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("the container does not mount {host_path}"));
    str_at(mount, "mountPath").to_owned()
}

/// Runs the agent's option processing (what `startup::prepare` does before it
/// touches the node) on `container`'s command line, its ConfigMap files read from
/// a temporary directory.
fn parse_container(pod: &Value, container: &Value, dir: &TempDir) -> (ProxyOptions, String) {
    let mount = lay_out_config_map(pod, container, &resource("ConfigMap"), dir.path());
    let args: Vec<String> = command_line(container)
        .into_iter()
        .map(|a| a.replace(&format!("{mount}/"), &format!("{}/", dir.path().display())))
        .collect();
    let support = FixedSupport {
        supported: vec![ProxyMode::Ebpf],
    };
    let env = Environment {
        support: &support,
        hostname: Some("kernel-hostname".into()),
    };
    match parse(args.clone(), &env) {
        Ok(Parsed::Run(o)) => {
            o.check_mode_supported(&support)
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            (*o, mount)
        }
        Ok(other) => panic!("{args:?} asked for {other:?}, not a run"),
        Err(e) => panic!("the agent refuses {args:?}: {e}"),
    }
}

fn port_of(address: &str) -> u64 {
    address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {address:?}"))
}

/// A probe's port: a number, or the name of one of the container's ports.
fn probe_port(container: &Value, probe: &str) -> (String, u64) {
    let get = &container[probe]["httpGet"];
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => seq_at(container, "ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("{probe}: no port named {name}")),
        other => panic!("{probe}: port {other:?}"),
    };
    (str_at(get, "path").to_owned(), port)
}

fn container_port(container: &Value, name: &str) -> u64 {
    seq_at(container, "ports")
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

#[test]
fn the_daemonset_command_line_and_config_map_are_accepted_by_the_agent() {
    let pod = daemonset_pod();
    let container = pod_container(&pod, "kube-ebpf-proxy");
    let dir = TempDir::new("deploy-daemonset");
    let (o, mount) = parse_container(&pod, &container, &dir);

    assert_eq!(o.mode, ProxyMode::Ebpf);
    assert!(o.mode_choice.is_none(), "the mode is set explicitly");
    assert_eq!(o.node_name, NODE_NAME);
    assert_eq!(o.config_file, Some(dir.path().join("config.conf")));
    assert_eq!(o.ebpf_config_file, Some(dir.path().join("ebpf.conf")));
    assert!(!o.cleanup && !o.init_only);
    assert_eq!(o.config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(o.config.metrics_bind_address, "0.0.0.0:10249");
    assert_eq!(o.sync_period().to_string(), "30s");

    // The start-up checks that need no Node find nothing fatal.
    let findings = checks::run(&o.config, &NodeFacts::at_startup(o.mode));
    assert!(findings.fatal.is_none(), "{:?}", findings.fatal);

    // The socket hooks attach to the host's cgroup v2 root, where it is mounted;
    // the pins live on the host's bpffs.
    let cgroup = host_path_mount(&pod, &container, "/sys/fs/cgroup");
    assert_eq!(o.ebpf.socket_lb.cgroup_path, cgroup);
    assert!(o.ebpf.socket_lb_enabled());
    let bpffs = host_path_mount(&pod, &container, "/sys/fs/bpf");
    assert!(
        Path::new(&o.ebpf.pinning.root).starts_with(&bpffs),
        "{} is not on the bpffs mount {bpffs}",
        o.ebpf.pinning.root
    );
    assert!(!o.ebpf.pinning.detach_on_exit);
    // The names for `inspect` go to a host directory (the root filesystem is read-only).
    let state = host_path_mount(&pod, &container, "/run/kube-ebpf-proxy");
    assert_eq!(o.ebpf.pinning.state_dir, state);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // The probes ask the health server, the ports are the servers'.
    let healthz = port_of(&o.config.healthz_bind_address);
    assert_eq!(
        probe_port(&container, "livenessProbe"),
        ("/livez".into(), healthz)
    );
    assert_eq!(
        probe_port(&container, "readinessProbe"),
        ("/healthz".into(), healthz)
    );
    assert_eq!(container_port(&container, "healthz"), healthz);
    assert_eq!(
        container_port(&container, "metrics"),
        port_of(&o.config.metrics_bind_address)
    );

    // The kubeconfig the config names is a key of the same ConfigMap, and it
    // authenticates with the pod's service account.
    let kubeconfig = Path::new(&o.config.client_connection.kubeconfig);
    let key = kubeconfig.strip_prefix(&mount).unwrap_or_else(|_| {
        panic!(
            "{} is not in the ConfigMap mount {mount}",
            kubeconfig.display()
        )
    });
    let parsed = kube::config::Kubeconfig::read_from(dir.path().join(key))
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        Some(format!("{sa}/ca.crt").as_str())
    );
    let server = cluster.server.as_deref().unwrap();
    assert!(server.starts_with("https://"), "{server}");
    let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(
        user.token_file.as_deref(),
        Some(format!("{sa}/token").as_str())
    );
    assert_ne!(pod["automountServiceAccountToken"], Value::Bool(false));
    assert_eq!(
        str_at(&pod, "serviceAccountName"),
        str_at(&resource("ServiceAccount")["metadata"], "name")
    );
}

#[test]
fn the_rollback_cleanup_pod_is_accepted_by_the_agent() {
    let cleanup = &documents(&deploy_dir().join("rollback/cleanup-pod.yaml"))[0];
    let pod = &cleanup["spec"];
    let container = pod_container(pod, "cleanup");
    let dir = TempDir::new("deploy-cleanup");
    let (o, _) = parse_container(pod, &container, &dir);
    assert!(o.cleanup);
    // It removes the pins where the DaemonSet's agent puts them.
    let daemonset = daemonset_pod();
    let agent = pod_container(&daemonset, "kube-ebpf-proxy");
    let (running, _) = parse_container(&daemonset, &agent, &TempDir::new("deploy-agent"));
    assert_eq!(o.ebpf.pinning.root, running.ebpf.pinning.root);
    assert_eq!(
        host_path_mount(pod, &container, "/sys/fs/bpf"),
        host_path_mount(&daemonset, &agent, "/sys/fs/bpf")
    );
}

// --- 4. The Grafana dashboard ----------------------------------------------------

fn dashboard() -> serde_json::Value {
    let path = deploy_dir().join("grafana/kube-ebpf-proxy.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every PromQL expression of the dashboard: panel targets and variable queries.
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        ("query", serde_json::Value::String(s)) if s.contains('(') => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard(), &mut out);
    out.into_iter()
        .map(|e| grafana_selector(&e).to_owned())
        .collect()
}

/// Grafana's `label_values(SELECTOR, LABEL)` variable query: its PromQL part.
fn grafana_selector(query: &str) -> &str {
    query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|inner| inner.strip_suffix(')'))
        .and_then(|inner| inner.rsplit_once(','))
        .map_or(query, |(selector, _label)| selector)
}

const PROMQL_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// Aggregation operators, which may take `by (...)` before their parentheses.
const PROMQL_AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression selects: identifiers that are not
/// functions, aggregations, keywords, label names or label values.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // After `by`/`without`/`on`/`ignoring`/`group_*`, a parenthesised label list.
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '{' || c == '[' {
            let close = if c == '{' { '}' } else { ']' };
            while i < chars.len() && chars[i] != close {
                if chars[i] == '"' {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        i += if chars[i] == '\\' { 2 } else { 1 };
                    }
                }
                i += 1;
            }
            i += 1;
        } else if c == '(' && label_list_next {
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
            label_list_next = false;
        } else if c.is_ascii_digit() {
            // A number or a duration (0.99, 5m, 1e3).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let called = chars.get(j) == Some(&'(');
            let lower = word.to_ascii_lowercase();
            let keyword = PROMQL_KEYWORDS.contains(&lower.as_str());
            let aggregation = PROMQL_AGGREGATIONS.contains(&lower.as_str());
            label_list_next = keyword && called;
            // Grafana variables outside brackets ($instance in a label matcher and
            // $__rate_interval in a range are skipped with them).
            let variable = start > 0 && chars[start - 1] == '$';
            if !called && !keyword && !aggregation && !variable {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every metric name the dashboard's expressions use, histogram series suffixes
/// (`_bucket`, `_sum`, `_count`) stripped.
pub fn dashboard_metric_names() -> BTreeSet<String> {
    dashboard_exprs()
        .iter()
        .flat_map(|e| promql_metric_names(e))
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(&n)
                .to_owned()
        })
        .collect()
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = promql_metric_names(
        r#"histogram_quantile(0.99, sum by (le, instance) (rate(a_seconds_bucket{instance=~"$instance", x="b{c}"}[$__rate_interval]))) / on(instance) group_left max without (map) (b_total offset 5m) > bool 0.5 and c"#,
    );
    assert_eq!(
        names,
        ["a_seconds_bucket", "b_total", "c"]
            .map(String::from)
            .into()
    );
}

#[test]
fn the_dashboard_uses_only_known_metrics() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{} expressions", exprs.len());
    let used = dashboard_metric_names();
    let known = known_metrics();
    assert!(known.contains("kubeproxy_sync_proxy_rules_service_changes_total"));
    let unknown: Vec<&String> = used.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard uses unknown metrics: {unknown:?}"
    );
    // It covers sync latency, hang detection, health, and the datapath.
    for needed in [
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_network_programming_duration_seconds",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "kubeproxy_proxy_healthz_total",
        "kubeproxy_ebpf_datapath_events_total",
        "kubeproxy_ebpf_map_entries",
        "kubeproxy_ebpf_map_capacity",
    ] {
        assert!(used.contains(needed), "no panel uses {needed}");
    }
}

/// `label="value"` and `label=~"a|b.*"` selections of `label` in an expression.
fn label_selections(expr: &str, label: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for (at, _) in expr.match_indices(label) {
        let rest = &expr[at + label.len()..];
        let (regex, rest) = match rest.strip_prefix("=~\"") {
            Some(r) => (true, r),
            None => match rest.strip_prefix("=\"") {
                Some(r) => (false, r),
                None => continue,
            },
        };
        if let Some(end) = rest.find('"') {
            out.push((regex, rest[..end].to_owned()));
        }
    }
    out
}

/// Whether a PromQL regex alternative (only `x`, `x.*` and `(?i)x` are used)
/// matches `name`.
fn alternative_matches(alternative: &str, name: &str) -> bool {
    if let Some(insensitive) = alternative.strip_prefix("(?i)") {
        return insensitive.eq_ignore_ascii_case(name);
    }
    match alternative.strip_suffix(".*") {
        Some(prefix) => name.starts_with(prefix),
        None => alternative == name,
    }
}

#[test]
fn the_dashboards_event_and_map_labels_name_real_counters_and_maps() {
    use proxy_common::{maps, stats::Counter};
    let counters: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
    let map_names = [
        maps::SERVICES,
        maps::BACKENDS,
        maps::CONNTRACK,
        maps::STATS,
        maps::CONFIG,
        maps::IFACES,
        maps::LOCAL_POD_CIDRS,
        maps::SOURCE_RANGES,
        maps::SOCKETS,
    ];
    let mut checked = 0;
    for expr in dashboard_exprs() {
        for (label, known) in [("event", &counters[..]), ("map", &map_names[..])] {
            for (regex, value) in label_selections(&expr, label) {
                let alternatives: Vec<&str> = if regex {
                    value.split('|').collect()
                } else {
                    vec![value.as_str()]
                };
                for alternative in alternatives {
                    assert!(
                        known.iter().any(|k| alternative_matches(alternative, k)),
                        "{label} {alternative:?} matches none of {known:?} in {expr}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 15, "only {checked} label selections checked");
}
