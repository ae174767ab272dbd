//! Keeps the programs attached: `tc_from_pod` at ingress of every pod-facing
//! interface, `tc_from_netdev` and `xdp_from_netdev` on the node's external
//! interfaces, and `tc_from_host` at egress of both (replies of this node's
//! own sockets, for hostNetwork endpoints).
//!
//! With a [`PinLayout`], every link is pinned and so outlives the agent; a
//! link an earlier agent pinned is taken over by updating it to this agent's
//! program (`bpf_link_update`: the interface is never without a program).
//! Without one, the links belong to this process and go with it.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{
        SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        tc::{SchedClassifierLink, SchedClassifierLinkId},
        xdp::{XdpLink, XdpLinkId},
    },
    util::KernelVersion,
};
use tracing::{info, warn};

use super::{
    PROG_FROM_HOST, PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP, interfaces, pin::PinLayout,
};
use crate::options::ebpf::XdpMode as XdpSetting;

/// How XDP ended up attached to an external interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpChoice {
    Native,
    Generic,
    /// Taken over from an earlier agent, in the mode it chose.
    Adopted,
    /// Not attached: disabled by configuration, or no mode worked (TC does the work).
    None,
}

/// One program on one interface.
enum Held {
    Tc(SchedClassifierLinkId),
    Xdp(XdpLinkId),
    /// Pinned: it stays attached whatever happens to this process, until the
    /// pin is removed and the last descriptor closed.
    Pinned {
        link: FdLink,
        path: PathBuf,
    },
}

struct External {
    ifindex: u32,
    tc: Held,
    egress: Held,
    xdp: Option<Held>,
    mode: XdpChoice,
}

struct PodIface {
    ifindex: u32,
    ingress: Held,
    egress: Held,
}

pub struct Attacher {
    ebpf: Ebpf,
    xdp_setting: XdpSetting,
    pins: Option<PinLayout>,
    /// TC links can be pinned only as tcx links (Linux 6.6).
    pin_tc: bool,
    pods: BTreeMap<String, PodIface>,
    externals: BTreeMap<String, External>,
    /// Interfaces whose attachment failed on the last pass.
    failed: usize,
    /// Whether stale pinned links were looked for (after the first pass).
    swept: bool,
}

impl Attacher {
    pub fn new(ebpf: Ebpf, xdp_setting: XdpSetting, pins: Option<PinLayout>) -> Self {
        let pin_tc = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
        if pins.is_some() && !pin_tc {
            warn!(
                "this kernel has no tcx links (Linux 6.6): the TC programs are detached when the agent exits"
            );
        }
        Self {
            ebpf,
            xdp_setting,
            pins,
            pin_tc,
            pods: BTreeMap::new(),
            externals: BTreeMap::new(),
            failed: 0,
            swept: false,
        }
    }

    /// Attaches to interfaces that appeared and lets go of ones that went away
    /// (the kernel drops their links with them). Both maps are name → ifindex.
    /// Returns whether every interface is attached (else a later pass retries).
    pub fn reconcile(
        &mut self,
        pods: &BTreeMap<String, u32>,
        external: &BTreeMap<String, u32>,
    ) -> anyhow::Result<bool> {
        self.failed = 0;
        // External interfaces first: once a pod's traffic is served, the
        // node's NodePorts are too (and logged as such).
        self.reconcile_externals(external)?;
        self.reconcile_pods(pods)?;
        if !self.swept && self.failed == 0 {
            self.sweep_stale_pins();
            self.swept = true;
        }
        Ok(self.failed == 0)
    }

