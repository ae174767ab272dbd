//! Decoding of configuration documents (YAML or JSON; JSON is read as YAML).
//!
//! Order: YAML syntax -> `apiVersion`/`kind` -> fields upstream removed (warned about and
//! dropped, so old ConfigMaps such as seed 004 still load) -> unknown and duplicate fields ->
//! typed decode (type errors name the path and the file, and are fatal).
//!
//! A `KubeProxyConfiguration` is decoded as upstream decodes it: strictly first, and when that
//! fails only on unknown or duplicate fields, leniently, with the warning "Using lenient
//! decoding as strict decoding failed". Unknown fields are then ignored and of a field given
//! twice the last value is used, so that a ConfigMap written for a newer kube-proxy (or with a
//! stray key) does not crash-loop the agent on upgrade. The one warning names the file and
//! every such field by its full path, with a spelling suggestion where one is close.
//!
//! Our own `EbpfDatapathConfiguration` ([`DocSpec::strict`]) stays strict: no version of it
//! has fields this one does not know, so an unknown field is a typo, and a typo silently
//! falling back to the default is how nodes end up misconfigured. Its unknown and duplicate
//! fields are errors.

use std::fmt;
use std::path::Path;

use serde::Serialize;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};
use serde_yaml::value::{Tag, TaggedValue};
use serde_yaml::{Mapping, Value};

use super::error::{Document, OptionsError, did_you_mean};

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
    /// Unknown and duplicate fields are errors. Without it (upstream's documents) they are
    /// warned about: unknown fields are ignored, and a duplicate field's last value is used.
    pub strict: bool,
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
    let (mut value, duplicates) = if spec.strict {
        let value = serde_yaml::from_str(text).map_err(|e| decode_err(e.to_string()))?;
        (value, Vec::new())
    } else {
        last_wins(text).map_err(|e| decode_err(e.to_string()))?
    };
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
    // Upstream's order: a missing kind first, then a missing version, then the pair.
    if api_version.is_empty() {
        return Err(OptionsError::MissingVersion {
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

    let unknown = prune_unknown(&mut value, &spec.schema, "", spec.free_maps);
    if spec.strict {
        if let Some((field, suggestion)) = unknown.into_iter().next() {
            return Err(OptionsError::UnknownField {
                doc,
                path: path.to_path_buf(),
                field,
                suggestion,
            });
        }
    } else if !unknown.is_empty() || !duplicates.is_empty() {
        warnings.push(lenient_warning(doc, path, &unknown, &duplicates));
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

/// Upstream's warning for a document that decoded only leniently, in one line: the file, then
/// every unknown field (with a suggestion) and every duplicate field by its full path.
fn lenient_warning(
    doc: Document,
    path: &Path,
    unknown: &[(String, Option<String>)],
    duplicates: &[String],
) -> String {
    let problems: Vec<String> = unknown
        .iter()
        .map(|(field, suggestion)| format!("unknown field {field:?}{}", did_you_mean(suggestion)))
        .chain(duplicates.iter().map(|f| format!("duplicate field {f:?}")))
        .collect();
    format!(
        "Using lenient decoding as strict decoding failed: {doc} {path:?}: strict decoding error: {}; \
         unknown fields are ignored and a duplicate field's last value is used",
        problems.join(", ")
    )
}

/// How a mapping key is named in a field path.
fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

/// Removes every field of `value` that `schema` does not know and returns them, depth-first in
/// file order: the full path, and the known field of that mapping spelled closest, if any.
fn prune_unknown(
    value: &mut Value,
    schema: &Value,
    prefix: &str,
    free: &[&str],
) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    match (value, schema) {
        (Value::Mapping(m), Value::Mapping(s)) if !free.contains(&prefix) => {
            m.retain(|k, v| {
                let key = key_text(k);
                let path = join(prefix, &key);
                match s.get(key.as_str()) {
                    Some(sub) => {
                        found.extend(prune_unknown(v, sub, &path, free));
                        true
                    }
                    None => {
                        let suggestion = s
                            .keys()
                            .filter_map(Value::as_str)
                            .map(|cand| (strsim_like(&key, cand), cand))
                            .filter(|(d, _)| *d <= 3)
                            .min_by_key(|(d, _)| *d)
                            .map(|(_, c)| join(prefix, c));
                        found.push((path, suggestion));
                        false
                    }
                }
            });
        }
        (Value::Sequence(items), Value::Sequence(s)) => {
            if let Some(elem) = s.first() {
                for (i, v) in items.iter_mut().enumerate() {
                    found.extend(prune_unknown(v, elem, &format!("{prefix}[{i}]"), free));
                }
            }
        }
        _ => {}
    }
    found
}

/// Parses `text` as a non-strict decoder reads it: of a key given twice in one mapping the
/// last value is used. Returns the value and the full paths of such keys, in file order.
/// Syntax errors are serde_yaml's, as with `serde_yaml::from_str`.
fn last_wins(text: &str) -> Result<(Value, Vec<String>), serde_yaml::Error> {
    let mut duplicates = Vec::new();
    let value = LastWins {
        path: String::new(),
        duplicates: &mut duplicates,
    }
    .deserialize(serde_yaml::Deserializer::from_str(text))?;
    Ok((value, duplicates))
}

/// Builds a [`Value`] like serde_yaml's own `Deserialize`, except that a duplicate mapping key
/// replaces the earlier value (and is recorded) instead of failing.
struct LastWins<'a> {
    /// The path of the value being built.
    path: String,
    duplicates: &'a mut Vec<String>,
}

impl LastWins<'_> {
    fn at(&mut self, path: String) -> LastWins<'_> {
        LastWins {
            path,
            duplicates: self.duplicates,
        }
    }
}

