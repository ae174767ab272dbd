//! `--from host`: a connection the node itself opens meets the socket
//! hooks, not a packet program, and BPF_PROG_TEST_RUN cannot run those. So
//! the private load's own `sock_connect4` (`sock_connect6` for an IPv6
//! probe) is attached, for the moment of the
//! probe, to a cgroup made for it; this process joins that cgroup just long
//! enough to create one socket, in a network namespace of its own thread that
//! holds nothing but a loopback that is down, and connects it. The hook
//! decides before any route is looked up; the route lookup then fails, so
//! nothing is ever sent. The backend it chose is read from the private
//! `SOCKETS` (`SOCKETS6`) map by the socket's cookie; the live maps are
//! never touched.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::PathBuf,
};

use anyhow::{Context as _, bail};
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use proxy_common::{SockDirection, V4, V6, config::flags};

use super::{
    probe::{Probe, Proto},
    trace::{Datapath, Step},
};
use crate::{
    cli::packet::Frame,
    modes::ebpf::{
        family::AgentFamily as _,
        load_socket_programs,
        maps::NodeMaps as _,
        sockets::{cgroup2_mount, join_cgroup, netns_cookie, own_cgroup, socket_option_u64},
    },
};

/// The connect hook of each family.
pub const PROGRAMS: [&str; 2] = ["sock_connect4", "sock_connect6"];

fn program(probe: &Probe) -> &'static str {
    PROGRAMS[usize::from(probe.is_ipv6())]
}

/// What the hook did with the connection.
pub struct Outcome {
    pub step: Step,
    /// The packet the connection's first segment would be: to the backend
    /// when the hook chose one, else to the address asked for.
    pub output: Vec<u8>,
}

pub fn run(dp: &mut Datapath, probe: &Probe) -> anyhow::Result<Outcome> {
    let program = program(probe);
    let loaded = dp.ebpf.program(program).is_some_and(|p| p.fd().is_ok());
    if !loaded {
        load_socket_programs(&mut dp.ebpf)?;
    }
    let cgroup = ProbeCgroup::new()?;
    let prog: &mut CgroupSockAddr = dp
        .ebpf
        .program_mut(program)
        .context("the socket program is missing")?
        .try_into()?;
    let dir = std::fs::File::open(&cgroup.path)
        .with_context(|| format!("opening {}", cgroup.path.display()))?;
    let link = prog
        .attach(&dir, CgroupAttachMode::Single)
        .context("attaching the connect hook to the probe's cgroup")?;
    let maps = &mut dp.maps;
    let connected = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<(u64, Option<io::Error>)> {
            // SAFETY: affects only this scoped thread, which ends with the probe.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error())
                    .context("entering a private network namespace");
            }
            let mut config = maps.config.get(&0, 0).unwrap_or_default();
            config.host_netns_cookie = netns_cookie().context("reading the namespace cookie")?;
            config.flags |= flags::SOCKET_LB_HOST;
            maps.put_config(&config)?;
            let socket = cgroup.socket_inside(probe)?;
            let cookie = socket_option_u64(socket.as_raw_fd(), libc::SO_COOKIE)?;
            Ok((cookie, connect(&socket, probe.destination()).err()))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
    });
    let _ = prog.detach(link);
    let (cookie, error) = connected?;

    let reverse = SockDirection::Reverse as u8;
    let chosen: Option<SocketAddr> = if probe.is_ipv6() {
        dp.maps
            .v6
            .sockets
            .iter()
            .filter_map(Result::ok)
            .find(|(k, _)| k.cookie == cookie && k.direction == reverse)
            .map(|(k, _)| {
                SocketAddr::new(IpAddr::V6(V6::from_be(k.addr_be)), u16::from_be(k.port_be))
            })
    } else {
        dp.maps
            .sockets
            .iter()
            .filter_map(Result::ok)
            .find(|(k, _)| k.cookie == cookie && k.direction == reverse)
            .map(|(k, _)| {
                SocketAddr::new(IpAddr::V4(V4::from_be(k.addr_be)), u16::from_be(k.port_be))
            })
    };
    let refused = error
        .as_ref()
        .is_some_and(|e| e.raw_os_error() == Some(libc::ECONNREFUSED));
    let mut frame: Frame = probe.frame();
    if let Some(backend) = chosen {
        frame.dst = backend.ip();
        frame.dport = backend.port();
    }
    Ok(Outcome {
        step: Step {
            program,
            xdp: false,
            code: if refused { 0 } else { 1 },
        },
        output: frame.build(b""),
    })
}

