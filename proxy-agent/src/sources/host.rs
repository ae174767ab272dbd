//! The host source: this node's interfaces, their addresses and the default
//! route, as seen from the agent's network namespace. It polls and publishes
//! a snapshot whenever something changed, both as a [`SourceEvent`] for the
//! sync engine and on a watch channel for a mode's own consumers (the ebpf
//! mode keeps its programs attached from it).

use std::{
    collections::BTreeMap,
    ffi::CStr,
    fs, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use futures::Stream;
use tokio::sync::watch;
use tracing::{info, warn};

use super::SourceEvent;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostInterface {
    pub name: String,
    pub index: u32,
    /// The device this one is enslaved to (a bridge port's bridge).
    pub master: Option<String>,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub interfaces: Vec<HostInterface>,
    /// The interface of the IPv4 default route with the lowest metric.
    pub default_route_interface: Option<String>,
}

impl HostNetwork {
    /// Lists every interface (from /sys/class/net), its addresses
    /// (getifaddrs) and the default route (/proc/net/route).
    pub fn read() -> io::Result<Self> {
        let mut by_device: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (label, addr) in addresses()? {
            // Labelled secondary addresses ("eth0:1") belong to their device.
            let device = label.split(':').next().unwrap_or(&label).to_owned();
            by_device.entry(device).or_default().push(addr);
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
            let mut iface = HostInterface {
                name,
                index,
                master,
                ..HostInterface::default()
            };
            for addr in by_device.remove(&iface.name).unwrap_or_default() {
                match addr {
                    IpAddr::V4(a) => iface.ipv4.push(a),
                    IpAddr::V6(a) => iface.ipv6.push(a),
                }
            }
            interfaces.push(iface);
        }
        interfaces.sort_by_key(|i| i.index);
        let routes = fs::read_to_string("/proc/net/route").unwrap_or_default();
        Ok(HostNetwork {
            interfaces,
            default_route_interface: default_route_interface(&routes),
        })
    }
}

/// Publishes the host's network; [`HostSource::run`] keeps it current.
pub struct HostSource {
    tx: watch::Sender<Arc<HostNetwork>>,
    interval: Duration,
}

impl HostSource {
    /// Reads the host once, so the first snapshot is there before anything starts.
    pub fn new(interval: Duration) -> io::Result<Self> {
        let (tx, _) = watch::channel(Arc::new(HostNetwork::read()?));
        Ok(HostSource { tx, interval })
    }

    pub fn current(&self) -> Arc<HostNetwork> {
        self.tx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<HostNetwork>> {
        self.tx.subscribe()
    }

    /// The current snapshot, then one event per change.
    pub fn events(&self) -> impl Stream<Item = SourceEvent> + Send + use<> {
        let mut rx = self.tx.subscribe();
        rx.mark_changed();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            let host = rx.borrow_and_update().clone();
            Some((SourceEvent::HostChanged(host), rx))
        })
    }

    /// Polls the host and publishes what changed; never returns.
    pub async fn run(&self) {
        let mut tick = tokio::time::interval(self.interval);
        loop {
            tick.tick().await;
            match HostNetwork::read() {
                Ok(host) => {
                    self.tx.send_if_modified(|current| {
                        if **current == host {
                            return false;
                        }
                        info!(
                            interfaces = host.interfaces.len(),
                            "the host's interfaces or addresses changed"
                        );
                        *current = Arc::new(host);
                        true
                    });
                }
                Err(e) => warn!(error = %e, "reading the node's interfaces"),
            }
        }
    }
}

/// Every IPv4 and IPv6 address with its interface label, from getifaddrs(3).
fn addresses() -> io::Result<Vec<(String, IpAddr)>> {
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
        let addr = match i32::from(family) {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        out.push((name.to_string_lossy().into_owned(), addr));
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
    fn the_live_host_lists_its_loopback_interface() {
        let host = HostNetwork::read().unwrap();
        let lo = host.interfaces.iter().find(|i| i.name == "lo").unwrap();
        assert_eq!(lo.index, 1);
        assert!(lo.ipv4.iter().all(Ipv4Addr::is_loopback));
    }
}
