//! The standalone source: Service, EndpointSlice, Node and ServiceCIDR objects read from
//! YAML or JSON files in a directory (multi-document files and `kind: List`
//! allowed), validated as the API server would before anything is programmed.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    net::IpAddr,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::{
    api::{core::v1::Node, core::v1::Service, networking::v1::ServiceCIDR},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::{
    model::{NamespacedName, endpoint_slice::EndpointSlice},
    sources::SourceEvent,
};

mod one_pass;

/// The objects of one consistent read of the directory.
#[derive(Debug, Default, Clone)]
pub struct Manifests {
    /// Boxed as they were typed and as they are sent on: 100,000 objects
    /// of about a kilobyte moved twice cost 50 ms at a first listing.
    pub services: Vec<Box<Service>>,
    pub endpoint_slices: Vec<Box<EndpointSlice>>,
    pub nodes: Vec<Node>,
    pub service_cidrs: Vec<ServiceCIDR>,
    /// Each object's name and digest (taken where it was typed), by kind:
    /// what tells a name defined twice, and a file's [`Seen`].
    names: Names,
}

#[derive(Debug, Default, Clone)]
struct Names {
    services: BTreeMap<NamespacedName, u64>,
    slices: BTreeMap<NamespacedName, u64>,
    /// Cluster-scoped: by name.
    nodes: BTreeMap<String, u64>,
    cidrs: BTreeMap<String, u64>,
}

/// A rejected manifest: which file, which document in it, which field.
#[derive(Debug, thiserror::Error)]
pub struct ManifestError {
    pub file: PathBuf,
    /// 1-based index of the YAML document in the file, when known.
    pub document: Option<usize>,
    /// Dotted path of the offending field, e.g. `spec.ports[0].port`.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(doc) = self.document {
            write!(f, " (document {doc})")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A cheap fingerprint of the directory: names, sizes and modification times.
pub fn fingerprint(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64, SystemTime)>> {
    let mut out = Vec::new();
    for path in manifest_files(dir)? {
        let meta = fs::metadata(&path)?;
        out.push((path, meta.len(), meta.modified()?));
    }
    Ok(out)
}

fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let hidden = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            !hidden && p.is_file() && matches!(ext, "yaml" | "yml" | "json")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Reads and validates every manifest in `dir`; one bad object rejects the whole read.
pub fn load_dir(dir: &Path) -> Result<Manifests, ManifestError> {
    let files = manifest_files(dir).map_err(|e| ManifestError {
        file: dir.to_owned(),
        document: None,
        field: None,
        message: format!("cannot read the directory: {e}"),
    })?;
    let mut manifests = Manifests::default();
    for file in files {
        load_file(&file, &mut manifests)?;
    }
    Ok(manifests)
}

/// Adds `file`'s objects to `out`; a name `out` already holds is an error.
fn load_file(file: &Path, out: &mut Manifests) -> Result<(), ManifestError> {
    let err = |document: Option<usize>, field: Option<String>, message: String| ManifestError {
        file: file.to_owned(),
        document,
        field,
        message,
    };
    let text =
        fs::read_to_string(file).map_err(|e| err(None, None, format!("cannot read: {e}")))?;
    let is_json = file.extension().is_some_and(|e| e == "json");
    let mut keep = |document: usize, parsed: ParsedDocument| -> Result<(), ManifestError> {
        let objects = match parsed {
            Ok(Some(objects)) => objects,
            Ok(None) => return Ok(()), // an empty document, e.g. a trailing `---`
            Err(e) => return Err(err(Some(document), e.field, e.message)),
        };
        for (prefix, object, digest) in objects {
            remember(&mut out.names, &object, digest)
                .map_err(|m| err(Some(document), Some(format!("{prefix}metadata.name")), m))?;
            match object {
                // As the API source's label selector: not listed at all.
                Object::Service(svc) if !for_this_proxy(&svc.metadata) => {}
                Object::Slice(slice) if !for_this_proxy(&slice.metadata) => {}
                Object::Service(svc) => out.services.push(svc),
                Object::Slice(slice) => out.endpoint_slices.push(slice),
                Object::Node(node) => out.nodes.push(*node),
                Object::Cidr(cidr) => out.service_cidrs.push(*cidr),
            };
        }
        Ok(())
    };
    // JSON (what the API server sends) is read by serde_json, about twice
    // as fast as through the YAML parser; after a syntax error either
    // stream yields that error forever: the first error returns.
    if is_json {
        if let Some(heads) = json_heads(&text) {
            for (i, (head, raw)) in heads.into_iter().enumerate() {
                keep(i + 1, parse_json_head(head, raw))?;
            }
            return Ok(());
        }
        let stream = serde_json::Deserializer::from_str(&text).into_iter::<&RawValue>();
        for (i, doc) in stream.enumerate() {
            let parsed = doc
                .map_err(|e| DocumentError {
                    field: None,
                    message: format!("invalid JSON: {e}"),
                })
                .and_then(parse_json_document);
            keep(i + 1, parsed)?;
        }
    } else {
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            keep(i + 1, parse_document(doc))?;
        }
    }
    Ok(())
}

