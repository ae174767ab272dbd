//! Keeps the programs attached: `tc_from_pod` on every pod-facing interface,
//! `tc_from_netdev` and `xdp_from_netdev` on the node's external interfaces.
//! Dropping the [`Attacher`] detaches everything (the links belong to this process).

use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{
        SchedClassifier, TcAttachType, Xdp, XdpMode, tc::SchedClassifierLinkId, xdp::XdpLinkId,
    },
};
use tracing::{info, warn};

use super::{PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP, interfaces};
use crate::options::ebpf::XdpMode as XdpSetting;

/// How XDP ended up attached to an external interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpChoice {
    Native,
    Generic,
    /// Not attached: disabled by configuration, or no mode worked (TC does the work).
    None,
}

struct External {
    ifindex: u32,
    tc: SchedClassifierLinkId,
    xdp: Option<XdpLinkId>,
    mode: XdpChoice,
}

pub struct Attacher {
    ebpf: Ebpf,
    xdp_setting: XdpSetting,
    pods: BTreeMap<String, (u32, SchedClassifierLinkId)>,
    externals: BTreeMap<String, External>,
    /// Interfaces whose attachment failed on the last pass.
    failed: usize,
}

impl Attacher {
    pub fn new(ebpf: Ebpf, xdp_setting: XdpSetting) -> Self {
        Self {
            ebpf,
            xdp_setting,
            pods: BTreeMap::new(),
            externals: BTreeMap::new(),
            failed: 0,
        }
    }

    /// Attaches to interfaces that appeared and forgets ones that went away
    /// (the kernel drops their links with them). Both maps are name → ifindex.
    /// Returns whether every interface is attached (else a later pass retries).
    pub fn reconcile(
        &mut self,
        pods: &BTreeMap<String, u32>,
        external: &BTreeMap<String, u32>,
    ) -> anyhow::Result<bool> {
        self.failed = 0;
        self.reconcile_pods(pods)?;
        self.reconcile_externals(external)?;
        Ok(self.failed == 0)
    }

    fn reconcile_pods(&mut self, present: &BTreeMap<String, u32>) -> anyhow::Result<()> {
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(PROG_FROM_POD)
            .context("program missing")?
            .try_into()?;
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(name, (index, _))| present.get(*name) != Some(index))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some((_, link)) = self.pods.remove(&name) {
                let _ = prog.detach(link);
                info!(interface = %name, "pod interface gone, link released");
            }
        }
        for (name, index) in present {
            if self.pods.contains_key(name) {
                continue;
            }
            match prog.attach(name, TcAttachType::Ingress) {
                Ok(link) => {
                    info!(interface = %name, ifindex = index, "attached tc_from_pod at ingress");
                    self.pods.insert(name.clone(), (*index, link));
                }
                // Typically the interface vanished mid-way; the next pass retries.
                Err(e) => {
                    self.failed += 1;
                    warn!(interface = %name, error = %e, "attaching tc_from_pod failed");
                }
            }
        }
        Ok(())
    }

    fn reconcile_externals(&mut self, present: &BTreeMap<String, u32>) -> anyhow::Result<()> {
        let stale: Vec<String> = self
            .externals
            .iter()
            .filter(|(name, e)| present.get(*name) != Some(&e.ifindex))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(ext) = self.externals.remove(&name) {
                self.detach_external(ext);
                info!(interface = %name, "external interface gone or no longer external, detached");
            }
        }
        for (name, index) in present {
            if self.externals.contains_key(name) {
                continue;
            }
            let tc: &mut SchedClassifier = self
                .ebpf
                .program_mut(PROG_FROM_NETDEV)
                .context("program missing")?
                .try_into()?;
            let tc = match tc.attach(name, TcAttachType::Ingress) {
                Ok(link) => link,
                Err(e) => {
                    self.failed += 1;
                    warn!(interface = %name, error = %e, "attaching tc_from_netdev failed");
                    continue;
                }
            };
            let (xdp, mode) = self.attach_xdp(name);
            info!(interface = %name, ifindex = index, xdp = ?mode, "attached tc_from_netdev at ingress and XDP");
            self.externals.insert(
                name.clone(),
                External {
                    ifindex: *index,
                    tc,
                    xdp,
                    mode,
                },
            );
        }
        Ok(())
    }

    /// Native where the driver supports it, else generic, as the setting allows.
    fn attach_xdp(&mut self, name: &str) -> (Option<XdpLinkId>, XdpChoice) {
        let tries: &[(XdpMode, XdpChoice)] = match self.xdp_setting {
            XdpSetting::Disabled => return (None, XdpChoice::None),
            XdpSetting::Native => &[(XdpMode::Driver, XdpChoice::Native)],
            XdpSetting::Generic => &[(XdpMode::Skb, XdpChoice::Generic)],
            // A veth sends native XDP_TX frames on only when its peer runs an
            // XDP program too (else they wait for unrelated traffic), which
            // the node cannot know: generic mode has no such condition.
            XdpSetting::Auto if interfaces::driver(name).is_ok_and(|d| d == "veth") => {
                info!(interface = %name, "veth: choosing generic XDP (native XDP_TX on a veth needs an XDP program on its peer)");
                &[(XdpMode::Skb, XdpChoice::Generic)]
            }
            XdpSetting::Auto => &[
                (XdpMode::Driver, XdpChoice::Native),
                (XdpMode::Skb, XdpChoice::Generic),
            ],
        };
        let Ok(prog) = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("program missing")
            .and_then(|p| <&mut Xdp>::try_from(p).map_err(Into::into))
        else {
            return (None, XdpChoice::None);
        };
        for (mode, choice) in tries {
            match prog.attach(name, *mode) {
                Ok(link) => return (Some(link), *choice),
                Err(e) => {
                    info!(interface = %name, mode = ?choice, error = %e, "XDP mode not available here")
                }
            }
        }
        warn!(interface = %name, "no XDP mode could be attached; TC handles this interface alone");
        (None, XdpChoice::None)
    }

    fn detach_external(&mut self, ext: External) {
        if let Ok(prog) = self
            .ebpf
            .program_mut(PROG_FROM_NETDEV)
            .context("program missing")
            .and_then(|p| <&mut SchedClassifier>::try_from(p).map_err(Into::into))
        {
            let _ = prog.detach(ext.tc);
        }
        if let Some(link) = ext.xdp
            && let Ok(prog) = self
                .ebpf
                .program_mut(PROG_XDP)
                .context("program missing")
                .and_then(|p| <&mut Xdp>::try_from(p).map_err(Into::into))
        {
            let _ = prog.detach(link);
        }
    }

    pub fn pod_names(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    pub fn external_names(&self) -> impl Iterator<Item = (&str, XdpChoice)> {
        self.externals.iter().map(|(n, e)| (n.as_str(), e.mode))
    }
}
