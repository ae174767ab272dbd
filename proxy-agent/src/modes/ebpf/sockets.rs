//! Socket-level balancing's attachment: the cgroup socket-address programs
//! (and `sock_release`, which forgets a closed socket) on the cgroup v2
//! root (or `socketLB.cgroupPath`), so every process of the node (the
//! kubelet, hostNetwork pods) and, unless `hostNamespaceOnly`, every pod has
//! its connections to services pointed at a backend before any packet exists.
//!
//! With a [`PinLayout`] each link is pinned as `links/cgroup-<program>` and
//! outlives the agent. A new agent attaches its own programs first and only
//! then renames its pins over the old ones, which detaches them: the cgroup
//! is never without the hooks, and for that moment both run (the second
//! finds a backend address, not a service, and leaves it alone).

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{CgroupAttachMode, Program, links::FdLink},
};
use tracing::{info, warn};

use super::{SOCKET_PROGRAMS, load_socket_programs, node::SocketLbSettings, pin::PinLayout};
use crate::options::ProxyOptions;

/// The socket programs attached to one cgroup.
pub struct SocketHooks {
    cgroup: PathBuf,
    links: Vec<HeldLink>,
}

struct HeldLink {
    /// Keeps the link while this process runs; with `pin`, the pin keeps it after.
    _link: FdLink,
    pin: Option<PathBuf>,
}

impl SocketHooks {
    /// Attaches the loaded socket programs of `ebpf` to the cgroup v2
    /// directory `cgroup`, taking over the links an earlier agent pinned.
    pub fn attach(
        ebpf: &mut Ebpf,
        cgroup: &Path,
        pins: Option<&PinLayout>,
    ) -> anyhow::Result<Self> {
        let dir =
            File::open(cgroup).with_context(|| format!("opening cgroup {}", cgroup.display()))?;
        let mut links = Vec::new();
        for name in SOCKET_PROGRAMS {
            let program = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing from the object"))?;
            let attaching = || format!("attaching {name} to cgroup {}", cgroup.display());
            let no_links = || format!("{name}: this kernel has no cgroup links (Linux 5.7)");
            // A cgroup link always runs beside other programs; BPF_LINK_CREATE
            // takes no mode flags (the "single" default is 0).
            let link = match program {
                Program::CgroupSockAddr(prog) => {
                    let id = prog
                        .attach(&dir, CgroupAttachMode::Single)
                        .with_context(attaching)?;
                    FdLink::try_from(prog.take_link(id)?).with_context(no_links)?
                }
                Program::CgroupSock(prog) => {
                    let id = prog
                        .attach(&dir, CgroupAttachMode::Single)
                        .with_context(attaching)?;
                    FdLink::try_from(prog.take_link(id)?).with_context(no_links)?
                }
                _ => anyhow::bail!("program {name} is no cgroup socket program"),
            };
            links.push(match pins {
                Some(pins) => {
                    let path = pins.cgroup_link_path(name);
                    HeldLink {
                        _link: pin_over(link, &path)?,
                        pin: Some(path),
                    }
                }
                None => HeldLink {
                    _link: link,
                    pin: None,
                },
            });
        }
        Ok(SocketHooks {
            cgroup: cgroup.to_owned(),
            links,
        })
    }

    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Removes the pins (the hooks detach once this process lets go of
    /// them); for `pinning.detachOnExit`.
    pub fn unpin(&mut self) -> usize {
        self.links
            .iter_mut()
            .filter_map(|l| l.pin.take())
            .filter(|p| std::fs::remove_file(p).is_ok())
            .count()
    }
}

/// Socket-level balancing as configured: the hooks attached, or `None`
/// after saying once, in the log, why the node's own processes are not
/// served (`settings.enabled` is then cleared, so the datapath knows).
pub fn start(
    ebpf: &mut Ebpf,
    opts: &ProxyOptions,
    pins: Option<&PinLayout>,
    settings: &mut SocketLbSettings,
) -> Option<SocketHooks> {
    let unserved = "connections from the node's own processes (the kubelet, hostNetwork pods) to \
                    services are not translated, and localhost NodePorts are not served; pods and \
                    clients outside the node are served by the TC programs";
    if !settings.enabled {
        if let Some(pins) = pins {
            remove_pinned(pins);
        }
        warn!("socketLB.enabled is false: {unserved}");
        return None;
    }
    let attached = (|| {
        settings.host_netns_cookie = netns_cookie()
            .context("reading this network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14)")?;
        load_socket_programs(ebpf).context(
            "this kernel cannot run the socket hooks (cgroup connect4, sendmsg4, recvmsg4 and \
             getpeername4 with bpf_set_retval: Linux 5.18; sock_release)",
        )?;
        let cgroup = match opts.ebpf.socket_lb.cgroup_path.as_str() {
            "" => cgroup2_mount()?,
            path => PathBuf::from(path),
        };
        SocketHooks::attach(ebpf, &cgroup, pins)
    })();
    match attached {
        Ok(hooks) => {
            let pods = !settings.host_namespace_only;
            info!(
                cgroup = %hooks.cgroup().display(),
                pods,
                "socket-level balancing attached: the node's own processes{} reach services through \
                 the socket hooks, with no per-packet NAT; the TC programs serve {}clients outside \
                 the node, and whatever the hooks did not translate",
                if pods { " and pods' sockets" } else { "" },
                if pods { "" } else { "pods, " },
            );
            Some(hooks)
        }
        Err(e) => {
            settings.enabled = false;
            if let Some(pins) = pins {
                remove_pinned(pins);
            }
            warn!(error = %format!("{e:#}"), "socket-level balancing is unavailable: {unserved}");
            None
        }
    }
}

/// Pins `link` at `path`, replacing (and so detaching) what was pinned there.
fn pin_over(link: FdLink, path: &Path) -> anyhow::Result<FdLink> {
    let dir = path.parent().context("a link pin has a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("a link pin has a name")?;
    // A BPF filesystem refuses names with a dot.
    let staging = dir.join(format!("new-{}", name.to_string_lossy()));
    let _ = std::fs::remove_file(&staging);
    let pinned = link
        .pin(&staging)
        .with_context(|| format!("pinning a link at {}", staging.display()))?;
    std::fs::rename(&staging, path)
        .with_context(|| format!("moving the pin {} to {}", staging.display(), path.display()))?;
    Ok(FdLink::from(pinned))
}

/// Removes the socket-program pins an earlier agent left (socket-level
/// balancing is now off): their hooks detach.
pub fn remove_pinned(pins: &PinLayout) {
    for name in SOCKET_PROGRAMS {
        let path = pins.cgroup_link_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                info!(pin = %path.display(), "socket-level balancing is off: detached the socket hook an earlier agent left")
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(pin = %path.display(), error = %e, "removing a socket hook's pin"),
        }
    }
}

/// Where the cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`
/// (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on hybrid ones).
pub fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    cgroup2_mount_in(&text).context(
        "no cgroup v2 hierarchy is mounted (mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`, \
         or set socketLB.cgroupPath)",
    )
}

