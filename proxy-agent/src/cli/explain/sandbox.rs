//! The offline form's private network namespace: entered with unshare on
//! the calling thread (gone when the thread ends), holding an external
//! interface with the node's addresses and a default route per family, and a
//! pod-facing interface with routes to this node's pods, so that FIB lookups and
//! ifindex-based local-traffic detection behave as on the node. Nothing in
//! it is connected to anything.

use std::{
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::Command,
};

use anyhow::{Context as _, bail};
use ipnet::IpNet;

use crate::{
    modes::ebpf::node::{DetectLocal, EbpfNodeSettings},
    sources::host::{HostInterface, HostNetwork},
};

/// The default routes' next hops: permanent neighbours on the external interface.
const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);
const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
const GATEWAY_MAC: &str = "02:00:00:00:00:fe";
const IFNAMSIZ: usize = 15;

/// The interfaces to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Holds the node's local addresses; NodePort / LB / external-IP traffic arrives here.
    pub external: String,
    pub local_addresses: Vec<IpAddr>,
    /// The host side of a pod veth: where pod traffic arrives.
    pub pod: String,
    /// The bridge the pod veth is a port of (detectLocalMode BridgeInterface).
    pub bridge: Option<String>,
    /// This node's pods: routed to the pod side.
    pub pod_routes: Vec<IpNet>,
}

impl Layout {
    /// Names the interfaces so the agent's settings classify them as on a
    /// node: the external one as configured (else `eth0`), the pod one
    /// matching the pod-interface prefix or bridge of detectLocalMode.
    pub fn new(
        settings: &EbpfNodeSettings,
        local_addresses: Vec<IpAddr>,
        pod_routes: Vec<IpNet>,
    ) -> Self {
        let pod_prefix = match &settings.detect_local {
            DetectLocal::InterfaceNamePrefix(p) if !p.is_empty() => p.clone(),
            _ => settings
                .pod_interface_prefixes
                .first()
                .cloned()
                .unwrap_or_else(|| "veth".into()),
        };
        let pod = truncate(format!("{pod_prefix}xpl0"));
        let bridge = match &settings.detect_local {
            DetectLocal::BridgeInterface(b) if !b.is_empty() => Some(truncate(b.clone())),
            _ => None,
        };
        let mut pod_like: Vec<&str> = settings
            .pod_interface_prefixes
            .iter()
            .map(String::as_str)
            .collect();
        pod_like.push(&pod_prefix);
        let taken = |name: &str| {
            name == pod
                || bridge.as_deref() == Some(name)
                || pod_like
                    .iter()
                    .any(|p| !p.is_empty() && name.starts_with(p))
        };
        let external = settings
            .external_interfaces
            .first()
            .cloned()
            .map(truncate)
            .filter(|n| !taken(n))
            .or_else(|| {
                ["eth0", "xplext0"]
                    .into_iter()
                    .find(|n| !taken(n))
                    .map(Into::into)
            })
            .unwrap_or_else(|| "xplext0".into());
        Layout {
            external,
            local_addresses,
            pod,
            bridge,
            pod_routes,
        }
    }
}

fn truncate(mut name: String) -> String {
    while name.len() > IFNAMSIZ {
        name.pop();
    }
    name
}

/// The namespace as the agent would read it.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub host: HostNetwork,
    pub external_ifindex: u32,
    pub pod_ifindex: u32,
}

/// Moves the calling thread into a fresh network namespace and builds `layout` in it.
pub fn enter(layout: &Layout) -> anyhow::Result<Sandbox> {
    // SAFETY: unshare affects only this thread; child processes inherit it.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("entering a private network namespace: {e} (explain needs root)");
    }
    build(layout).context("setting up the private network namespace")
}

