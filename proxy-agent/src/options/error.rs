//! Errors of the options layer. Each is one line of text (what the operator sees before the
//! process exits 1) and carries the structured pieces for callers and tests.

use std::fmt;
use std::path::PathBuf;

/// One field problem, formatted like Kubernetes' `field.Error`:
/// `<path>: Invalid value: <value>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path in the v1alpha1 file, e.g. `iptables.masqueradeBit` or `nodePortAddresses[1]`.
    pub path: String,
    pub kind: FieldErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `value` is already rendered (strings quoted).
    Invalid {
        value: String,
        detail: String,
    },
    NotSupported {
        value: String,
        supported: Vec<String>,
    },
    Forbidden {
        detail: String,
    },
}

impl FieldError {
    pub fn invalid(
        path: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Invalid {
                value: value.into(),
                detail: detail.into(),
            },
        }
    }
    /// Shorthand for a string value, quoted as Go's `%q` would.
    pub fn invalid_str(path: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self::invalid(path, format!("{value:?}"), detail)
    }
    pub fn not_supported(path: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::NotSupported {
                value: format!("{value:?}"),
                supported: supported.iter().map(|s| s.to_string()).collect(),
            },
        }
    }
    pub fn forbidden(path: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Forbidden {
                detail: detail.into(),
            },
        }
    }
    /// The detail text alone (without path and value).
    pub fn detail(&self) -> String {
        match &self.kind {
            FieldErrorKind::Invalid { detail, .. } | FieldErrorKind::Forbidden { detail } => {
                detail.clone()
            }
            FieldErrorKind::NotSupported { supported, .. } => supported_list(supported),
        }
    }
}

fn supported_list(supported: &[String]) -> String {
    let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    format!("supported values: {}", quoted.join(", "))
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FieldErrorKind::Invalid { value, detail } => {
                write!(f, "{}: Invalid value: {value}: {detail}", self.path)
            }
            FieldErrorKind::NotSupported { value, supported } => {
                write!(
                    f,
                    "{}: Unsupported value: {value}: {}",
                    self.path,
                    supported_list(supported)
                )
            }
            FieldErrorKind::Forbidden { detail } => write!(f, "{}: Forbidden: {detail}", self.path),
        }
    }
}

/// A list of field errors, printed as Kubernetes' aggregate: one error alone, or `[a, b]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn paths(&self) -> Vec<&str> {
        self.0.iter().map(|e| e.path.as_str()).collect()
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                let parts: Vec<String> = many.iter().map(|e| e.to_string()).collect();
                write!(f, "[{}]", parts.join(", "))
            }
        }
    }
}

/// ` (did you mean "x"?)` for a suggestion, nothing without one.
pub(crate) fn did_you_mean(suggestion: &Option<String>) -> String {
    suggestion
        .as_ref()
        .map(|s| format!(" (did you mean {s:?}?)"))
        .unwrap_or_default()
}

/// Which configuration document an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Document {
    /// `--config`: the upstream KubeProxyConfiguration.
    KubeProxy,
    /// `--ebpf-config`: our EbpfDatapathConfiguration extension.
    Ebpf,
}

impl fmt::Display for Document {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Document::KubeProxy => "config file",
            Document::Ebpf => "ebpf config file",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// Bad command line: unknown flag, malformed value, missing value.
    #[error("{message}")]
    Flag {
        flag: Option<String>,
        message: String,
    },

    #[error("{program:?} does not take any arguments, got {args:?}")]
    UnexpectedArgs { program: String, args: Vec<String> },

    #[error("failed to read {doc} {path:?}: {source}")]
    ReadFile {
        doc: Document,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// YAML/JSON syntax or type error.
    #[error("failed to decode {doc} {path:?}: {message}")]
    Decode {
        doc: Document,
        path: PathBuf,
        message: String,
    },

    #[error(
        "unknown field {field:?} in {doc} {path:?}{}",
        did_you_mean(suggestion)
    )]
    UnknownField {
        doc: Document,
        path: PathBuf,
        field: String,
        suggestion: Option<String>,
    },

    #[error(
        "failed to decode {doc} {path:?}: no kind {kind:?} is registered for version {api_version:?}"
    )]
    WrongKind {
        doc: Document,
        path: PathBuf,
        api_version: String,
        kind: String,
    },

    #[error("failed to decode {doc} {path:?}: Object 'Kind' is missing")]
    MissingKind { doc: Document, path: PathBuf },

    #[error("failed to decode {doc} {path:?}: Object 'apiVersion' is missing")]
    MissingVersion { doc: Document, path: PathBuf },

    #[error("failed validate: {0}")]
    Validation(FieldErrors),

    #[error("invalid eBPF datapath configuration: {0}")]
    EbpfValidation(FieldErrors),

    #[error("empty hostname-override is invalid")]
    EmptyHostnameOverride,

    #[error("couldn't determine hostname: {0}")]
    Hostname(String),

    #[error("can't use the {mode} proxier: {reason}")]
    ModeUnsupported { mode: String, reason: String },

    #[error("failed to write config to {path:?}: {source}")]
    WriteConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl OptionsError {
    pub fn flag(flag: impl Into<String>, message: impl Into<String>) -> Self {
        OptionsError::Flag {
            flag: Some(flag.into()),
            message: message.into(),
        }
    }

    /// The field errors, when this is a validation failure.
    pub fn field_errors(&self) -> Option<&FieldErrors> {
        match self {
            OptionsError::Validation(e) | OptionsError::EbpfValidation(e) => Some(e),
            _ => None,
        }
    }
}
