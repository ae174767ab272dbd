//! Reading the host's interfaces, addresses and default route (in the
//! agent's network namespace), and the ephemeral port range check.

use std::{collections::BTreeMap, ffi::CStr, fs, io, net::Ipv4Addr};

use super::{SNAT_PORT_MAX, SNAT_PORT_MIN};

const _: () = assert!(SNAT_PORT_MAX == u16::MAX);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostInterface {
    pub name: String,
    pub index: u32,
    /// The device this one is enslaved to (a bridge port's bridge).
    pub master: Option<String>,
    pub ipv4: Vec<Ipv4Addr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub interfaces: Vec<HostInterface>,
    /// The interface of the IPv4 default route with the lowest metric.
    pub default_route_interface: Option<String>,
}

impl HostNetwork {
    /// Lists every interface (from /sys/class/net), its IPv4 addresses
    /// (getifaddrs) and the default route (/proc/net/route).
    pub fn read() -> io::Result<Self> {
        let mut addresses: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
        for (label, addr) in ipv4_addresses()? {
            // Labelled secondary addresses ("eth0:1") belong to their device.
            let device = label.split(':').next().unwrap_or(&label).to_owned();
            addresses.entry(device).or_default().push(addr);
        }
        let mut interfaces = Vec::new();
        for entry in fs::read_dir("/sys/class/net")? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let dir = format!("/sys/class/net/{name}");
            // The interface may vanish between listing and reading: skip it then.
            let Some(index) = fs::read_to_string(format!("{dir}/ifindex"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
            else {
                continue;
            };
            let master = fs::read_link(format!("{dir}/master"))
                .ok()
                .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()));
            let ipv4 = addresses.remove(&name).unwrap_or_default();
            interfaces.push(HostInterface {
                name,
                index,
                master,
                ipv4,
            });
        }
        interfaces.sort_by_key(|i| i.index);
        let routes = fs::read_to_string("/proc/net/route").unwrap_or_default();
        Ok(HostNetwork {
            interfaces,
            default_route_interface: default_route_interface(&routes),
        })
    }
}

/// Every IPv4 address with its interface label, from getifaddrs(3).
fn ipv4_addresses() -> io::Result<Vec<(String, Ipv4Addr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: on success getifaddrs points `head` at a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list, alive until freeifaddrs.
        let ifa = unsafe { &*cursor };
        cursor = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of the family it names.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        out.push((
            name.to_string_lossy().into_owned(),
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        ));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The interface of the lowest-metric 0.0.0.0/0 route in /proc/net/route text.
fn default_route_interface(routes: &str) -> Option<String> {
    const RTF_UP: u32 = 1;
    routes
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, flags, metric, mask) =
                (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            (*dest == "00000000" && *mask == "00000000" && flags & RTF_UP != 0)
                .then(|| Some((metric.parse::<u32>().ok()?, iface.to_string())))
                .flatten()
        })
        .min()
        .map(|(_, iface)| iface)
}

/// The local port range from `/proc/sys/net/ipv4/ip_local_port_range` text,
/// when it overlaps the masquerade source ports.
pub fn snat_port_overlap(local_port_range: &str) -> Option<(u16, u16)> {
    let mut it = local_port_range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high))) = (it.next(), it.next()) else {
        return None;
    };
    // The masquerade range runs to the last port, so only the upper end matters.
    (high >= SNAT_PORT_MIN).then_some((low, high))
}

/// Warns when the node's own connections may pick masquerade source ports:
/// the datapath would then translate their replies as a service flow's.
pub fn warn_if_snat_ports_overlap() {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    if let Some((low, high)) = snat_port_overlap(&text) {
        tracing::warn!(
            local_ports = %format!("{low}-{high}"),
            masquerade_ports = %format!("{SNAT_PORT_MIN}-{SNAT_PORT_MAX}"),
            "net.ipv4.ip_local_port_range overlaps the ports used for masqueraded flows; \
             connections of the node itself may collide with them"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
";

    #[test]
    fn default_route_is_the_lowest_metric() {
        assert_eq!(default_route_interface(ROUTES).as_deref(), Some("eth0"));
        assert_eq!(default_route_interface("Iface\tDestination\n"), None);
    }

    #[test]
    fn snat_ports_overlap_only_when_the_ranges_meet() {
        assert_eq!(snat_port_overlap("32768\t60999\n"), None);
        assert_eq!(snat_port_overlap("1024\t65535\n"), Some((1024, 65535)));
        assert_eq!(snat_port_overlap("61000 61000"), Some((61000, 61000)));
        assert_eq!(snat_port_overlap("garbage"), None);
    }

    #[test]
    fn the_live_host_lists_its_loopback_interface() {
        let host = HostNetwork::read().unwrap();
        let lo = host.interfaces.iter().find(|i| i.name == "lo").unwrap();
        assert_eq!(lo.index, 1);
        assert!(lo.ipv4.iter().all(Ipv4Addr::is_loopback));
    }
}