fn build(layout: &Layout) -> anyhow::Result<Sandbox> {
    ip(&["link", "set", "lo", "up"])?;
    // /proc/sys/net follows the namespace of the thread that opens it.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .context("enabling forwarding (net.ipv4.ip_forward)")?;
    // The FIB helper answers "forwarding disabled" for IPv6 without it.
    std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")
        .context("enabling forwarding (net.ipv6.conf.all.forwarding)")?;

    let ext = layout.external.as_str();
    ip(&[
        "link", "add", ext, "type", "veth", "peer", "name", "xplpeer0",
    ])?;
    ip(&["link", "set", "xplpeer0", "up"])?;
    ip(&["link", "set", ext, "up"])?;
    for addr in &layout.local_addresses {
        let host = IpNet::from(*addr).to_string();
        let mut args = vec!["addr", "add", &host, "dev", ext];
        if addr.is_ipv6() {
            // No duplicate address detection: the address is usable at once.
            args.push("nodad");
        }
        ip(&args)?;
    }
    for (family, gateway) in [("-4", IpAddr::V4(GATEWAY)), ("-6", IpAddr::V6(GATEWAY6))] {
        let gateway = gateway.to_string();
        ip(&[
            "neigh",
            "add",
            &gateway,
            "lladdr",
            GATEWAY_MAC,
            "dev",
            ext,
            "nud",
            "permanent",
        ])?;
        ip(&[
            family, "route", "add", "default", "via", &gateway, "dev", ext, "onlink",
        ])?;
    }

    let pod = layout.pod.as_str();
    ip(&[
        "link", "add", pod, "type", "veth", "peer", "name", "xplpeer1",
    ])?;
    ip(&["link", "set", "xplpeer1", "up"])?;
    let pod_route_dev = match &layout.bridge {
        Some(bridge) => {
            ip(&["link", "add", bridge, "type", "bridge"])?;
            ip(&["link", "set", bridge, "up"])?;
            ip(&["link", "set", pod, "master", bridge])?;
            bridge.as_str()
        }
        None => pod,
    };
    ip(&["link", "set", pod, "up"])?;
    for net in &layout.pod_routes {
        ip(&["route", "replace", &net.to_string(), "dev", pod_route_dev])?;
    }

    let external_ifindex = ifindex(ext)?;
    let pod_ifindex = ifindex(pod)?;
    let mut interfaces = vec![
        HostInterface {
            name: "lo".into(),
            index: ifindex("lo")?,
            master: None,
            peer_in_other_netns: false,
            ipv4: vec![Ipv4Addr::LOCALHOST],
            ipv6: vec![Ipv6Addr::LOCALHOST],
        },
        HostInterface {
            name: ext.into(),
            index: external_ifindex,
            master: None,
            peer_in_other_netns: false,
            ipv4: layout
                .local_addresses
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V4(a) => Some(*a),
                    IpAddr::V6(_) => None,
                })
                .collect(),
            ipv6: layout
                .local_addresses
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V6(a) => Some(*a),
                    IpAddr::V4(_) => None,
                })
                .collect(),
        },
        HostInterface {
            name: pod.into(),
            index: pod_ifindex,
            master: layout.bridge.clone(),
            peer_in_other_netns: false,
            ipv4: Vec::new(),
            ipv6: Vec::new(),
        },
    ];
    if let Some(bridge) = &layout.bridge {
        interfaces.push(HostInterface {
            name: bridge.clone(),
            index: ifindex(bridge)?,
            master: None,
            peer_in_other_netns: false,
            ipv4: Vec::new(),
            ipv6: Vec::new(),
        });
    }
    interfaces.sort_by_key(|i| i.index);
    Ok(Sandbox {
        host: HostNetwork {
            interfaces,
            default_route_interface: Some(ext.into()),
            ..HostNetwork::default()
        },
        external_ifindex,
        pod_ifindex,
    })
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The ifindex in this thread's namespace (/sys/class/net shows the mounter's).
pub fn ifindex(name: &str) -> anyhow::Result<u32> {
    let c = CString::new(name).context("interface name")?;
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        bail!("no interface {name}");
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{GoDuration, ebpf::BpfConntrackParams};

    fn settings(detect_local: DetectLocal, external: &[&str]) -> EbpfNodeSettings {
        EbpfNodeSettings {
            conntrack: BpfConntrackParams {
                max_entries: 0,
                tcp_established: GoDuration::from_secs(0),
                tcp_close_wait: GoDuration::from_secs(0),
                udp: GoDuration::from_secs(0),
                udp_stream: GoDuration::from_secs(0),
            },
            masquerade_all: false,
            detect_local,
            external_interfaces: external.iter().map(|s| s.to_string()).collect(),
            pod_interface_prefixes: vec!["veth".into(), "cali".into()],
            localhost_node_ports: false,
            socket_lb: Default::default(),
            maglev: Default::default(),
            ephemeral_ports: crate::modes::ebpf::node::LINUX_DEFAULT_EPHEMERAL,
        }
    }

    #[test]
    fn interfaces_are_named_for_the_detector() {
        let l = Layout::new(&settings(DetectLocal::None, &[]), vec![], vec![]);
        assert_eq!(
            (l.external.as_str(), l.pod.as_str(), l.bridge),
            ("eth0", "vethxpl0", None)
        );
        let l = Layout::new(
            &settings(DetectLocal::InterfaceNamePrefix("eth".into()), &[]),
            vec![],
            vec![],
        );
        assert_eq!(
            (l.external.as_str(), l.pod.as_str()),
            ("xplext0", "ethxpl0")
        );
        let l = Layout::new(
            &settings(DetectLocal::BridgeInterface("cbr0".into()), &["ens5"]),
            vec![],
            vec![],
        );
        assert_eq!(l.external, "ens5");
        assert_eq!(l.bridge.as_deref(), Some("cbr0"));
        let l = Layout::new(
            &settings(
                DetectLocal::InterfaceNamePrefix("averyveryverylongprefix".into()),
                &[],
            ),
            vec![],
            vec![],
        );
        assert_eq!(l.pod.len(), 15);
    }
}
