#![allow(dead_code)] // each test binary uses its own subset
//! A private BPF filesystem for tests that pin.

use std::{path::Path, process::Command};

/// A bpffs mounted on a temporary directory, unmounted and removed on drop
/// (which frees whatever was pinned there).
pub struct BpfFs {
    pub dir: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

impl BpfFs {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(st.success(), "mount -t bpf on {}", dir.display());
        BpfFs { dir, _tmp: tmp }
    }

    /// Pins a new small hash map at `path` (inside this bpffs).
    pub fn pin_map(&self, path: &Path) {
        self.pin_map_of(path, "hash", 4, 4, 8);
    }

    /// Pins a new map of any layout at `path` with bpftool.
    pub fn pin_map_of(&self, path: &Path, map_type: &str, key: u32, value: u32, entries: u32) {
        let out = Command::new("bpftool")
            .args(["map", "create"])
            .arg(path)
            .args(["type", map_type])
            .args(["key", &key.to_string(), "value", &value.to_string()])
            .args(["entries", &entries.to_string(), "name", "test_map"])
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
    }
}
