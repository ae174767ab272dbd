use std::collections::BTreeSet;

use crate::model::{DesiredState, FamilySet, IpFamily, ServicePortName};

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

    /// The families `error` left unsynced: each is reported on its own (its
    /// health, its last sync time, its failure count), as upstream's
    /// proxier per family reports itself. By default, all of them.
    fn failed_families(&self, _error: &Self::Error) -> FamilySet {
        FamilySet::BOTH
    }

    /// The families whose failure the mode's failure counter counts: as
    /// upstream's, only rules the kernel refused (a failed restore or
    /// transaction, marked [`RulesRefused`]), not a failed step around it.
    /// By default, every failed family.
    fn counted_failures(&self, error: &Self::Error) -> FamilySet {
        self.failed_families(error)
    }
}

/// The context of a family's sync error when the kernel refused its rules
/// (`iptables-restore`, an `nft` transaction): the failures upstream counts
/// in `sync_proxy_rules_iptables_restore_failures_total` and
/// `sync_proxy_rules_nftables_sync_failures_total`.
#[derive(Clone, Copy, Debug)]
pub struct RulesRefused;

impl std::fmt::Display for RulesRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the rules were refused")
    }
}

/// The families whose rules a sync could not write, each with its reason.
/// The others were synced: one family's failure does not hold the other back.
#[derive(Debug)]
pub struct FamilySyncError {
    pub failed: Vec<(IpFamily, anyhow::Error)>,
}

impl std::fmt::Display for FamilySyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (_, error)) in self.failed.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error:#}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FamilySyncError {}

impl FamilySyncError {
    pub fn families(&self) -> FamilySet {
        let mut set = FamilySet::default();
        self.failed
            .iter()
            .for_each(|(family, _)| set.insert(*family));
        set
    }

    /// The families whose rules the kernel refused ([`RulesRefused`]).
    pub fn refused(&self) -> FamilySet {
        let mut set = FamilySet::default();
        (self.failed.iter())
            .filter(|(_, error)| error.downcast_ref::<RulesRefused>().is_some())
            .for_each(|(family, _)| set.insert(*family));
        set
    }
}

/// Runs `sync` for every family, each whatever became of the ones before.
pub fn sync_each_family(
    families: &[IpFamily],
    mut sync: impl FnMut(IpFamily) -> anyhow::Result<()>,
) -> Result<(), FamilySyncError> {
    let failed: Vec<(IpFamily, anyhow::Error)> = (families.iter())
        .filter_map(|&family| sync(family).err().map(|e| (family, e)))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(FamilySyncError { failed })
    }
}

impl<P: Proxier + ?Sized> Proxier for Box<P> {
    type Error = P::Error;

    fn sync(&mut self, desired: &DesiredState, changes: &SyncChanges) -> Result<(), Self::Error> {
        (**self).sync(desired, changes)
    }

    fn after_sync(&mut self, desired: &DesiredState, changes: &SyncChanges) {
        (**self).after_sync(desired, changes)
    }

    fn failed_families(&self, error: &Self::Error) -> FamilySet {
        (**self).failed_families(error)
    }

    fn counted_failures(&self, error: &Self::Error) -> FamilySet {
        (**self).counted_failures(error)
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    /// A family that fails does not keep the next from syncing, and the
    /// error says which failed and why.
    #[test]
    fn every_family_syncs_whatever_became_of_the_one_before() {
        let mut ran = Vec::new();
        let error = sync_each_family(&IpFamily::BOTH, |family| {
            ran.push(family);
            match family {
                IpFamily::V4 => Err(anyhow::anyhow!("iptables-restore refused the rules")),
                IpFamily::V6 => Ok(()),
            }
        })
        .unwrap_err();
        assert_eq!(ran, IpFamily::BOTH);
        assert_eq!(
            error.families(),
            FamilySet {
                v4: true,
                v6: false
            }
        );
        assert_eq!(error.to_string(), "iptables-restore refused the rules");
        assert!(sync_each_family(&IpFamily::BOTH, |_| Ok(())).is_ok());
    }

    /// Only refused rules count as upstream's restore or transaction
    /// failures, however deep in the error's context they are marked.
    #[test]
    fn refused_rules_are_told_from_other_failures() {
        let error = sync_each_family(&IpFamily::BOTH, |family| match family {
            IpFamily::V4 => Err(anyhow::anyhow!("exit status 2"))
                .context(RulesRefused)
                .context("syncing the IPv4 iptables rules"),
            IpFamily::V6 => Err(anyhow::anyhow!("ip6tables -N KUBE-SERVICES failed")),
        })
        .unwrap_err();
        assert_eq!(error.families(), FamilySet::BOTH);
        assert_eq!(
            error.refused(),
            FamilySet {
                v4: true,
                v6: false
            }
        );
        assert!(
            error
                .to_string()
                .contains("the rules were refused: exit status 2"),
            "{error}"
        );
    }
}
