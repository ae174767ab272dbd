//! Which of our programs the kernel runs on each interface of this network
//! namespace, and how: XDP (native, generic or offloaded, from rtnetlink's
//! per-mode program ids) and TC ingress/egress (tcx, from BPF_PROG_QUERY).
//! This is the kernel's word, not what the agent believes it attached.

use std::collections::BTreeMap;

use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkExtentMask, LinkMessage, LinkXdp},
};
use serde::Serialize;

use super::{IntrospectError, ProgramStats};
use crate::modes::ebpf::sys;
use crate::sources::host::Rtnl;

/// Where on an interface a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// XDP in the driver.
    XdpNative,
    /// XDP in the kernel's generic (skb) path.
    XdpGeneric,
    /// XDP offloaded to the NIC.
    XdpOffload,
    TcIngress,
    TcEgress,
}

impl Hook {
    pub const fn name(self) -> &'static str {
        match self {
            Hook::XdpNative => "xdp_native",
            Hook::XdpGeneric => "xdp_generic",
            Hook::XdpOffload => "xdp_offload",
            Hook::TcIngress => "tc_ingress",
            Hook::TcEgress => "tc_egress",
        }
    }
}

/// One of our programs attached to an interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attachment {
    pub hook: Hook,
    pub program: String,
    pub program_id: u32,
}

/// The interfaces of this network namespace that run one of our programs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InterfaceAttachments {
    pub ifindex: u32,
    pub name: String,
    pub attachments: Vec<Attachment>,
}

/// What was found, and whether the TC hooks could be asked at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Interfaces {
    pub interfaces: Vec<InterfaceAttachments>,
    /// False on a kernel without tcx (before Linux 6.6), where the TC
    /// programs are attached as cls_bpf filters this does not list.
    pub tcx_supported: bool,
}

/// Every interface of the calling thread's network namespace running one of
/// `programs`. The agent's namespace must be the caller's (`ip netns exec`).
pub fn interfaces(programs: &[ProgramStats]) -> Result<Interfaces, IntrospectError> {
    let ours: BTreeMap<u32, &str> = programs.iter().map(|p| (p.id, p.name.as_str())).collect();
    let links = dump_links().map_err(IntrospectError::Netlink)?;
    let mut tcx_supported = true;
    let mut out = Vec::new();
    for link in links {
        let ifindex = link.header.index;
        let mut found: Vec<(Hook, u32)> = xdp_programs(&link);
        for (hook, attach_type) in [
            (Hook::TcIngress, sys::BPF_TCX_INGRESS),
            (Hook::TcEgress, sys::BPF_TCX_EGRESS),
        ] {
            match sys::tcx_programs(ifindex, attach_type) {
                Ok(ids) => found.extend(ids.into_iter().map(|id| (hook, id))),
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => tcx_supported = false,
                // The interface went away since the dump.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {}
                Err(source) => return Err(IntrospectError::Query { ifindex, source }),
            }
        }
        let attachments: Vec<Attachment> = found
            .into_iter()
            .filter_map(|(hook, id)| {
                ours.get(&id).map(|name| Attachment {
                    hook,
                    program: (*name).to_owned(),
                    program_id: id,
                })
            })
            .collect();
        if attachments.is_empty() {
            continue;
        }
        out.push(InterfaceAttachments {
            ifindex,
            name: interface_name(&link).unwrap_or_else(|| format!("if{ifindex}")),
            attachments,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Interfaces {
        interfaces: out,
        tcx_supported,
    })
}

/// Whether interface `ifindex` runs an XDP program in generic mode.
pub fn xdp_generic_attached(ifindex: u32) -> std::io::Result<bool> {
    Ok(dump_links()?
        .iter()
        .filter(|link| link.header.index == ifindex)
        .flat_map(xdp_programs)
        .any(|(hook, _)| hook == Hook::XdpGeneric))
}

fn dump_links() -> std::io::Result<Vec<LinkMessage>> {
    let mut rtnl = Rtnl::open()?;
    let request = || {
        let mut get = LinkMessage::default();
        get.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        RouteNetlinkMessage::GetLink(get)
    };
    Ok(rtnl
        .dump(request)?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(link),
            _ => None,
        })
        .collect())
}

fn interface_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })
}

/// The XDP programs of an interface, per mode (the kernel reports each
/// mode's program id separately, whatever the summary attribute says).
fn xdp_programs(link: &LinkMessage) -> Vec<(Hook, u32)> {
    let Some(xdp) = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(xdp) => Some(xdp),
        _ => None,
    }) else {
        return Vec::new();
    };
    xdp.iter()
        .filter_map(|a| match *a {
            LinkXdp::DrvProgId(id) => Some((Hook::XdpNative, id)),
            LinkXdp::SkbProgId(id) => Some((Hook::XdpGeneric, id)),
            LinkXdp::HwProgId(id) => Some((Hook::XdpOffload, id)),
            _ => None,
        })
        .filter(|(_, id)| *id != 0)
        .collect()
}
