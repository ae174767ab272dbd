//! The Kubernetes API source: kube-rs watchers on Services, EndpointSlices
//! (discovery.k8s.io/v1), ServiceCIDRs (networking.k8s.io/v1) and this
//! node's Node, turned into [`SourceEvent`]s.
//!
//! kube-rs' watcher resumes from the last resourceVersion after a disconnect
//! and relists after 410 Gone; [`relist`] turns a relist into deletions of
//! what disappeared meanwhile, and the first complete list into `*Synced`.

mod client;
mod relist;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    networking::v1::ServiceCIDR,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};

pub use client::{ClientError, ClientOptions, build_client};
pub use relist::{Kind, NodeKind, Relister, ServiceCidrKind, ServiceKind, SliceKind};

use crate::{model::endpoint_slice::EndpointSlice, sources::SourceEvent};

pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// Upstream's informer selector for Services and EndpointSlices: objects
/// meant for another proxy, or for headless services, are not even listed.
pub fn proxy_label_selector() -> String {
    format!("!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}")
}

/// `--hostname-override`, else the kernel hostname; trimmed and lower-cased
/// as upstream's `GetHostname`.
pub fn node_name(hostname_override: Option<&str>) -> std::io::Result<String> {
    let name = match hostname_override.map(str::trim).filter(|s| !s.is_empty()) {
        Some(name) => name.to_owned(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_owned(),
    };
    Ok(name.to_lowercase())
}

/// All four watches merged into one stream, which never ends.
pub fn events(client: Client, node_name: &str) -> impl Stream<Item = SourceEvent> + Send + use<> {
    stream::select_all([
        service_events(client.clone()).boxed(),
        slice_events(client.clone()).boxed(),
        service_cidr_events(client.clone()).boxed(),
        node_events(client, node_name).boxed(),
    ])
}

/// Clusters before 1.33 serve no ServiceCIDR API: the watch keeps retrying
/// with backoff (and says so), and the configured service CIDRs apply.
pub fn service_cidr_events(client: Client) -> impl Stream<Item = SourceEvent> + Send {
    relisted(
        watcher(Api::<ServiceCIDR>::all(client), watcher::Config::default()),
        ServiceCidrKind,
    )
}

pub fn service_events(client: Client) -> impl Stream<Item = SourceEvent> + Send {
    let config = watcher::Config::default().labels(&proxy_label_selector());
    relisted(watcher(Api::<Service>::all(client), config), ServiceKind)
}

pub fn slice_events(client: Client) -> impl Stream<Item = SourceEvent> + Send {
    let config = watcher::Config::default().labels(&proxy_label_selector());
    relisted(
        watcher(Api::<EndpointSlice>::all(client), config),
        SliceKind,
    )
}

pub fn node_events(
    client: Client,
    node_name: &str,
) -> impl Stream<Item = SourceEvent> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    relisted(watcher(Api::<Node>::all(client), config), NodeKind)
}

fn relisted<K, S>(watch: S, kind: K) -> impl Stream<Item = SourceEvent> + Send
where
    K: Kind + Send + 'static,
    K::Object: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K::Object>, watcher::Error>> + Send,
{
    let mut relister = Relister::new(kind);
    watch
        .default_backoff()
        .filter_map(move |event| {
            let out = match event {
                Ok(event) => relister.on_event(event),
                Err(error) => {
                    tracing::warn!(kind = K::NAME, %error, "watch failed; retrying with backoff");
                    Vec::new()
                }
            };
            futures::future::ready(Some(stream::iter(out)))
        })
        .flatten()
}
