//! `--write-config-to` / `--ebpf-write-config-to`: the fully defaulted document as YAML, keys
//! sorted like upstream's output, so that loading it back yields the identical configuration.

use std::path::Path;

use serde::Serialize;
use serde_yaml::{Mapping, Value};

use super::error::OptionsError;

fn sorted(v: Value) -> Value {
    match v {
        Value::Mapping(m) => {
            let mut entries: Vec<(Value, Value)> =
                m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.as_str().unwrap_or("").cmp(b.0.as_str().unwrap_or("")));
            Value::Mapping(entries.into_iter().collect::<Mapping>())
        }
        Value::Sequence(s) => Value::Sequence(s.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The YAML text for `doc`.
pub fn to_yaml<T: Serialize>(doc: &T) -> String {
    let v = serde_yaml::to_value(doc).expect("config types always serialise");
    serde_yaml::to_string(&sorted(v)).expect("a YAML value always serialises")
}

pub fn write_file<T: Serialize>(path: &Path, doc: &T) -> Result<(), OptionsError> {
    std::fs::write(path, to_yaml(doc)).map_err(|source| OptionsError::WriteConfig {
        path: path.to_path_buf(),
        source,
    })
}