/// Whether a Service or EndpointSlice is this proxy's: upstream's informers
/// select `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
fn for_this_proxy(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_none_or(|labels| {
        !labels.contains_key(super::api::SERVICE_PROXY_NAME_LABEL)
            && !labels.contains_key(super::api::HEADLESS_LABEL)
    })
}

/// An object the proxy uses, typed and validated.
/// Boxed: a Node is kilobytes, and a document's objects are collected
/// before they are kept.
enum Object {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Node(Box<Node>),
    Cidr(Box<ServiceCIDR>),
}

impl Object {
    fn kind_and_meta(&self) -> (&'static str, &ObjectMeta) {
        match self {
            Object::Service(o) => ("Service", &o.metadata),
            Object::Slice(o) => ("EndpointSlice", &o.metadata),
            Object::Node(o) => ("Node", &o.metadata),
            Object::Cidr(o) => ("ServiceCIDR", &o.metadata),
        }
    }
}

/// Why a document was rejected (its number is the caller's to add).
struct DocumentError {
    field: Option<String>,
    message: String,
}

/// One document's objects, each with its field prefix in a `kind: List`
/// (`items[3].`) and its digest; `None` for an empty document.
type ParsedDocument = Result<Option<Vec<(String, Object, u64)>>, DocumentError>;

fn parse_document(doc: serde_yaml::Deserializer<'_>) -> ParsedDocument {
    let reject = |field: Option<String>, message: String| DocumentError { field, message };
    let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
        .map_err(|e| reject(None, format!("invalid YAML: {e}")))?;
    if value.is_null() {
        return Ok(None);
    }
    let head = |v: &serde_yaml::Value, field: &str| {
        v.get(field)
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let is_list = head(&value, "kind") == "List";
    let items = if is_list {
        value
            .get("items")
            .and_then(|i| i.as_sequence())
            .cloned()
            .unwrap_or_default()
    } else {
        vec![value]
    };
    let items = items.into_iter().map(|item| {
        let (api_version, kind) = (head(&item, "apiVersion"), head(&item, "kind"));
        Ok((api_version, kind, item))
    });
    objects_of(is_list, 0, items)
}

/// What a JSON document's top level says of it: only these fields are
/// decoded (the rest skipped) to choose the type the whole is read as.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(rename = "apiVersion", default, borrow)]
    api_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    items: Items<'a>,
}

/// A top-level `items`: each element's text when it is an array (a
/// `kind: List`'s items, found in the same pass that reads the head: a
/// first listing of 50,000 slices is a 57 MB list, and a pass over it takes
/// about 0.1 s), else nothing.
#[derive(Default)]
enum Items<'a> {
    #[default]
    Absent,
    Array(Vec<&'a RawValue>),
    Other(&'static str),
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Items<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Items<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(Items::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Items::Other("a map"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Items::Other("a string"))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Items::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Items::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Items::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Items::Other("a number"))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Items::Absent)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

fn head_of(raw: &RawValue) -> Result<Head<'_>, DocumentError> {
    serde_json::from_str(raw.get()).map_err(|e| DocumentError {
        field: None,
        message: format!("invalid JSON: {e}"),
    })
}

/// Every document's head with its text, read in the one pass that finds
/// where the documents end (a pass over a first listing's 53 MB of slices
/// took 63 ms here, before its items can be typed on several threads).
/// `None` on any error: the caller then reads the file document by
/// document, which names the document and says what is wrong with it.
fn json_heads(text: &str) -> Option<Vec<(Head<'_>, &str)>> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Head>();
    let mut heads = Vec::new();
    let mut end = 0;
    while let Some(head) = stream.next() {
        let head = head.ok()?;
        let start = end;
        end = stream.byte_offset();
        heads.push((head, text[start..end].trim()));
    }
    Some(heads)
}

