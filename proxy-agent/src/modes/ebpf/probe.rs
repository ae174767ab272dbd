//! Whether this node can run the ebpf mode.

use std::path::Path;

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_map_supported, is_program_supported},
};

/// The oldest kernel our programs load on: the conntrack collector's BPF
/// timer arrived in 5.15 (`bpf_redirect_neigh`, which the TC programs
/// forward with, in 5.10).
pub const MIN_KERNEL: (u32, u32) = (5, 15);

/// `major.minor` of a kernel release string such as `6.1.0-18-amd64`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// A recent enough kernel with BTF, permission to load a TC (`sched_cls`)
/// program, and the LRU hash map of session affinity and the socket hooks.
pub fn probe() -> Result<(), String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    match parse_kernel_release(&release) {
        Some(v) if v < MIN_KERNEL => {
            return Err(format!(
                "kernel {release} is older than {}.{} (the conntrack collector uses BPF timers)",
                MIN_KERNEL.0, MIN_KERNEL.1
            ));
        }
        Some(_) => {}
        None => return Err(format!("cannot read the kernel version ({release:?})")),
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("the kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)".into());
    }
    match is_map_supported(MapType::LruHash) {
        Ok(true) => {}
        Ok(false) => return Err("the bpf() syscall cannot create an LRU hash map".into()),
        Err(e) => {
            return Err(format!(
                "the bpf() syscall cannot create an LRU hash map: {e}"
            ));
        }
    }
    match is_program_supported(ProgramType::SchedClassifier) {
        Ok(true) => Ok(()),
        Ok(false) => Err("cannot load a TC (sched_cls) BPF program".into()),
        Err(e) => Err(format!("cannot load a TC (sched_cls) BPF program: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_release_parsing() {
        assert_eq!(parse_kernel_release("6.18.0-1-amd64"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.10.0+"), Some((5, 10)));
        assert_eq!(parse_kernel_release("4.19"), Some((4, 19)));
        assert!(parse_kernel_release("4.19").unwrap() < MIN_KERNEL);
        assert_eq!(parse_kernel_release("garbage"), None);
    }
}
