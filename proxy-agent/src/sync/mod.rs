//! The sync engine: source events feed the change trackers and the node
//! model; the bounded frequency runner turns pending changes into (partial or
//! full) syncs of a mode's [`Proxier`].
//!
//! ```text
//! sources (api | manifests, host) --SourceEvent--> SourceState (trackers, node model)
//!     --run()--> runner --> Syncer::sync --> DesiredState (services + node) --> Proxier
//! ```

mod driver;
mod observer;
mod proxier;
pub mod report_log;
pub mod runner;
mod source;
mod syncer;

pub use driver::{FEED_BATCH, SyncTiming, run, run_observed};
pub use observer::{Observers, SyncObserver, SyncReport, TrackerEvent};
pub use proxier::{FamilySyncError, Proxier, RulesRefused, SyncChanges, sync_each_family};
pub use source::SourceState;
pub use syncer::{SyncError, SyncOutcome, Syncer};