fn parse_json_document(doc: &RawValue) -> ParsedDocument {
    parse_json_head(head_of(doc)?, doc.get())
}

/// A document read as its `head` says, `doc` being its text.
fn parse_json_head<'a>(top: Head<'a>, doc: &'a str) -> ParsedDocument {
    let is_list = top.kind.as_deref() == Some("List");
    let items: Vec<&RawValue> = match top.items {
        Items::Array(items) if is_list => items,
        Items::Other(what) if is_list => {
            return Err(DocumentError {
                field: Some("items".into()),
                message: format!("invalid type: {what}, expected a sequence"),
            });
        }
        _ if is_list => Vec::new(),
        _ => vec![
            serde_json::from_str::<&RawValue>(doc).map_err(|e| DocumentError {
                field: None,
                message: format!("invalid JSON: {e}"),
            })?,
        ],
    };
    let typed = |first: usize, items: &[&RawValue]| {
        // Each item read first as its predecessor's type (`one_pass`).
        let mut previous: Option<(String, String)> = None;
        let items = items.iter().map(move |item| {
            if let Some((api_version, kind)) = &previous
                && let Some(read) = one_pass::read(item.get(), api_version, kind)
            {
                let item = JsonItem {
                    text: item,
                    read: Some(read),
                };
                return Ok((api_version.clone(), kind.clone(), item));
            }
            let h = head_of(item)?;
            let text = |c: Option<std::borrow::Cow<'_, str>>| {
                c.map(|c| c.into_owned()).unwrap_or_default()
            };
            let (api_version, kind) = (text(h.api_version), text(h.kind));
            previous = Some((api_version.clone(), kind.clone()));
            let item = JsonItem {
                text: item,
                read: None,
            };
            Ok((api_version, kind, item))
        });
        objects_of(is_list, first, items)
    };
    let threads = match items.len() >= PARALLEL_ITEMS {
        true => std::thread::available_parallelism().map_or(1, |n| n.get()),
        false => 1,
    };
    if threads <= 1 {
        return typed(0, &items);
    }
    // A list's items typed on several threads, in chunks kept in order: the
    // first error is the one of the lowest item, as read one by one. Many
    // more chunks than threads, each thread taking the next when done: with
    // one chunk a thread, the thread that shared its core (with the other
    // file's reader or the verifier) finished up to 100 ms after the other.
    let chunk = items.len().div_ceil(threads * CHUNKS_PER_THREAD);
    let chunks: Vec<&[&RawValue]> = items.chunks(chunk).collect();
    let parts = in_order_on_threads(&chunks, threads, |i, part| typed(i * chunk, part));
    let mut objects = Vec::with_capacity(items.len());
    for part in parts {
        objects.extend(part?.unwrap_or_default());
    }
    Ok(Some(objects))
}

/// A list's chunks per thread.
const CHUNKS_PER_THREAD: usize = 16;

/// A `kind: List` this long is typed on several threads (a first listing
/// of 500,000 endpoints is a 50 MB list).
const PARALLEL_ITEMS: usize = 1024;

/// A document's item, read as the type its kind names.
trait Item {
    /// The digest of the item as written, when its text is at hand.
    fn text_digest(&self) -> Option<u64>;
    fn typed<T: DeserializeOwned + 'static>(self) -> Result<T, (Option<String>, String)>;
}

impl Item for serde_yaml::Value {
    fn text_digest(&self) -> Option<u64> {
        None
    }
    fn typed<T: DeserializeOwned + 'static>(self) -> Result<T, (Option<String>, String)> {
        serde_path_to_error::deserialize(self).map_err(path_error)
    }
}

struct JsonItem<'a> {
    text: &'a RawValue,
    /// The item already read, as the type its head names (`one_pass`).
    read: Option<Box<dyn std::any::Any + Send>>,
}

impl Item for JsonItem<'_> {
    /// The item's text: the same object written the same way hashes alike,
    /// which is all a re-read must tell (a reformatted object counts as
    /// changed, and changes nothing downstream).
    fn text_digest(&self) -> Option<u64> {
        Some(hash_bytes(self.text.get().as_bytes()))
    }
    /// Read without tracking the path first (a fifth faster), and again with
    /// it only when that fails, for the error to name the field.
    fn typed<T: DeserializeOwned + 'static>(self) -> Result<T, (Option<String>, String)> {
        if let Some(read) = self.read.and_then(|r| r.downcast::<T>().ok()) {
            return Ok(*read);
        }
        serde_json::from_str(self.text.get()).or_else(|_| {
            let mut de = serde_json::Deserializer::from_str(self.text.get());
            serde_path_to_error::deserialize(&mut de).map_err(path_error)
        })
    }
}

