//! Network namespaces: create, enter from a thread, delete.

use std::{fs::File, os::fd::AsRawFd, process::Command, thread};

use anyhow::{Context as _, bail};

/// Runs `ip` with `args` (optionally inside namespace `ns`), failing with its stderr.
pub fn ip(ns: Option<&str>, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["netns", "exec", ns, "ip"]);
    }
    let out = cmd
        .args(args)
        .output()
        .context("running `ip` (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!(
            "ip {} (netns {}): {}",
            args.join(" "),
            ns.unwrap_or("-"),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Writes a sysctl of namespace `ns` (per-namespace keys only, e.g. net.ipv4.*).
pub fn sysctl(ns: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ])
        .output()
        .context("running sysctl")?;
    if !out.status.success() {
        bail!(
            "sysctl {key}={value} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub fn add(name: &str) -> anyhow::Result<()> {
    ip(None, &["netns", "add", name])?;
    ip(Some(name), &["link", "set", "lo", "up"])
}

/// Deletes a namespace; its veths and everything in it go with it.
pub fn delete(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).output();
}

pub fn exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}

/// Runs `f` on a thread that has entered namespace `ns`: sockets it opens live there.
pub fn run_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    spawn_in(ns, f)?
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns {ns} panicked"))
}

/// Like [`run_in`] but returns the thread's handle instead of waiting.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<thread::JoinHandle<T>> {
    let file =
        File::open(format!("/run/netns/{ns}")).with_context(|| format!("opening netns {ns}"))?;
    Ok(thread::spawn(move || {
        // SAFETY: setns on this thread only; the fd is valid for the call.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns failed: {}", std::io::Error::last_os_error());
        f()
    }))
}
