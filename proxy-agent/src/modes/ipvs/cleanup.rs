//! IPVS leftovers: every virtual service (flushed over generic netlink, as upstream's
//! `ipvs.Flush()`), the `kube-ipvs0` dummy interface, and the `KUBE-*` ipsets.
//!
//! The netlink requests are built by pure functions and sent through [`GenlTransport`], so the
//! exact bytes can be checked without a kernel that has IPVS (these test kernels do not).

use std::io;

use crate::cleanup::exec::CommandRunner;
use crate::cleanup::{Removed, Report};

pub const DUMMY_IFACE: &str = "kube-ipvs0";

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
pub const IPVS_CMD_FLUSH: u8 = 17;
pub const IPVS_GENL_VERSION: u8 = 1;
const NETLINK_GENERIC: i32 = 16;

/// Sends one netlink request and returns every reply message (headers included) up to and
/// including the final ACK / error / DONE.
pub trait GenlTransport {
    fn request(&mut self, msg: &[u8]) -> io::Result<Vec<Vec<u8>>>;
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A generic netlink request: nlmsghdr + genlmsghdr + attributes.
pub fn genl_message(
    family: u16,
    flags: u16,
    seq: u32,
    cmd: u8,
    version: u8,
    attrs: &[(u16, &[u8])],
) -> Vec<u8> {
    let mut body = vec![cmd, version, 0, 0];
    for (ty, payload) in attrs {
        let len = 4 + payload.len();
        body.extend_from_slice(&(len as u16).to_ne_bytes());
        body.extend_from_slice(&ty.to_ne_bytes());
        body.extend_from_slice(payload);
        body.resize(align4(body.len()), 0);
    }
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&family.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// CTRL_CMD_GETFAMILY for "IPVS".
pub fn get_family_request(seq: u32) -> Vec<u8> {
    genl_message(
        GENL_ID_CTRL,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
        &[(CTRL_ATTR_FAMILY_NAME, b"IPVS\0")],
    )
}

/// IPVS_CMD_GET_SERVICE dump (to count what is there).
pub fn list_services_request(family: u16, seq: u32) -> Vec<u8> {
    genl_message(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        IPVS_CMD_GET_SERVICE,
        IPVS_GENL_VERSION,
        &[],
    )
}

/// IPVS_CMD_FLUSH: delete every virtual service.
pub fn flush_request(family: u16, seq: u32) -> Vec<u8> {
    genl_message(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        IPVS_CMD_FLUSH,
        IPVS_GENL_VERSION,
        &[],
    )
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off + 2)
        .map(|s| u16::from_ne_bytes([s[0], s[1]]))
}

/// The errno of an NLMSG_ERROR reply (0 = ACK); `None` for other messages.
fn error_code(msg: &[u8]) -> Option<i32> {
    (u16_at(msg, 4)? == NLMSG_ERROR).then(|| {
        msg.get(16..20)
            .map(|s| i32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    })?
}

/// The family id from a CTRL_CMD_NEWFAMILY reply.
fn family_id(msg: &[u8]) -> Option<u16> {
    let mut off = 20;
    while off + 4 <= msg.len() {
        let len = u16_at(msg, off)? as usize;
        let ty = u16_at(msg, off + 2)? & 0x3fff;
        if len < 4 {
            return None;
        }
        if ty == CTRL_ATTR_FAMILY_ID {
            return u16_at(msg, off + 4);
        }
        off += align4(len);
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvsOutcome {
    /// The kernel has no IPVS: nothing can be there.
    NotAvailable,
    /// IPVS present; this many virtual services were flushed (0 = nothing sent).
    Flushed(usize),
}

fn check_ack(replies: &[Vec<u8>], what: &str) -> io::Result<()> {
    match replies.iter().find_map(|m| error_code(m)) {
        Some(0) | None => Ok(()),
        Some(e) => Err(io::Error::other(format!(
            "{what}: {}",
            io::Error::from_raw_os_error(-e)
        ))),
    }
}

/// The IPVS generic netlink family id; `None` when the kernel has no IPVS.
pub fn resolve_family(t: &mut dyn GenlTransport) -> io::Result<Option<u16>> {
    let replies = t.request(&get_family_request(1))?;
    if let Some(e) = replies
        .iter()
        .find_map(|m| error_code(m))
        .filter(|e| *e != 0)
    {
        if -e == libc::ENOENT {
            return Ok(None);
        }
        return Err(io::Error::other(format!(
            "resolving the IPVS netlink family: {}",
            io::Error::from_raw_os_error(-e)
        )));
    }
    match replies.iter().find_map(|m| {
        (u16_at(m, 4) == Some(GENL_ID_CTRL))
            .then(|| family_id(m))
            .flatten()
    }) {
        Some(f) => Ok(Some(f)),
        None => Err(io::Error::other("no IPVS family id in the netlink reply")),
    }
}

/// The errno of the first error in `replies`, as an error naming `what`.
pub fn check_replies(replies: &[Vec<u8>], what: &str) -> io::Result<()> {
    check_ack(replies, what)
}

/// Resolves the IPVS family, counts the services and flushes them if there are any.
pub fn flush(t: &mut dyn GenlTransport) -> io::Result<IpvsOutcome> {
    let Some(family) = resolve_family(t)? else {
        return Ok(IpvsOutcome::NotAvailable);
    };
    let replies = t.request(&list_services_request(family, 2))?;
    check_ack(&replies, "listing IPVS services")?;
    let count = replies
        .iter()
        .filter(|m| u16_at(m, 4) == Some(family))
        .count();
    if count == 0 {
        return Ok(IpvsOutcome::Flushed(0));
    }
    check_ack(&t.request(&flush_request(family, 3))?, "flushing IPVS")?;
    Ok(IpvsOutcome::Flushed(count))
}

/// The kernel's generic netlink socket.
#[derive(Debug, Default)]
pub struct NetlinkTransport;

impl GenlTransport for NetlinkTransport {
    fn request(&mut self, msg: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        // SAFETY: plain socket syscalls on a descriptor owned by this function.
        unsafe {
            let fd = libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_GENERIC,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let close = |r| {
                libc::close(fd);
                r
            };
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            if libc::sendto(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ) < 0
            {
                return close(Err(io::Error::last_os_error()));
            }
            let dump = u16_at(msg, 6).unwrap_or(0) & NLM_F_DUMP != 0;
            let mut out = Vec::new();
            let mut buf = vec![0u8; 65536];
            loop {
                let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                if n < 0 {
                    return close(Err(io::Error::last_os_error()));
                }
                let mut off = 0usize;
                let n = n as usize;
                let mut finished = false;
                while off + 16 <= n {
                    let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
                    if len < 16 || off + len > n {
                        break;
                    }
                    let m = buf[off..off + len].to_vec();
                    let ty = u16_at(&m, 4).unwrap_or(0);
                    let wants_ack = u16_at(msg, 6).unwrap_or(0) & NLM_F_ACK != 0;
                    // ERROR ends everything (it is also the ACK), DONE ends a dump, and a
                    // plain request without ACK ends with its single reply.
                    finished |= ty == NLMSG_ERROR || ty == NLMSG_DONE || (!dump && !wants_ack);
                    out.push(m);
                    off += align4(len);
                }
                if finished {
                    return close(Ok(out));
                }
            }
        }
    }
}

/// Replies a fake kernel gives; records every request.
#[derive(Debug, Default)]
pub struct FakeGenl {
    pub requests: Vec<Vec<u8>>,
    pub replies: std::collections::VecDeque<Vec<Vec<u8>>>,
}

impl GenlTransport for FakeGenl {
    fn request(&mut self, msg: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.requests.push(msg.to_vec());
        Ok(self.replies.pop_front().unwrap_or_default())
    }
}

/// Helpers to build kernel replies in tests.
pub mod reply {
    use super::*;

    pub fn ack(errno: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&0u64.to_ne_bytes());
        m.extend_from_slice(&(-errno).to_ne_bytes());
        m.extend_from_slice(&[0u8; 16]);
        m
    }
    pub fn done() -> Vec<u8> {
        let mut m = genl_message(NLMSG_DONE, 0, 0, 0, 0, &[]);
        m.truncate(16);
        m[0..4].copy_from_slice(&16u32.to_ne_bytes());
        m
    }
    pub fn family(id: u16) -> Vec<u8> {
        genl_message(
            GENL_ID_CTRL,
            0,
            1,
            1,
            1,
            &[
                (CTRL_ATTR_FAMILY_NAME, b"IPVS\0"),
                (CTRL_ATTR_FAMILY_ID, &id.to_ne_bytes()),
            ],
        )
    }
    pub fn service(family_id: u16) -> Vec<u8> {
        genl_message(family_id, 2, 2, 1, 1, &[])
    }
}

/// Flushes IPVS, removes the dummy interface (only if it is a dummy, as upstream) and the
/// `KUBE-*` ipsets.
pub fn cleanup(t: &mut dyn GenlTransport, run: &mut dyn CommandRunner, report: &mut Report) {
    match flush(t) {
        Ok(IpvsOutcome::Flushed(n)) if n > 0 => {
            report.removed.push(Removed::IpvsServices { count: n })
        }
        Ok(_) => {}
        Err(e) => report.errors.push(format!("IPVS flush: {e}")),
    }
    if let Ok(o) = run.run("ip", &["-d", "-o", "link", "show", DUMMY_IFACE], None)
        && o.success
        && !o.stdout.trim().is_empty()
    {
        if o.stdout.split_whitespace().any(|w| w == "dummy") {
            match run.run("ip", &["link", "delete", DUMMY_IFACE], None) {
                Ok(d) if d.success => report.removed.push(Removed::Link {
                    name: DUMMY_IFACE.into(),
                }),
                Ok(d) => report
                    .errors
                    .push(format!("ip link delete {DUMMY_IFACE}: {}", d.stderr.trim())),
                Err(e) => report
                    .errors
                    .push(format!("ip link delete {DUMMY_IFACE}: {e}")),
            }
        } else {
            report.notes.push(format!(
                "left interface {DUMMY_IFACE} alone: it is not a dummy interface"
            ));
        }
    }
    if let Ok(o) = run.run("ipset", &["list", "-n"], None)
        && o.success
    {
        for name in o
            .stdout
            .lines()
            .map(str::trim)
            .filter(|n| n.starts_with("KUBE-"))
        {
            match run.run("ipset", &["destroy", name], None) {
                Ok(d) if d.success => report.removed.push(Removed::IpSet { name: name.into() }),
                Ok(d) => report
                    .errors
                    .push(format!("ipset destroy {name}: {}", d.stderr.trim())),
                Err(e) => report.errors.push(format!("ipset destroy {name}: {e}")),
            }
        }
    }
}