fn path_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> (Option<String>, String) {
    let path = e.path().to_string();
    (Some(path).filter(|p| p != "."), e.into_inner().to_string())
}

/// The objects the proxy uses among a document's items (apiVersion, kind,
/// item), each with its field prefix in a `kind: List` (`items[3].`).
fn objects_of<I: Item>(
    is_list: bool,
    first: usize,
    items: impl Iterator<Item = Result<(String, String, I), DocumentError>>,
) -> ParsedDocument {
    let reject = |field: Option<String>, message: String| DocumentError { field, message };
    let mut objects = Vec::new();
    for (j, item) in (first..).zip(items) {
        let (api_version, kind, item) = item?;
        let text_digest = item.text_digest();
        let prefix = if is_list {
            format!("items[{j}].")
        } else {
            String::new()
        };
        let in_doc = |field: Option<String>, message: String| {
            reject(field.map(|f| format!("{prefix}{f}")), message)
        };
        let (object, digest) = match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => {
                let svc: Service = item.typed().map_err(|(f, m)| in_doc(f, m))?;
                validate_service(&svc).map_err(|(f, m)| in_doc(Some(f), m))?;
                let d = text_digest.unwrap_or_else(|| digest(&svc));
                (Object::Service(Box::new(svc)), d)
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                let slice: EndpointSlice = item.typed().map_err(|(f, m)| in_doc(f, m))?;
                validate_slice(&slice).map_err(|(f, m)| in_doc(Some(f), m))?;
                let d = text_digest.unwrap_or_else(|| digest(&slice));
                (Object::Slice(Box::new(slice)), d)
            }
            ("v1", "Node") => {
                let node: Node = item.typed().map_err(|(f, m)| in_doc(f, m))?;
                let d = text_digest.unwrap_or_else(|| digest(&node));
                (Object::Node(Box::new(node)), d)
            }
            ("networking.k8s.io/v1", "ServiceCIDR") => {
                let cidr: ServiceCIDR = item.typed().map_err(|(f, m)| in_doc(f, m))?;
                validate_service_cidr(&cidr).map_err(|(f, m)| in_doc(Some(f), m))?;
                let d = text_digest.unwrap_or_else(|| digest(&cidr));
                (Object::Cidr(Box::new(cidr)), d)
            }
            ("", _) | (_, "") => {
                let field = if api_version.is_empty() {
                    "apiVersion"
                } else {
                    "kind"
                };
                return Err(in_doc(
                    Some(field.into()),
                    "missing; every object needs apiVersion and kind".into(),
                ));
            }
            _ => {
                tracing::debug!(%api_version, %kind, "ignoring an object the proxy does not use");
                continue;
            }
        };
        objects.push((prefix, object, digest));
    }
    Ok(Some(objects))
}

/// Records an object's name and digest under its kind.
fn remember(names: &mut Names, object: &Object, digest: u64) -> Result<(), String> {
    let (kind, meta) = object.kind_and_meta();
    let Some(name) = meta.name.as_deref().filter(|n| !n.is_empty()) else {
        return Err("required".into());
    };
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let fresh = match object {
        Object::Service(_) => names.services.insert(key(meta), digest).is_none(),
        Object::Slice(_) => names.slices.insert(key(meta), digest).is_none(),
        Object::Node(_) => names.nodes.insert(name.to_owned(), digest).is_none(),
        Object::Cidr(_) => names.cidrs.insert(name.to_owned(), digest).is_none(),
    };
    if !fresh {
        return Err(format!("{kind} {namespace}/{name} is defined twice"));
    }
    Ok(())
}

type Invalid = (String, String);

