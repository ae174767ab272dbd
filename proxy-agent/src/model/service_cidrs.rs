//! The cluster's service CIDRs: the `spec.cidrs` of every ServiceCIDR object
//! (networking.k8s.io/v1), as upstream's kube-proxy collects them for its
//! "drop traffic to unallocated cluster IPs" rule; while the cluster has
//! none, the configured ones.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use tracing::warn;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceCidrs {
    /// By object name (ServiceCIDRs are cluster-scoped).
    objects: BTreeMap<String, Vec<IpNet>>,
    configured: Vec<IpNet>,
}

impl ServiceCidrs {
    /// With `configured` for as long as no ServiceCIDR object exists.
    pub fn with_configured(configured: Vec<IpNet>) -> Self {
        ServiceCidrs {
            objects: BTreeMap::new(),
            configured,
        }
    }

    /// Records `obj`; returns whether the effective set changed. A CIDR
    /// that does not parse (the API server validates them, so never in
    /// practice) is skipped with a warning naming the object.
    pub fn apply(&mut self, obj: &ServiceCIDR) -> bool {
        let Some(name) = obj.metadata.name.clone() else {
            return false;
        };
        let cidrs = obj
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| match c.trim().parse::<IpNet>() {
                Ok(net) => Some(net.trunc()),
                Err(_) => {
                    warn!(service_cidr = %name, cidr = %c, "ignoring a spec.cidrs entry that is not a CIDR");
                    None
                }
            })
            .collect();
        self.changing(|s| {
            s.objects.insert(name, cidrs);
        })
    }

    /// Forgets the object `name`; returns whether the effective set changed.
    pub fn delete(&mut self, name: &str) -> bool {
        self.changing(|s| {
            s.objects.remove(name);
        })
    }

    /// What the datapath guards: every object's CIDRs, else the configured ones.
    pub fn effective(&self) -> BTreeSet<IpNet> {
        if self.objects.is_empty() {
            return self.configured.iter().map(IpNet::trunc).collect();
        }
        self.objects.values().flatten().copied().collect()
    }

    fn changing(&mut self, change: impl FnOnce(&mut Self)) -> bool {
        let before = self.effective();
        change(self);
        self.effective() != before
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;

    use super::*;

    fn object(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
    }

    fn set(cidrs: &[&str]) -> BTreeSet<IpNet> {
        cidrs.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn objects_replace_the_configured_cidrs_while_any_exists() {
        let mut s = ServiceCidrs::with_configured(vec!["198.19.0.0/16".parse().unwrap()]);
        assert_eq!(s.effective(), set(&["198.19.0.0/16"]));
        assert!(s.apply(&object(
            "kubernetes",
            &["198.19.0.0/17", "2001:db8:ffff::/108"]
        )));
        assert_eq!(
            s.effective(),
            set(&["198.19.0.0/17", "2001:db8:ffff::/108"])
        );
        assert!(s.apply(&object("extra", &["198.19.128.0/17"])));
        assert!(
            !s.apply(&object("extra", &["198.19.128.0/17"])),
            "no change"
        );
        assert!(s.delete("kubernetes"));
        assert_eq!(s.effective(), set(&["198.19.128.0/17"]));
        assert!(s.delete("extra"));
        assert_eq!(
            s.effective(),
            set(&["198.19.0.0/16"]),
            "back to the configured"
        );
        assert!(!s.delete("extra"));
    }

    #[test]
    fn host_bits_are_cleared_and_bad_entries_skipped() {
        let mut s = ServiceCidrs::default();
        s.apply(&object("a", &["198.19.0.7/16", "not-a-cidr"]));
        assert_eq!(s.effective(), set(&["198.19.0.0/16"]));
    }
}
