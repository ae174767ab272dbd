//! Strict decoding of configuration documents (YAML or JSON; JSON is read as YAML).
//!
//! Order: YAML syntax -> `apiVersion`/`kind` -> fields upstream removed (warned about and
//! dropped, so old ConfigMaps such as seed 004 still load) -> unknown fields (an error naming
//! the full path and the file, with a spelling suggestion) -> typed decode (type errors name
//! the path too).
//!
//! Deviation from upstream, on purpose: upstream falls back to a lenient decode with only a
//! warning when a field is unknown; we refuse, because a misspelled field silently falling back
//! to its default is how nodes end up misconfigured. Fields upstream *removed* are still
//! accepted with a warning.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

use super::error::{Document, OptionsError};

/// Static description of one document kind.
pub struct DocSpec<'a> {
    pub doc: Document,
    pub api_version: &'a str,
    pub kind: &'a str,
    /// A fully populated instance: its serialised keys are the set of known fields.
    pub schema: Value,
    /// Paths whose mapping keys are free-form (e.g. `featureGates`).
    pub free_maps: &'a [&'a str],
    /// Paths upstream removed: accepted, warned about, ignored.
    pub removed: &'a [&'a str],
}

pub fn schema_of<T: Serialize>(example: &T) -> Value {
    serde_yaml::to_value(example).expect("config types always serialise")
}

/// Decodes `text` (the content of `path`) into `T`; returns warnings alongside.
pub fn decode<T: DeserializeOwned>(
    spec: &DocSpec<'_>,
    path: &Path,
    text: &str,
) -> Result<(T, Vec<String>), OptionsError> {
    let doc = spec.doc;
    let decode_err = |message: String| OptionsError::Decode {
        doc,
        path: path.to_path_buf(),
        message,
    };
    let mut value: Value = serde_yaml::from_str(text).map_err(|e| decode_err(e.to_string()))?;
    let Value::Mapping(map) = &mut value else {
        return Err(OptionsError::MissingKind {
            doc,
            path: path.to_path_buf(),
        });
    };
    let get_str = |m: &Mapping, k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    let kind = get_str(map, "kind").unwrap_or_default();
    let api_version = get_str(map, "apiVersion").unwrap_or_default();
    if kind.is_empty() {
        return Err(OptionsError::MissingKind {
            doc,
            path: path.to_path_buf(),
        });
    }
    if kind != spec.kind || api_version != spec.api_version {
        return Err(OptionsError::WrongKind {
            doc,
            path: path.to_path_buf(),
            api_version,
            kind,
        });
    }

    let mut warnings = Vec::new();
    for removed in spec.removed {
        if remove_path(map, removed) {
            warnings.push(format!(
                "{doc} {path:?}: field {removed:?} was removed from KubeProxyConfiguration upstream and is ignored"
            ));
        }
    }

    if let Some((field, suggestion)) = find_unknown(&value, &spec.schema, "", spec.free_maps) {
        return Err(OptionsError::UnknownField {
            doc,
            path: path.to_path_buf(),
            field,
            suggestion,
        });
    }

    let typed: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let p = e.path().to_string();
        decode_err(format!("{p}: {}", e.inner()))
    })?;
    Ok((typed, warnings))
}

fn remove_path(map: &mut Mapping, dotted: &str) -> bool {
    match dotted.split_once('.') {
        None => map.remove(dotted).is_some(),
        Some((head, rest)) => match map.get_mut(head) {
            Some(Value::Mapping(inner)) => remove_path(inner, rest),
            _ => false,
        },
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// First field of `value` (depth-first, in file order) that `schema` does not know.
fn find_unknown(
    value: &Value,
    schema: &Value,
    prefix: &str,
    free: &[&str],
) -> Option<(String, Option<String>)> {
    match (value, schema) {
        (Value::Mapping(m), Value::Mapping(s)) if !free.contains(&prefix) => {
            for (k, v) in m {
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                match s.get(key.as_str()) {
                    Some(sub) => {
                        if let Some(found) = find_unknown(v, sub, &join(prefix, &key), free) {
                            return Some(found);
                        }
                    }
                    None => {
                        let suggestion = s
                            .keys()
                            .filter_map(Value::as_str)
                            .map(|cand| (strsim_like(&key, cand), cand))
                            .filter(|(d, _)| *d <= 3)
                            .min_by_key(|(d, _)| *d)
                            .map(|(_, c)| join(prefix, c));
                        return Some((join(prefix, &key), suggestion));
                    }
                }
            }
            None
        }
        (Value::Sequence(items), Value::Sequence(s)) => {
            let elem = s.first()?;
            items
                .iter()
                .enumerate()
                .find_map(|(i, v)| find_unknown(v, elem, &format!("{prefix}[{i}]"), free))
        }
        _ => None,
    }
}

/// Case-insensitive Levenshtein distance, for "did you mean".
fn strsim_like(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(strsim_like("masqueradeBitt", "masqueradeBit"), 1);
        assert_eq!(strsim_like("MODE", "mode"), 0);
        assert_eq!(strsim_like("abc", "xyz"), 3);
    }
}