fn validate_service(svc: &Service) -> Result<(), Invalid> {
    let Some(spec) = &svc.spec else { return Ok(()) };
    let ip_ok = |ip: &str| ip == "None" || ip.is_empty() || ip.parse::<IpAddr>().is_ok();
    if let Some(ip) = &spec.cluster_ip
        && !ip_ok(ip)
    {
        return Err((
            "spec.clusterIP".into(),
            format!("{ip:?} is not a valid IP address or \"None\""),
        ));
    }
    for (i, ip) in spec.cluster_ips.iter().flatten().enumerate() {
        if !ip_ok(ip) {
            return Err((
                format!("spec.clusterIPs[{i}]"),
                format!("{ip:?} is not a valid IP address"),
            ));
        }
    }
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.port) {
            return Err((
                format!("spec.ports[{i}].port"),
                format!("{} must be between 1 and 65535", port.port),
            ));
        }
        if let Some(p) = &port.protocol
            && !matches!(p.as_str(), "TCP" | "UDP" | "SCTP")
        {
            return Err((
                format!("spec.ports[{i}].protocol"),
                format!("{p:?} must be TCP, UDP or SCTP"),
            ));
        }
        if spec.ports.as_ref().is_some_and(|ps| ps.len() > 1)
            && port.name.as_deref().unwrap_or("").is_empty()
        {
            return Err((
                format!("spec.ports[{i}].name"),
                "required when a service has more than one port".into(),
            ));
        }
    }
    Ok(())
}

fn validate_slice(slice: &EndpointSlice) -> Result<(), Invalid> {
    let family = slice.address_type.as_str();
    if !matches!(family, "IPv4" | "IPv6" | "FQDN") {
        return Err((
            "addressType".into(),
            format!("{family:?} must be IPv4, IPv6 or FQDN"),
        ));
    }
    for (i, ep) in slice.endpoints.iter().flatten().enumerate() {
        if ep.addresses.is_empty() {
            return Err((
                format!("endpoints[{i}].addresses"),
                "must hold at least one address".into(),
            ));
        }
        for (j, addr) in ep.addresses.iter().enumerate() {
            let ok = match family {
                "IPv4" => addr.parse::<std::net::Ipv4Addr>().is_ok(),
                "IPv6" => addr.parse::<std::net::Ipv6Addr>().is_ok(),
                _ => true,
            };
            if !ok {
                return Err((
                    format!("endpoints[{i}].addresses[{j}]"),
                    format!("{addr:?} is not a valid {family} address"),
                ));
            }
        }
    }
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        if let Some(p) = port.port
            && !(1..=65535).contains(&p)
        {
            return Err((
                format!("ports[{i}].port"),
                format!("{p} must be between 1 and 65535"),
            ));
        }
    }
    Ok(())
}

/// As the API server validates a ServiceCIDR: one or two CIDRs, of
/// different families.
fn validate_service_cidr(obj: &ServiceCIDR) -> Result<(), (String, String)> {
    let cidrs = obj
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or_default();
    if cidrs.is_empty() || cidrs.len() > 2 {
        return Err((
            "spec.cidrs".into(),
            format!("must hold one or two CIDRs, holds {}", cidrs.len()),
        ));
    }
    let mut families = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        let net: ipnet::IpNet = c
            .trim()
            .parse()
            .map_err(|_| (format!("spec.cidrs[{i}]"), format!("{c:?} is not a CIDR")))?;
        if families.contains(&net.addr().is_ipv4()) {
            return Err((
                format!("spec.cidrs[{i}]"),
                "two CIDRs must be of different families".into(),
            ));
        }
        families.push(net.addr().is_ipv4());
    }
    Ok(())
}