impl<'de> DeserializeSeed<'de> for LastWins<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LastWins<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(i.into()))
    }
    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(u.into()))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Number(f.into()))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, items.len());
            match seq.next_element_seed(self.at(path))? {
                Some(item) => items.push(item),
                None => return Ok(Value::Sequence(items)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Mapping::new();
        while let Some(key) = map.next_key::<Value>()? {
            let path = join(&self.path, &key_text(&key));
            let value = map.next_value_seed(self.at(path.clone()))?;
            if out.insert(key, value).is_some() {
                self.duplicates.push(path);
            }
        }
        Ok(Value::Mapping(out))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        // A tagged value (`!tag x`), kept as serde_yaml keeps it.
        let (tag, contents) = data.variant::<String>()?;
        let value = contents.newtype_variant_seed(self)?;
        Ok(Value::Tagged(Box::new(TaggedValue {
            tag: Tag::new(tag),
            value,
        })))
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
    fn last_wins_reads_what_serde_yaml_reads_and_keeps_the_last_duplicate() {
        for text in [
            "a: 1\nb: [x, {c: null, d: 2.5}]\ne: !t 3\nf: ~\ng: true\n",
            "{\"a\": {\"b\": [1, -2]}, \"c\": \"s\"}",
            "",
            "- 1\n- 2\n",
        ] {
            let strict: Value = serde_yaml::from_str(text).unwrap();
            assert_eq!(last_wins(text).unwrap(), (strict, vec![]), "{text:?}");
        }
        for text in ["a: [\n", "a: 1\n---\nb: 2\n", "a: ::\n"] {
            assert_eq!(
                last_wins(text).unwrap_err().to_string(),
                serde_yaml::from_str::<Value>(text).unwrap_err().to_string(),
                "{text:?}"
            );
        }
        let (v, dups) = last_wins("a: 1\nb:\n  c: 1\n  c: 2\nl:\n- {x: 1, x: 3}\na: 4\n").unwrap();
        assert_eq!(
            v,
            serde_yaml::from_str::<Value>("a: 4\nb: {c: 2}\nl: [{x: 3}]\n").unwrap()
        );
        assert_eq!(dups, ["b.c", "l[0].x", "a"]);
    }

    #[test]
    fn distance() {
        assert_eq!(strsim_like("masqueradeBitt", "masqueradeBit"), 1);
        assert_eq!(strsim_like("MODE", "mode"), 0);
        assert_eq!(strsim_like("abc", "xyz"), 3);
    }
}