    fn reconcile_pods(&mut self, present: &BTreeMap<String, u32>) -> anyhow::Result<()> {
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(name, pod)| present.get(*name) != Some(&pod.ifindex))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(pod) = self.pods.remove(&name) {
                self.release(PROG_FROM_POD, pod.ingress);
                self.release(PROG_FROM_HOST, pod.egress);
                info!(interface = %name, "pod interface gone, links released");
            }
        }
        for (name, index) in present {
            if self.pods.contains_key(name) {
                continue;
            }
            match self.attach_pair(PROG_FROM_POD, name, *index) {
                Ok((ingress, egress, adopted)) => {
                    let how = if adopted { "took over" } else { "attached" };
                    info!(interface = %name, ifindex = index, "{how} tc_from_pod at ingress and tc_from_host at egress");
                    self.pods.insert(
                        name.clone(),
                        PodIface {
                            ifindex: *index,
                            ingress,
                            egress,
                        },
                    );
                }
                // Typically the interface vanished mid-way; the next pass retries.
                Err(e) => {
                    self.failed += 1;
                    warn!(interface = %name, error = %format!("{e:#}"), "attaching tc_from_pod failed");
                }
            }
        }
        Ok(())
    }

    /// `ingress_program` at ingress and `tc_from_host` at egress of one
    /// interface, or neither; returns whether the ingress link was taken over.
    fn attach_pair(
        &mut self,
        ingress_program: &str,
        name: &str,
        ifindex: u32,
    ) -> anyhow::Result<(Held, Held, bool)> {
        let (ingress, adopted) =
            self.attach_tc(ingress_program, name, ifindex, TcAttachType::Ingress)?;
        match self.attach_tc(PROG_FROM_HOST, name, ifindex, TcAttachType::Egress) {
            Ok((egress, _)) => Ok((ingress, egress, adopted)),
            Err(e) => {
                self.release(ingress_program, ingress);
                Err(e.context("attaching tc_from_host at egress"))
            }
        }
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
                self.release(PROG_FROM_NETDEV, ext.tc);
                self.release(PROG_FROM_HOST, ext.egress);
                if let Some(xdp) = ext.xdp {
                    self.release(PROG_XDP, xdp);
                }
                info!(interface = %name, "external interface gone or no longer external, detached");
            }
        }
        for (name, index) in present {
            if self.externals.contains_key(name) {
                continue;
            }
            let (tc, egress) = match self.attach_pair(PROG_FROM_NETDEV, name, *index) {
                Ok((ingress, egress, _)) => (ingress, egress),
                Err(e) => {
                    self.failed += 1;
                    warn!(interface = %name, error = %format!("{e:#}"), "attaching tc_from_netdev failed");
                    continue;
                }
            };
            let (xdp, mode) = self.attach_xdp(name, *index);
            info!(interface = %name, ifindex = index, xdp = ?mode, "attached tc_from_netdev at ingress and tc_from_host at egress (XDP as `xdp` says)");
            self.externals.insert(
                name.clone(),
                External {
                    ifindex: *index,
                    tc,
                    egress,
                    xdp,
                    mode,
                },
            );
        }
        Ok(())
    }

    /// Attaches `program` at `direction` of `name`, taking over a pinned
    /// link when there is one; returns whether it was taken over.
    fn attach_tc(
        &mut self,
        program: &str,
        name: &str,
        ifindex: u32,
        direction: TcAttachType,
    ) -> anyhow::Result<(Held, bool)> {
        let path = self
            .pins
            .as_ref()
            .filter(|_| self.pin_tc)
            .map(|p| p.link_path(ifindex, program));
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(program)
            .context("program missing")?
            .try_into()?;
        if let Some(path) = path.as_ref().filter(|p| p.exists()) {
            let adopted = PinnedLink::from_pin(path)
                .map_err(anyhow::Error::from)
                .and_then(|pinned| Ok(SchedClassifierLink::try_from(FdLink::from(pinned))?))
                .and_then(|link| Ok(prog.attach_to_link(link)?))
                .and_then(|id| Ok(FdLink::try_from(prog.take_link(id)?)?));
            match adopted {
                Ok(link) => {
                    let path = path.clone();
                    return Ok((Held::Pinned { link, path }, true));
                }
                Err(e) => {
                    warn!(pin = %path.display(), error = %format!("{e:#}"), "cannot take over a pinned link; attaching anew");
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let id = prog.attach(name, direction)?;
        let Some(path) = path else {
            return Ok((Held::Tc(id), false));
        };
        let link = FdLink::try_from(prog.take_link(id)?)?;
        Ok((pin(link, path)?, false))
    }

    /// As the setting asks. `auto` is native XDP where the driver has it and
    /// none elsewhere: generic XDP runs where TC does, once the skb is built,
    /// so it saves nothing and adds a program run to every packet (and a
    /// second conntrack lookup to each it leaves to TC); see
    /// docs/configuration.md for what the bench measured. A veth has native
    /// XDP, but sends its XDP_TX frames on only when its peer runs an XDP
    /// program too, which the node cannot know.
    fn attach_xdp(&mut self, name: &str, ifindex: u32) -> (Option<Held>, XdpChoice) {
        let path = self.pins.as_ref().map(|p| p.link_path(ifindex, PROG_XDP));
        let auto = self.xdp_setting == XdpSetting::Auto;
        let tries: &[(XdpMode, XdpChoice)] = match self.xdp_setting {
            XdpSetting::Disabled => {
                if let Some(path) = path.filter(|p| p.exists()) {
                    let _ = std::fs::remove_file(path);
                }
                return (None, XdpChoice::None);
            }
            XdpSetting::Native => &[(XdpMode::Driver, XdpChoice::Native)],
            XdpSetting::Generic => &[(XdpMode::Skb, XdpChoice::Generic)],
            XdpSetting::Auto if interfaces::driver(name).is_ok_and(|d| d == "veth") => {
                info!(interface = %name, "veth: no XDP, TC handles this interface (native XDP_TX on a veth needs an XDP program on its peer; generic XDP costs more than TC alone; --ebpf-xdp-mode=generic asks for it)");
                if let Some(path) = path.filter(|p| p.exists()) {
                    let _ = std::fs::remove_file(path);
                }
                return (None, XdpChoice::None);
            }
            XdpSetting::Auto => &[(XdpMode::Driver, XdpChoice::Native)],
        };
        // An earlier agent's generic link (before `auto` left generic
        // XDP out) is not taken over under `auto`.
        if auto
            && let Some(path) = path.as_ref().filter(|p| p.exists())
            && super::introspect::xdp_generic_attached(ifindex).unwrap_or(false)
        {
            info!(interface = %name, "detaching the generic XDP program an earlier agent attached: under auto, TC handles an interface without native XDP");
            let _ = std::fs::remove_file(path);
        }
        let Ok(prog) = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("program missing")
            .and_then(|p| <&mut Xdp>::try_from(p).map_err(Into::into))
        else {
            return (None, XdpChoice::None);
        };
        if let Some(path) = path.as_ref().filter(|p| p.exists()) {
            let adopted = PinnedLink::from_pin(path)
                .map_err(anyhow::Error::from)
                .and_then(|pinned| Ok(XdpLink::try_from(FdLink::from(pinned))?))
                .and_then(|link| Ok(prog.attach_to_link(link)?))
                .and_then(|id| Ok(FdLink::try_from(prog.take_link(id)?)?));
            match adopted {
                Ok(link) => {
                    let path = path.clone();
                    return (Some(Held::Pinned { link, path }), XdpChoice::Adopted);
                }
                Err(e) => {
                    warn!(pin = %path.display(), error = %format!("{e:#}"), "cannot take over a pinned XDP link; attaching anew");
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        for (mode, choice) in tries {
            match prog.attach(name, *mode) {
                Ok(id) => {
                    let Some(path) = path else {
                        return (Some(Held::Xdp(id)), *choice);
                    };
                    let pinned = prog
                        .take_link(id)
                        .map_err(anyhow::Error::from)
                        .and_then(|link| Ok(FdLink::try_from(link)?))
                        .and_then(|link| pin(link, path));
                    return match pinned {
                        Ok(held) => (Some(held), *choice),
                        Err(e) => {
                            warn!(interface = %name, error = %format!("{e:#}"), "pinning the XDP link failed; TC handles this interface alone");
                            (None, XdpChoice::None)
                        }
                    };
                }
                Err(e) => {
                    info!(interface = %name, mode = ?choice, error = %e, "XDP mode not available here")
                }
            }
        }
        if auto {
            info!(interface = %name, "no native XDP here: TC handles this interface (--ebpf-xdp-mode=generic asks for generic XDP)");
        } else {
            warn!(interface = %name, "no XDP mode could be attached; TC handles this interface alone");
        }
        (None, XdpChoice::None)
    }

    fn release(&mut self, program: &str, held: Held) {
        match held {
            Held::Tc(id) => {
                if let Some(Ok(prog)) = self
                    .ebpf
                    .program_mut(program)
                    .map(<&mut SchedClassifier>::try_from)
                {
                    let _ = prog.detach(id);
                }
            }
            Held::Xdp(id) => {
                if let Some(Ok(prog)) = self.ebpf.program_mut(program).map(<&mut Xdp>::try_from) {
                    let _ = prog.detach(id);
                }
            }
            Held::Pinned { link, path } => {
                let _ = std::fs::remove_file(&path);
                drop(link);
            }
        }
    }

    /// Pinned links an earlier agent left for interfaces that are gone or no
    /// longer served: removing the pin detaches them.
    fn sweep_stale_pins(&mut self) {
        let Some(pins) = &self.pins else { return };
        let held: std::collections::BTreeSet<PathBuf> = self
            .all_held()
            .filter_map(|h| match h {
                Held::Pinned { path, .. } => Some(path.clone()),
                _ => None,
            })
            .collect();
        let Ok(entries) = std::fs::read_dir(pins.links_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let socket_link = entry
                .file_name()
                .to_string_lossy()
                .starts_with(super::pin::CGROUP_LINK_PREFIX);
            if !held.contains(&path) && !socket_link {
                info!(pin = %path.display(), "removing a pinned link no interface needs any more");
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Removes every link pin this agent holds (their programs detach once
    /// this process exits); for `pinning.detachOnExit`.
    pub fn unpin_links(&mut self) -> usize {
        let mut removed = 0;
        let held: Vec<&Held> = self.all_held().collect();
        for h in held {
            if let Held::Pinned { path, .. } = h
                && std::fs::remove_file(path).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    fn all_held(&self) -> impl Iterator<Item = &Held> {
        self.pods
            .values()
            .flat_map(|p| [&p.ingress, &p.egress])
            .chain(self.externals.values().flat_map(|e| {
                [Some(&e.tc), Some(&e.egress), e.xdp.as_ref()]
                    .into_iter()
                    .flatten()
            }))
    }

    pub fn pod_names(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    pub fn external_names(&self) -> impl Iterator<Item = (&str, XdpChoice)> {
        self.externals.iter().map(|(n, e)| (n.as_str(), e.mode))
    }
}

fn pin(link: FdLink, path: PathBuf) -> anyhow::Result<Held> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A pin of a link that is gone (its interface was removed) may still be there.
    let _ = std::fs::remove_file(&path);
    let pinned = link
        .pin(&path)
        .with_context(|| format!("pinning a link at {}", path.display()))?;
    Ok(Held::Pinned {
        link: FdLink::from(pinned),
        path,
    })
}
