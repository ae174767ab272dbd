//! Installs what building and testing need, as ../shared/TOOLCHAIN.md
//! describes, and does nothing when it is all present already.
//!
//! [`ensure_build`] is what `cargo xtask build` needs (also inside a container
//! image build, where nothing may be mounted); [`ensure`] adds what the tests
//! and demos need on top: bpffs and the Kubernetes schema validator.

use std::{
    ffi::OsString,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Debian packages: Debian's rustc (for the BPF target, with the std sources
/// for -Z build-std), LLVM 22 for bpf-linker, and the kernel tools the tests use.
const PACKAGES: &[&str] = &[
    "rustc-web",
    "rust-web-src",
    "llvm-22-dev",
    "libpolly-22-dev",
    "bpftool",
    "iproute2",
    "iptables",
    "nftables",
    "ipvsadm",
    "ipset",
    "conntrack",
    "ethtool",
    "tcpdump",
    "iputils-ping",
    "procps",
    // Debian's python3 with venv, for the schema validator of the deploy/ tests.
    "python3-venv",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
/// The Kubernetes schema validator the deploy/ tests run (PyPI; bundles the
/// schemas of Kubernetes 1.25 to 1.37, so it works offline).
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// The rustup name under which Debian's rustc is linked, used by proxy-agent/build.rs.
const BPF_TOOLCHAIN: &str = "bpf-debian";

/// Everything: the build toolchain, bpffs, the schema validator.
pub fn ensure() -> anyhow::Result<()> {
    ensure_build()?;
    if !bpffs_mounted() {
        println!("xtask setup: mounting bpffs at /sys/fs/bpf");
        run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    ensure_kubernetes_validate()
}

/// What building the agent with its eBPF programs needs, and nothing that
/// changes the running system beyond packages and tools.
pub fn ensure_build() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| !package_installed(p))
        .collect();
    if !missing.is_empty() {
        println!(
            "xtask setup: installing Debian packages: {}",
            missing.join(" ")
        );
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    if !bpf_linker_ok() {
        println!(
            "xtask setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (takes a few minutes)"
        );
        let path = prepend_path("/usr/lib/llvm-22/bin");
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("PATH", path))?;
    }
    if !quiet_ok(Command::new("rustup").args(["run", BPF_TOOLCHAIN, "rustc", "--version"])) {
        println!("xtask setup: linking Debian's rustc as rustup toolchain `{BPF_TOOLCHAIN}`");
        run(Command::new("rustup").args(["toolchain", "link", BPF_TOOLCHAIN, "/usr"]))?;
    }
    Ok(())
}

/// Where `kubernetes-validate` lives: a virtual environment of Debian's
/// python3 (whose own site-packages pip may not touch). The deploy/ tests
/// look for it here; keep in step with `proxy-agent/tests/pure/deploy_manifests.rs`.
fn kubernetes_validate_venv() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/root/.local/share"))
        .join("kube-ebpf-proxy/kubernetes-validate")
}

fn ensure_kubernetes_validate() -> anyhow::Result<()> {
    let venv = kubernetes_validate_venv();
    let installed = Command::new(venv.join("bin/kubernetes-validate"))
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).trim() == KUBERNETES_VALIDATE_VERSION
        });
    if installed {
        return Ok(());
    }
    println!(
        "xtask setup: installing kubernetes-validate {KUBERNETES_VALIDATE_VERSION} into {}",
        venv.display()
    );
    run(Command::new("/usr/bin/python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"),
    ]))
}

fn package_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
}

fn bpf_linker_ok() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .env("PATH", path_with_cargo_bin())
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)
        })
}

fn bpffs_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split(' ').nth(1) == Some("/sys/fs/bpf") && l.split(' ').nth(2) == Some("bpf")
        })
    })
}

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn cargo_bin() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

fn prepend_path(dir: impl Into<PathBuf>) -> OsString {
    let mut dirs = vec![dir.into()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).expect("PATH entries have no separators")
}

/// PATH with the cargo bin directory (where bpf-linker is installed) first.
pub fn path_with_cargo_bin() -> OsString {
    prepend_path(cargo_bin())
}
