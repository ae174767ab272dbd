//! Interface offloads, read and set with the SIOCETHTOOL ioctl from inside a
//! namespace (no dependency on the `ethtool` binary).

use std::{io, mem, os::fd::AsRawFd as _};

use anyhow::Context as _;
use socket2::{Domain, Socket, Type};

use crate::netns;

/// An offload with an ethtool get/set command pair (`linux/ethtool.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    TxChecksum,
    Tso,
    Gso,
    Gro,
}

impl Offload {
    fn get_cmd(self) -> u32 {
        match self {
            Offload::TxChecksum => 0x16, // ETHTOOL_GTXCSUM
            Offload::Tso => 0x1e,        // ETHTOOL_GTSO
            Offload::Gso => 0x23,        // ETHTOOL_GGSO
            Offload::Gro => 0x2b,        // ETHTOOL_GGRO
        }
    }

    fn set_cmd(self) -> u32 {
        self.get_cmd() + 1
    }
}

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Whether `offload` is on for `iface` in namespace `ns`.
pub fn offload(ns: &str, iface: &str, offload: Offload) -> anyhow::Result<bool> {
    let iface_owned = iface.to_owned();
    let data = netns::run_in(ns, move || {
        ethtool_value(&iface_owned, offload.get_cmd(), 0)
    })?
    .with_context(|| format!("reading {offload:?} of {iface} in {ns}"))?;
    Ok(data != 0)
}

/// Turns `offload` on or off for `iface` in namespace `ns`.
pub fn set_offload(ns: &str, iface: &str, offload: Offload, on: bool) -> anyhow::Result<()> {
    let iface_owned = iface.to_owned();
    netns::run_in(ns, move || {
        ethtool_value(&iface_owned, offload.set_cmd(), u32::from(on))
    })?
    .with_context(|| format!("setting {offload:?} of {iface} in {ns} to {on}"))?;
    Ok(())
}

/// Runs one ethtool_value command on `iface` of the calling thread's namespace.
fn ethtool_value(iface: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let name = iface.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    let mut value = EthtoolValue { cmd, data };
    // SAFETY: ifreq is plain data, valid when zeroed.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&raw mut value).cast();
    // SAFETY: req names a NUL-terminated interface and points at `value`,
    // which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data)
}