fn connect(socket: &OwnedFd, dst: SocketAddr) -> io::Result<()> {
    let fd = socket.as_raw_fd();
    let rc = match dst {
        SocketAddr::V4(dst) => {
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: dst.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*dst.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of_val(&addr) as libc::socklen_t;
            // SAFETY: `addr` is a valid sockaddr_in of the size given.
            unsafe { libc::connect(fd, (&raw const addr).cast(), len) }
        }
        SocketAddr::V6(dst) => {
            let addr = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: dst.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: dst.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            let len = std::mem::size_of_val(&addr) as libc::socklen_t;
            // SAFETY: `addr` is a valid sockaddr_in6 of the size given.
            unsafe { libc::connect(fd, (&raw const addr).cast(), len) }
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A cgroup v2 directory for one probe, under the hierarchy's root (mounted
/// for the probe on a temporary directory where this mount namespace has
/// none, as under `ip netns exec`); removed, and unmounted, on drop.
struct ProbeCgroup {
    path: PathBuf,
    /// The cgroup this process came from, to go back to.
    home: PathBuf,
    mounted: Option<PathBuf>,
    /// Joining a cgroup moves the whole process: one probe at a time per
    /// process (explain runs from several threads of one test binary).
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static PROBE_CGROUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl ProbeCgroup {
    fn new() -> anyhow::Result<Self> {
        let one_at_a_time = PROBE_CGROUP.lock().unwrap_or_else(|e| e.into_inner());
        let (root, mounted) = match cgroup2_mount() {
            Ok(root) => (root, None),
            Err(_) => {
                let dir = std::env::temp_dir().join(format!(
                    "kube-ebpf-proxy-explain-cgroup2-{}",
                    std::process::id()
                ));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let status = std::process::Command::new("mount")
                    .args(["-t", "cgroup2", "none"])
                    .arg(&dir)
                    .status()
                    .context("running mount")?;
                if !status.success() {
                    let _ = std::fs::remove_dir(&dir);
                    bail!("no cgroup v2 hierarchy is mounted, and mounting one failed");
                }
                (dir.clone(), Some(dir))
            }
        };
        let home = own_cgroup(&root)?;
        // Unique per probe: a child another thread spawned while this process
        // sat in an earlier probe's cgroup can keep that one busy a moment.
        static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = root.join(format!(
            "kube-ebpf-proxy-explain-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ProbeCgroup {
            path,
            home,
            mounted,
            _one_at_a_time: one_at_a_time,
        })
    }

    /// A socket created while this process is in the probe's cgroup.
    fn socket_inside(&self, probe: &Probe) -> anyhow::Result<OwnedFd> {
        let kind = match probe.proto {
            Proto::Tcp => libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
            Proto::Udp => libc::SOCK_DGRAM,
            Proto::Sctp => unreachable!("refused by Probe::check"),
        };
        join_cgroup(&self.path)?;
        let domain = if probe.is_ipv6() {
            libc::AF_INET6
        } else {
            libc::AF_INET
        };
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, 0) };
        let created = io::Error::last_os_error();
        join_cgroup(&self.home)?;
        if fd < 0 {
            return Err(created).context("creating the probe's socket");
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for ProbeCgroup {
    fn drop(&mut self) {
        let _ = join_cgroup(&self.home);
        // Busy while a child spawned inside it still runs: wait for it a while.
        for _ in 0..200 {
            match std::fs::remove_dir(&self.path) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => break,
            }
        }
        if let Some(dir) = self.mounted.take() {
            let _ = std::process::Command::new("umount").arg(&dir).status();
            let _ = std::fs::remove_dir(&dir);
        }
    }
}
