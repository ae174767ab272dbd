use std::collections::BTreeSet;

use crate::model::{DesiredState, ServicePortName};

/// What changed since the previous successful sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncChanges {
    /// Reprogram everything and remove whatever is not in the desired state:
    /// first sync, after a failed sync, node topology change, periodic resync.
    pub full: bool,
    /// For partial syncs: service ports added, changed or removed (a removed
    /// one is absent from `DesiredState::services`). Empty on full syncs.
    pub changed: BTreeSet<ServicePortName>,
}

/// A proxy mode's backend (`crate::modes`). Called from the sync task only, never
/// concurrently; it should diff against what it installed, as upstream's
/// nftables proxier does.
pub trait Proxier: Send {
    type Error: std::error::Error + Send + Sync + 'static;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Self::Error>;

    /// After a successful sync has been reported (its metrics' timestamp,
    /// health): bookkeeping no packet waits for.
    fn after_sync(&mut self, _desired: &DesiredState, _changes: &SyncChanges) {}
}

impl<P: Proxier + ?Sized> Proxier for Box<P> {
    type Error = P::Error;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Self::Error> {
        (**self).sync(desired, changes)
    }

    fn after_sync(&mut self, desired: &DesiredState, changes: &SyncChanges) {
        (**self).after_sync(desired, changes)
    }
}
