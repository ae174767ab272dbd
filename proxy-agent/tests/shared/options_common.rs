//! Helpers shared by the options_* tests (the pure tier, and options_binary in the e2e tier).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxy_agent::options::file_watch::{ConfigFileChanged, ConfigWatch};
use proxy_agent::options::mode::FixedSupport;
use proxy_agent::options::{Environment, OptionsError, Parsed, ProxyMode, ProxyOptions, parse};

pub const HOSTNAME: &str = "Test-Node";

/// The agent binary this package builds.
pub const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");

/// Runs the agent binary with `args` (and no RUST_LOG): exit code, stdout, stderr.
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "options-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn support(modes: &[ProxyMode]) -> FixedSupport {
    FixedSupport {
        supported: modes.to_vec(),
    }
}

/// Parses with a node that supports only iptables (so a blank mode means iptables, as upstream).
pub fn try_parse(args: &[&str]) -> Result<Parsed, OptionsError> {
    try_parse_with(args, &[ProxyMode::Iptables])
}

pub fn try_parse_with(args: &[&str], modes: &[ProxyMode]) -> Result<Parsed, OptionsError> {
    let s = support(modes);
    let env = Environment {
        support: &s,
        hostname: Some(HOSTNAME.into()),
    };
    let mut all = vec!["kube-proxy"];
    all.extend_from_slice(args);
    parse(all, &env)
}

pub fn opts(args: &[&str]) -> ProxyOptions {
    opts_with(args, &[ProxyMode::Iptables])
}

pub fn opts_with(args: &[&str], modes: &[ProxyMode]) -> ProxyOptions {
    match try_parse_with(args, modes) {
        Ok(Parsed::Run(o)) => *o,
        Ok(other) => panic!("expected a run configuration for {args:?}, got {other:?}"),
        Err(e) => panic!("parsing {args:?} failed: {e}"),
    }
}

pub fn err(args: &[&str]) -> OptionsError {
    match try_parse(args) {
        Err(e) => e,
        Ok(p) => panic!("expected {args:?} to fail, got {p:?}"),
    }
}

/// A config file with the standard header and `body`.
pub fn config_file(dir: &TempDir, body: &str) -> String {
    let text = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"
    );
    dir.file("config.yaml", &text)
        .to_string_lossy()
        .into_owned()
}

/// Loads `body` as a --config file (iptables-only node) and returns the parse result.
pub fn parse_file(body: &str) -> Result<Parsed, OptionsError> {
    let dir = TempDir::new("file");
    let path = config_file(&dir, body);
    try_parse(&["--config", &path])
}

/// Value at a dotted path in the serialised config.
pub fn value_at(v: &serde_yaml::Value, path: &str) -> serde_yaml::Value {
    let mut cur = v.clone();
    for key in path.split('.') {
        cur = cur
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in path {path}"))
            .clone();
    }
    cur
}

/// Value at a dotted path, `None` when a key is absent (fields omitted when empty).
pub fn value_at_opt(v: &serde_yaml::Value, path: &str) -> Option<serde_yaml::Value> {
    let mut cur = v.clone();
    for key in path.split('.') {
        cur = cur.get(key)?.clone();
    }
    Some(cur)
}

/// Dotted paths of every leaf of a serialised document: scalars, sequences, empty mappings,
/// and the free-form `featureGates` map.
pub fn leaf_paths(v: &serde_yaml::Value) -> Vec<String> {
    fn walk(prefix: &str, v: &serde_yaml::Value, out: &mut Vec<String>) {
        match v {
            serde_yaml::Value::Mapping(m) if !m.is_empty() && prefix != "featureGates" => {
                for (k, sub) in m {
                    let k = k.as_str().expect("string keys");
                    let p = if prefix.is_empty() {
                        k.to_string()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, sub, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

// ----- the config file watch -----

/// The apiVersion and kind lines of a KubeProxyConfiguration.
pub const HEADER: &str =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// How long nothing must happen for "ignored" to hold.
pub const QUIET: Duration = Duration::from_millis(300);

/// `w` stays quiet for [`QUIET`].
pub async fn assert_quiet(w: &mut ConfigWatch, what: &str) {
    if let Ok(e) = tokio::time::timeout(QUIET, w.changed()).await {
        panic!("{what}: expected no exit, got {e:#}");
    }
}

/// `w` reports a change within 5 s, with upstream's text.
pub async fn assert_fires(w: &mut ConfigWatch, what: &str) -> ConfigFileChanged {
    let e = tokio::time::timeout(Duration::from_secs(5), w.changed())
        .await
        .unwrap_or_else(|_| panic!("{what}: the change was not noticed"));
    assert_eq!(
        e.to_string(),
        "content of the proxy server's configuration file was updated",
        "{what}: upstream's exact text"
    );
    e.downcast::<ConfigFileChanged>()
        .unwrap_or_else(|e| panic!("{what}: not a ConfigFileChanged: {e:#}"))
}

/// Writes `text` over `path`.
pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}