/// This process's cgroup directory on the cgroup v2 hierarchy mounted at
/// `root` (its path from `/proc/self/cgroup`, "0::/path").
pub fn own_cgroup(root: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let own = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .context("this process has no cgroup v2 membership")?;
    Ok(root.join(own.trim_start_matches('/')))
}

/// Moves this whole process into `cgroup` ("0" names the writer).
pub fn join_cgroup(cgroup: &Path) -> anyhow::Result<()> {
    std::fs::write(cgroup.join("cgroup.procs"), "0")
        .with_context(|| format!("joining cgroup {}", cgroup.display()))
}

/// The first cgroup2 mount of the whole hierarchy (root `/`) in a mountinfo table.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        let mount_point = fields.get(4)?;
        (fields.get(3) == Some(&"/")).then(|| PathBuf::from(unescape(mount_point)))
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The cookie of this thread's network namespace (SO_NETNS_COOKIE, Linux 5.14).
pub fn netns_cookie() -> io::Result<u64> {
    let socket =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    socket_option_u64(socket.as_raw_fd(), libc::SO_NETNS_COOKIE)
}

/// A 64-bit SOL_SOCKET option of `fd` (SO_COOKIE, SO_NETNS_COOKIE).
pub fn socket_option_u64(fd: std::os::fd::RawFd, option: libc::c_int) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` outlive the call and have the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_hybrid_and_unified_hosts() {
        let hybrid = "\
25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "\
29 24 0:25 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            cgroup2_mount_in(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let v1_only = "32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup2_mount_in(v1_only), None);
        let bind_of_a_subtree = "\
40 24 0:25 /kubepods /mnt/pods rw - cgroup2 cgroup2 rw
41 24 0:25 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup2_mount_in(bind_of_a_subtree),
            Some(PathBuf::from("/mnt/my cgroup")),
            "a bind mount of a subtree is not the root; escapes are undone"
        );
    }
}
