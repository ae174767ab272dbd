//! A cgroup v2 directory of a test's own, for programs that attach to a
//! cgroup (the socket hooks): made under the hierarchy's root, never the root
//! itself, and removed on drop, on SIGINT/SIGTERM and by the next run when
//! the process that made it died by SIGKILL.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::cleanup;

pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    /// `<cgroup v2 root>/<unique id>-<tag>`.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let root = cgroup2_root()?;
        sweep_stale(&root);
        let path = root.join(format!("{}-{tag}", cleanup::unique_id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        cleanup::register_cgroup(&path);
        Ok(TestCgroup { path })
    }
}

impl TestCgroup {
    /// The path as a process in another mount namespace sees it: `ip netns
    /// exec` mounts a fresh /sys, without the cgroup hierarchy, so the
    /// agent it starts reaches the cgroup through this process's root.
    pub fn seen_from_other_mount_namespaces(&self) -> PathBuf {
        let inside = self.path.strip_prefix("/").unwrap_or(&self.path);
        PathBuf::from(format!("/proc/{}/root", std::process::id())).join(inside)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        cleanup::release_cgroup(&self.path);
    }
}

/// Where the cgroup v2 hierarchy is mounted, from `/proc/self/mounts`
/// (`/sys/fs/cgroup/unified` on hybrid hosts such as these).
pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .and_then(|f| f.get(1).map(PathBuf::from))
        .context("no cgroup v2 hierarchy is mounted")
}

/// Removes an empty cgroup, waiting briefly for its last processes to go.
pub(crate) fn remove(path: &Path) {
    for _ in 0..100 {
        match std::fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    eprintln!("testbed: could not remove cgroup {}", path.display());
}

/// Cgroups left by testbed processes that no longer exist.
fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if cleanup::creator_is_gone(&name) {
            remove(&entry.path());
        }
    }
}
