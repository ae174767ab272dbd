//! Network namespace and bpffs fixtures for the e2e tests. Everything is created by the
//! test and removed on every exit path (Drop runs on panic too).
#![allow(dead_code)]

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

pub use crate::bpffs::BpfFs;