/// The directory as a source of [`SourceEvent`]s, read again as soon as a
/// file in it is written, moved or removed (inotify), and every `interval`
/// whatever inotify says (editors, other filesystems): the first good read
/// lists everything and marks both kinds synced; later reads send only what
/// changed. A bad read sends nothing, so the last good state stays
/// programmed. The stream never ends.
pub fn events(
    dir: PathBuf,
    node_name: String,
    interval: std::time::Duration,
) -> impl futures::Stream<Item = SourceEvent> + Send {
    struct Poll {
        dir: PathBuf,
        node_name: String,
        interval: std::time::Duration,
        written: Option<inotify::EventStream<Vec<u8>>>,
        fingerprint: Option<Vec<(PathBuf, u64, SystemTime)>>,
        /// A listing the poll found changed, not read until it stays so.
        unsettled: Option<Vec<(PathBuf, u64, SystemTime)>>,
        read: Directory,
        pending: std::collections::VecDeque<SourceEvent>,
    }
    let written = watch_writes(&dir)
        .inspect_err(|e| {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the manifests directory; it is polled only")
        })
        .ok();
    let state = Poll {
        dir,
        node_name,
        interval,
        written,
        fingerprint: None,
        unsettled: None,
        read: Directory::default(),
        pending: Default::default(),
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((event, s));
            }
            let mut writer_done = s.fingerprint.is_none();
            if !writer_done {
                let sleep = tokio::time::sleep(s.interval);
                match &mut s.written {
                    Some(written) => {
                        tokio::select! {
                            _ = sleep => {}
                            _ = futures::StreamExt::next(written) => writer_done = true,
                        }
                    }
                    None => sleep.await,
                }
            }
            let fingerprint = match fingerprint(&s.dir) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(dir = %s.dir.display(), error = %e, "cannot read the manifests directory");
                    s.fingerprint = Some(Vec::new());
                    continue;
                }
            };
            if fingerprint == s.fingerprint {
                s.unsettled = None;
                continue;
            }
            // A change the poll found may be a file still being written (an
            // `fs::write` truncates first: read then, its objects would be
            // deleted): read it once it stood still for an interval. A close
            // or a move into the directory says the writer is done.
            if !writer_done && s.unsettled != fingerprint {
                s.unsettled = fingerprint;
                continue;
            }
            s.unsettled = None;
            let listing = fingerprint.clone().unwrap_or_default();
            s.fingerprint = fingerprint;
            match s.read.read(&listing, &s.node_name) {
                Ok(events) => {
                    let (services, endpoint_slices) =
                        (s.read.all.services.len(), s.read.all.slices.len());
                    s.pending.extend(events);
                    tracing::info!(
                        dir = %s.dir.display(),
                        services,
                        endpoint_slices,
                        changes = s.pending.len(),
                        "manifests read"
                    );
                    // The read's documents and values are gone: give them back.
                    crate::memory::release_freed();
                }
                Err(e) => {
                    tracing::error!(error = %e, "manifests rejected; the last good state stays programmed")
                }
            }
        }
    })
}

