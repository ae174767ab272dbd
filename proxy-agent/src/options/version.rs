//! `--version`, `--version=raw`, `--version=vX.Y.Z` (component-base verflag semantics).

use super::validate::{COMPAT_MAJOR, COMPAT_MINOR};

/// The kube-proxy version whose flags and config we reproduce.
pub fn compat_version() -> String {
    format!("v{COMPAT_MAJOR}.{COMPAT_MINOR}.0")
}

/// What `--version[=value]` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionRequest {
    None,
    Print,
    Raw,
    /// `--version=vX.Y.Z`: report this version and keep running.
    Override(String),
}

pub fn request(value: Option<&str>) -> VersionRequest {
    match value {
        None => VersionRequest::None,
        Some("raw") => VersionRequest::Raw,
        Some(v) if v.starts_with('v') => VersionRequest::Override(v.to_string()),
        Some(v) => match super::features::parse_go_bool(v) {
            Some(true) => VersionRequest::Print,
            _ => VersionRequest::None,
        },
    }
}

/// `--version` output: `Kubernetes vX.Y.Z` as upstream prints, then our own version.
pub fn short(reported: &str) -> String {
    format!(
        "Kubernetes {reported} (kube-ebpf-proxy {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// `--version=raw`: every detail, one field per key.
pub fn raw(reported: &str) -> String {
    let minor = reported
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .unwrap_or("")
        .to_string();
    let major = reported
        .trim_start_matches('v')
        .split('.')
        .next()
        .unwrap_or("")
        .to_string();
    format!(
        "version.Info{{Major:{major:?}, Minor:{minor:?}, GitVersion:{reported:?}, Implementation:\"kube-ebpf-proxy\", \
         ImplementationVersion:{:?}, Compiler:\"rustc\", Platform:\"{}/{}\"}}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }
    )
}
