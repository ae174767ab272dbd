//! The proxy mode: upstream's `iptables`, `ipvs`, `nftables`, plus our `ebpf`.
//! A blank mode picks the best one this node supports (ebpf, else nftables, else iptables),
//! and an explicitly requested mode that cannot work here is a fatal error, as upstream.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    Iptables,
    Ipvs,
    Nftables,
    Ebpf,
}

impl ProxyMode {
    pub const ALL: [ProxyMode; 4] = [Self::Iptables, Self::Ipvs, Self::Nftables, Self::Ebpf];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
            Self::Nftables => "nftables",
            Self::Ebpf => "ebpf",
        }
    }

    /// Parses a non-blank mode string; `None` for anything else (validation reports it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// Whether the mode relies on the kernel's netfilter conntrack (and so gets the
    /// `nf_conntrack_*` sysctls); ebpf keeps its own conntrack table instead.
    pub fn uses_kernel_conntrack(self) -> bool {
        !matches!(self, Self::Ebpf)
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What this node can run. Real probes touch the kernel; tests use [`FixedSupport`].
pub trait ModeSupport {
    /// `Ok(())` when the mode can work here, else the reason it cannot.
    fn check(&self, mode: ProxyMode) -> Result<(), String>;
}

/// A fixed answer per mode, for tests and `--write-config-to` golden files.
#[derive(Debug, Clone, Default)]
pub struct FixedSupport {
    pub supported: Vec<ProxyMode>,
}

impl ModeSupport for FixedSupport {
    fn check(&self, mode: ProxyMode) -> Result<(), String> {
        if self.supported.contains(&mode) {
            Ok(())
        } else {
            Err(format!("{mode} is not supported (test fixture)"))
        }
    }
}

/// Cheap probes of the running kernel and tools.
#[derive(Debug, Clone, Default)]
pub struct HostSupport;

/// The oldest kernel our programs load on: `bpf_redirect_neigh` (used by the TC programs to
/// forward to a backend on another interface) arrived in 5.10.
pub const MIN_KERNEL: (u32, u32) = (5, 10);

/// `major.minor` of a kernel release string such as `6.1.0-18-amd64`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

/// `bpf(cmd, attr)`; the attribute is a prefix of `union bpf_attr`, zero-padded.
fn bpf_syscall<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<i32> {
    // SAFETY: attr points to a fully initialised value of the size passed; the kernel only
    // reads it (for the commands used here) and checks that unused bytes are zero.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd as i32)
    }
}

fn close(fd: i32) {
    // SAFETY: fd was just returned by the kernel and is owned here.
    unsafe { libc::close(fd) };
}

impl HostSupport {
    /// Whether our programs can run here: a recent enough kernel with BTF, permission to load
    /// a TC (`sched_cls`) program, and the LRU hash map our conntrack uses.
    fn probe_bpf() -> Result<(), String> {
        let release = kernel_release().unwrap_or_default();
        match parse_kernel_release(&release) {
            Some(v) if v < MIN_KERNEL => {
                return Err(format!(
                    "kernel {release} is older than {}.{} (our TC programs use bpf_redirect_neigh)",
                    MIN_KERNEL.0, MIN_KERNEL.1
                ));
            }
            Some(_) => {}
            None => return Err(format!("cannot read the kernel version ({release:?})")),
        }
        if !Path::new("/sys/kernel/btf/vmlinux").exists() {
            return Err("the kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)".into());
        }
        #[repr(C)]
        #[derive(Default)]
        struct MapCreate {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
            _pad: [u32; 27],
        }
        let lru = MapCreate {
            map_type: 9, // BPF_MAP_TYPE_LRU_HASH
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            ..Default::default()
        };
        let fd = bpf_syscall(0 /* BPF_MAP_CREATE */, &lru)
            .map_err(|e| format!("the bpf() syscall cannot create an LRU hash map: {e}"))?;
        close(fd);

        #[repr(C)]
        #[derive(Default)]
        struct ProgLoad {
            prog_type: u32,
            insn_cnt: u32,
            insns: u64,
            license: u64,
            log_level: u32,
            log_size: u32,
            log_buf: u64,
            kern_version: u32,
            prog_flags: u32,
            _pad: [u64; 12],
        }
        // r0 = 0 (TC_ACT_OK); exit
        let insns: [u64; 2] = [0xb7, 0x95];
        let license = b"GPL\0";
        let prog = ProgLoad {
            prog_type: 3, // BPF_PROG_TYPE_SCHED_CLS
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            ..Default::default()
        };
        let fd = bpf_syscall(5 /* BPF_PROG_LOAD */, &prog)
            .map_err(|e| format!("cannot load a TC (sched_cls) BPF program: {e}"))?;
        close(fd);
        Ok(())
    }