/// Events for files in `dir` written and closed, moved in or out, or
/// removed: not every write, so a file being written is not read half-way.
fn watch_writes(dir: &Path) -> std::io::Result<inotify::EventStream<Vec<u8>>> {
    use inotify::{Inotify, WatchMask};
    let notify = Inotify::init()?;
    notify.watches().add(
        dir,
        WatchMask::CLOSE_WRITE | WatchMask::MOVED_TO | WatchMask::MOVED_FROM | WatchMask::DELETE,
    )?;
    notify.into_event_stream(vec![0u8; 4096])
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> NamespacedName {
    NamespacedName::new(
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

/// What one file, or the whole directory, held at its last good read: a
/// digest of each object, enough to tell what changed (keeping the objects
/// themselves cost 30 MB at 10,000 services).
#[derive(Debug, Default, Clone)]
struct Seen {
    services: BTreeMap<NamespacedName, u64>,
    slices: BTreeMap<NamespacedName, u64>,
    cidrs: BTreeMap<String, u64>,
    /// This node's Node object.
    node: Option<u64>,
}

/// A digest of an object's whole content (its JSON form), for objects
/// read from YAML (JSON items hash their own text).
fn digest<T: serde::Serialize>(object: &T) -> u64 {
    hash_bytes(&serde_json::to_vec(object).unwrap_or_default())
}

/// A 64-bit hash with a fixed seed: digests are compared only within this
/// process, from one read of the directory to the next.
fn hash_bytes(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::quality::FixedState::with_seed(0x6b70_6d66).hash_one(bytes)
}

/// One file of the directory as last read.
#[derive(Debug, Clone)]
struct FileSeen {
    size: u64,
    modified: SystemTime,
    seen: Seen,
}

/// The directory as last read, file by file: a change re-reads only the
/// files whose size or time changed (at 50,000 services reading every file
/// again took seconds for a one-line change), and the directory's union
/// tells which objects are new, changed or gone.
#[derive(Debug, Default)]
struct Directory {
    files: BTreeMap<PathBuf, FileSeen>,
    all: Seen,
    /// A good read happened: later ones send only changes.
    listed: bool,
}

/// Each file of `files` read, in their order; several at once on threads
/// of their own (a first listing of 50,000 services is seconds of parsing).
fn read_files(files: &[&(PathBuf, u64, SystemTime)]) -> Vec<Result<Manifests, ManifestError>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    in_order_on_threads(files, threads, |_, (path, _, _)| {
        let mut objects = Manifests::default();
        load_file(path, &mut objects).map(|()| objects)
    })
}

/// `work` done on each of `jobs` (with its index) by up to `threads`
/// threads, each taking the next job when done with one; the results in
/// the jobs' order.
fn in_order_on_threads<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    work: impl Fn(usize, &J) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(jobs.len());
    if threads <= 1 {
        return jobs
            .iter()
            .enumerate()
            .map(|(i, job)| work(i, job))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else {
                            return mine;
                        };
                        mine.push((i, work(i, job)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, result)| result).collect()
}

/// The objects of one re-read file and what it holds.
struct FileRead {
    path: PathBuf,
    objects: Manifests,
    seen: FileSeen,
}

impl Directory {
    /// Reads the files of `listing` that changed since the last good read
    /// and returns the events that bring a consumer up to date (the first
    /// time: everything, then both kinds marked synced). On an error
    /// nothing is kept: the next read tries the same files again.
    fn read(
        &mut self,
        listing: &[(PathBuf, u64, SystemTime)],
        node_name: &str,
    ) -> Result<Vec<SourceEvent>, ManifestError> {
        let changed: Vec<&(PathBuf, u64, SystemTime)> = listing
            .iter()
            .filter(|(path, size, modified)| {
                let known = self.files.get(path);
                !known.is_some_and(|f| f.size == *size && f.modified == *modified)
            })
            .collect();
        let mut reads = Vec::new();
        for (read, (path, size, modified)) in read_files(&changed).into_iter().zip(&changed) {
            let mut objects = read?;
            let seen = seen_of(&mut objects, node_name);
            reads.push(FileRead {
                path: path.clone(),
                objects,
                seen: FileSeen {
                    size: *size,
                    modified: *modified,
                    seen,
                },
            });
        }
        let listed: BTreeSet<&PathBuf> = listing.iter().map(|(p, _, _)| p).collect();
        let leaving: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !listed.contains(p) || reads.iter().any(|r| &r.path == *p))
            .cloned()
            .collect();
        // What the files read again or gone held, and what the files read hold.
        let mut before = Seen::default();
        for path in &leaving {
            before.absorb(&self.files[path].seen);
        }
        let mut after = Seen::default();
        for r in &reads {
            let twice = |what: String| ManifestError {
                file: r.path.clone(),
                document: None,
                field: Some("metadata.name".into()),
                message: format!("{what} is defined twice"),
            };
            let seen = &r.seen.seen;
            if let Some(k) = clash(
                &seen.services,
                &after.services,
                &self.all.services,
                &before.services,
            ) {
                return Err(twice(format!("Service {k}")));
            }
            if let Some(k) = clash(
                &seen.slices,
                &after.slices,
                &self.all.slices,
                &before.slices,
            ) {
                return Err(twice(format!("EndpointSlice {k}")));
            }
            if let Some(k) = clash(&seen.cidrs, &after.cidrs, &self.all.cidrs, &before.cidrs) {
                return Err(twice(format!("ServiceCIDR {k}")));
            }
            let node_stays = self.all.node.is_some() && before.node.is_none();
            if seen.node.is_some() && (after.node.is_some() || node_stays) {
                return Err(twice(format!("Node {node_name}")));
            }
            after.absorb(seen);
        }

        let old = &self.all;
        let mut out = Vec::new();
        let mut node = None;
        for r in &mut reads {
            let objects = std::mem::take(&mut r.objects);
            // Nothing known yet (the first listing): everything is new,
            // with no name to look up.
            for svc in objects.services {
                if old.services.is_empty() || {
                    let k = key(&svc.metadata);
                    old.services.get(&k) != after.services.get(&k)
                } {
                    out.push(SourceEvent::ServiceApplied(svc));
                }
            }
            for slice in objects.endpoint_slices {
                if old.slices.is_empty() || {
                    let k = key(&slice.metadata);
                    old.slices.get(&k) != after.slices.get(&k)
                } {
                    out.push(SourceEvent::SliceApplied(slice));
                }
            }
            for cidr in objects.service_cidrs {
                let k = cidr.metadata.name.clone().unwrap_or_default();
                if old.cidrs.get(&k) != after.cidrs.get(&k) {
                    out.push(SourceEvent::ServiceCidrApplied(Box::new(cidr)));
                }
            }
            node = node.or_else(|| {
                objects
                    .nodes
                    .into_iter()
                    .find(|n| n.metadata.name.as_deref() == Some(node_name))
            });
        }
        out.extend(
            gone(&before.services, &after.services)
                .into_iter()
                .map(SourceEvent::ServiceDeleted),
        );
        out.extend(
            gone(&before.slices, &after.slices)
                .into_iter()
                .map(SourceEvent::SliceDeleted),
        );
        out.extend(
            gone(&before.cidrs, &after.cidrs)
                .into_iter()
                .map(SourceEvent::ServiceCidrDeleted),
        );
        match node {
            Some(n) if old.node != after.node => out.push(SourceEvent::NodeApplied(Box::new(n))),
            None if before.node.is_some() => out.push(SourceEvent::NodeDeleted),
            _ => {}
        }
        if !self.listed {
            out.push(SourceEvent::ServicesSynced);
            out.push(SourceEvent::SlicesSynced);
            self.listed = true;
        }

        // Keep what was read: the union without what left, with what came.
        self.all.forget(&before);
        if self.all.is_empty() {
            self.all = after;
        } else {
            self.all.absorb(&after);
        }
        for path in leaving {
            self.files.remove(&path);
        }
        for r in reads {
            self.files.insert(r.path, r.seen);
        }
        Ok(out)
    }
}

/// A key of `mine` defined twice: in another file read (`read`), or in a
/// file that stays (in `all` and not among what leaves, `left`).
fn clash<K: Ord + Clone>(
    mine: &BTreeMap<K, u64>,
    read: &BTreeMap<K, u64>,
    all: &BTreeMap<K, u64>,
    left: &BTreeMap<K, u64>,
) -> Option<K> {
    mine.keys()
        .find(|k| read.contains_key(*k) || (all.contains_key(*k) && !left.contains_key(*k)))
        .cloned()
}

/// `from`'s entries added to `into`: a copy of the tree when `into` is
/// empty (a first listing's 50,000 names added one by one took 35 ms).
fn union_into<K: Ord + Clone>(into: &mut BTreeMap<K, u64>, from: &BTreeMap<K, u64>) {
    if into.is_empty() {
        into.clone_from(from);
    } else {
        into.extend(from.iter().map(|(k, v)| (k.clone(), *v)));
    }
}

/// The keys of `before` that `after` lacks.
fn gone<K: Ord + Clone>(before: &BTreeMap<K, u64>, after: &BTreeMap<K, u64>) -> Vec<K> {
    before
        .keys()
        .filter(|k| !after.contains_key(*k))
        .cloned()
        .collect()
}

impl Seen {
    fn absorb(&mut self, other: &Seen) {
        union_into(&mut self.services, &other.services);
        union_into(&mut self.slices, &other.slices);
        union_into(&mut self.cidrs, &other.cidrs);
        self.node = other.node.or(self.node);
    }

    fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.slices.is_empty()
            && self.cidrs.is_empty()
            && self.node.is_none()
    }

    fn forget(&mut self, other: &Seen) {
        for k in other.services.keys() {
            self.services.remove(k);
        }
        for k in other.slices.keys() {
            self.slices.remove(k);
        }
        for k in other.cidrs.keys() {
            self.cidrs.remove(k);
        }
        if other.node.is_some() {
            self.node = None;
        }
    }
}

