#![allow(dead_code)] // each bench uses its own subset
//! Shared by the datapath benches that run the programs in a throwaway
//! network namespace: the namespace, frames, and the statistics.

use std::net::IpAddr;

use anyhow::{Context as _, ensure};
use proxy_agent::cli::packet::{Frame, Layout, fix_checksums};

pub const POD_IFACE: &str = "pod0";
pub const UPLINK: &str = "eth0";
pub const GATEWAY_MAC: &str = "02:00:00:00:00:01";

/// Runs `run` as the bench `name`: as root (it loads BPF programs), and an
/// error is one line and exit status 1.
pub fn main(name: &str, run: fn() -> anyhow::Result<()>) {
    // SAFETY: geteuid has no preconditions.
    let result = if unsafe { libc::geteuid() } != 0 {
        Err(anyhow::anyhow!("run it as root: it loads BPF programs"))
    } else {
        run()
    };
    if let Err(e) = result {
        eprintln!("{name} bench: error: {e:#}");
        std::process::exit(1);
    }
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// An Ethernet / IP / TCP frame with TTL or hop limit 255 (a loop takes
/// one per iteration), the given TCP flags and valid checksums.
pub fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Vec<u8> {
    let mut pkt = Frame::tcp(src, sport, dst, dport).build(&[]);
    let layout = Layout::of(&pkt).expect("an IP frame");
    pkt[layout.ttl()] = 255;
    pkt[layout.l4 + 13] = flags;
    fix_checksums(&mut pkt);
    pkt
}

/// A network namespace of this (single-threaded) process that disappears
/// with it: a pod interface, and an uplink whose permanent neighbour is the
/// next hop for backends and VIPs of both families.
pub fn enter_throwaway_netns() -> anyhow::Result<u32> {
    // SAFETY: unshare has no memory-safety preconditions; the process has one thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
    }
    let ip = |args: &[&str]| testbed::netns::ip(None, args);
    ip(&["link", "set", "lo", "up"])?;
    for iface in [POD_IFACE, UPLINK] {
        let peer = format!("{iface}-peer");
        ip(&["link", "add", iface, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "up"])?;
        ip(&["link", "set", iface, "up"])?;
    }
    ip(&["addr", "add", "198.18.255.2/24", "dev", UPLINK])?;
    ip(&[
        "-6",
        "addr",
        "add",
        "2001:db8:ff::2/64",
        "dev",
        UPLINK,
        "nodad",
    ])?;
    for gateway in ["198.18.255.1", "2001:db8:ff::1"] {
        ip(&[
            "neigh",
            "replace",
            gateway,
            "lladdr",
            GATEWAY_MAC,
            "nud",
            "permanent",
            "dev",
            UPLINK,
        ])?;
    }
    for net in ["198.18.0.0/17", "198.19.0.0/16"] {
        ip(&["route", "add", net, "via", "198.18.255.1", "dev", UPLINK])?;
    }
    for net in ["2001:db8:1::/64", "2001:db8:ffff::/64"] {
        ip(&[
            "-6",
            "route",
            "add",
            net,
            "via",
            "2001:db8:ff::1",
            "dev",
            UPLINK,
        ])?;
    }
    // bpf_fib_lookup answers only when the arrival interface forwards.
    std::fs::write("/proc/sys/net/ipv4/conf/all/forwarding", "1")?;
    std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")?;
    let c = std::ffi::CString::new(POD_IFACE)?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    ensure!(index != 0, "{POD_IFACE} has no ifindex");
    Ok(index)
}

/// Closes with a RST instead of a FIN: no TIME_WAIT piles up over thousands of connections.
pub fn socket_linger_zero(conn: &std::net::TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid struct of the size given.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
