//! Where the desired state comes from: the API server's watches, a manifests
//! directory, and the host's own network. Each turns what it sees into
//! [`SourceEvent`]s for the sync engine.

pub mod api;
mod event;
pub mod host;
pub mod manifests;

pub use event::SourceEvent;