/// Digests of what one file holds (only this node's Node), taken from
/// `objects`: the names its read collected.
fn seen_of(objects: &mut Manifests, node_name: &str) -> Seen {
    let names = std::mem::take(&mut objects.names);
    Seen {
        services: names.services,
        slices: names.slices,
        cidrs: names.cidrs,
        node: names.nodes.get(node_name).copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several documents, one a list: their heads and texts in one pass, the
    /// list's items found on the way; any error leaves the file to the
    /// document-by-document read.
    #[test]
    fn json_heads_find_each_document_and_its_text_in_one_pass() {
        let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"a"}}"#;
        let list = r#"{"kind":"List","items":[{"kind":"Service"},{"kind":"Service"}]}"#;
        let text = format!("\n {node}\n\n{list} \n");
        let heads = json_heads(&text).expect("valid documents");
        assert_eq!(heads.len(), 2);
        assert_eq!(heads[0].1, node);
        assert_eq!(heads[0].0.kind.as_deref(), Some("Node"));
        assert!(matches!(heads[0].0.items, Items::Absent));
        assert_eq!(heads[1].1, list);
        match &heads[1].0.items {
            Items::Array(items) => assert_eq!(items[1].get(), r#"{"kind":"Service"}"#),
            _ => panic!("the list's items"),
        }

        assert!(json_heads(&format!("{node}\n{{\"kind\": [")).is_none());
        assert!(json_heads(r#"{"kind": 3}"#).is_none());
    }
}
