//! Network namespace and bpffs fixtures for the e2e tests. Everything is created by the
//! test and removed on every exit path (Drop runs on panic too).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static N: AtomicUsize = AtomicUsize::new(0);

fn unique(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A named network namespace, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new() -> Self {
        let name = unique("cleanup-t");
        let st = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(st.success(), "ip netns add {name}");
        NetNs { name }
    }

    /// Runs `program args` inside the namespace; panics on failure.
    pub fn sh(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .expect("ip netns exec");
        assert!(
            out.status.success(),
            "{program} {args:?} in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ok(&self, program: &str, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A private bpffs mounted on a temporary directory, unmounted and removed on drop.
pub struct BpfFs {
    pub dir: PathBuf,
}

impl BpfFs {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("cleanup-bpffs"));
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(st.success(), "mount -t bpf on {}", dir.display());
        BpfFs { dir }
    }

    /// Pins a new small hash map at `path` (inside this bpffs) with bpftool.
    pub fn pin_map(&self, path: &Path) {
        let out = Command::new("bpftool")
            .args(["map", "create"])
            .arg(path)
            .args([
                "type",
                "hash",
                "key",
                "4",
                "value",
                "4",
                "entries",
                "8",
                "name",
                "cleanup_test",
            ])
            .output()
            .expect("bpftool");
        assert!(
            out.status.success(),
            "bpftool map create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
