//! The sync engine: source events feed the change trackers; the bounded
//! frequency runner turns pending changes into (partial or full) syncs of a
//! [`Proxier`].
//!
//! ```text
//! watch / manifests --SourceEvent--> SourceState (trackers) --run()--> runner --> Syncer::sync --> Proxier
//! ```

mod driver;
mod proxier;
pub mod runner;
mod source;
mod syncer;

pub use driver::{SyncTiming, run};
pub use proxier::{Proxier, SyncChanges};
pub use source::SourceState;
pub use syncer::{SyncError, SyncOutcome, Syncer};