    fn tool_works(program: &str, args: &[&str]) -> Result<(), String> {
        match Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
        {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "`{program} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(format!("cannot run {program}: {e}")),
        }
    }
}

impl ModeSupport for HostSupport {
    fn check(&self, mode: ProxyMode) -> Result<(), String> {
        match mode {
            ProxyMode::Ebpf => Self::probe_bpf(),
            ProxyMode::Nftables => Self::tool_works("nft", &["list", "tables"]),
            ProxyMode::Iptables => {
                Self::tool_works("iptables", &["-w", "-t", "nat", "-S", "POSTROUTING"])
            }
            ProxyMode::Ipvs => {
                if Path::new("/proc/net/ip_vs").exists() {
                    Ok(())
                } else {
                    Err("the kernel has no IPVS support (/proc/net/ip_vs is missing)".into())
                }
            }
        }
    }
}

/// The outcome of resolving the configured mode string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: ProxyMode,
    /// Human-readable reason, logged at startup.
    pub reason: String,
}

/// Picks the best available mode for a blank setting: ebpf, else nftables, else iptables.
pub fn pick_best(support: &dyn ModeSupport) -> ModeChoice {
    let mut why_not = Vec::new();
    for mode in [ProxyMode::Ebpf, ProxyMode::Nftables] {
        match support.check(mode) {
            Ok(()) => {
                let reason = if why_not.is_empty() {
                    format!("mode is blank; {mode} is the best mode this node supports")
                } else {
                    format!(
                        "mode is blank; {mode} chosen because {}",
                        why_not.join("; ")
                    )
                };
                return ModeChoice { mode, reason };
            }
            Err(e) => why_not.push(format!("{mode} is unavailable: {e}")),
        }
    }
    ModeChoice {
        mode: ProxyMode::Iptables,
        reason: format!(
            "mode is blank; falling back to iptables because {}",
            why_not.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_prefers_ebpf_then_nftables_then_iptables() {
        let all = FixedSupport {
            supported: ProxyMode::ALL.to_vec(),
        };
        assert_eq!(pick_best(&all).mode, ProxyMode::Ebpf);
        let nft = FixedSupport {
            supported: vec![ProxyMode::Nftables, ProxyMode::Iptables],
        };
        let c = pick_best(&nft);
        assert_eq!(c.mode, ProxyMode::Nftables);
        assert!(c.reason.contains("ebpf is unavailable"), "{}", c.reason);
        let none = FixedSupport::default();
        assert_eq!(pick_best(&none).mode, ProxyMode::Iptables);
    }

    #[test]
    fn kernel_release_parsing() {
        assert_eq!(parse_kernel_release("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.10.0+"), Some((5, 10)));
        assert_eq!(parse_kernel_release("4.19"), Some((4, 19)));
        assert!(parse_kernel_release("4.19").unwrap() < MIN_KERNEL);
        assert_eq!(parse_kernel_release("garbage"), None);
    }

    #[test]
    fn this_host_answers_every_probe() {
        // Whatever the host supports, each probe returns (no panic, no hang) with a reason.
        for m in ProxyMode::ALL {
            if let Err(why) = HostSupport.check(m) {
                assert!(!why.is_empty(), "{m}");
            }
        }
    }

    #[test]
    fn parse_round_trips() {
        for m in ProxyMode::ALL {
            assert_eq!(ProxyMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(ProxyMode::parse("kernelspace"), None);
        assert_eq!(ProxyMode::parse(""), None);
    }
}
