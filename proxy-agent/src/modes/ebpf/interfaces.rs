//! What kind of device an interface is (its kernel driver).

use std::io;

/// The kernel driver behind `name` (ETHTOOL_GDRVINFO), e.g. "veth".
pub fn driver(name: &str) -> io::Result<String> {
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 0x03;
    if name.len() >= 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 160],
    };
    let mut req = IfReq {
        name: [0; 16],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: a datagram socket used only for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: req and info outlive the call; the kernel writes at most size_of::<DrvInfo>().
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: fd was opened above.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}
