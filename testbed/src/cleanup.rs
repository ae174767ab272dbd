//! Every namespace (and cgroup) a testbed creates is registered here, so it
//! is removed on drop, on panic (unwinding drops), on SIGINT/SIGTERM (a
//! handler thread), and on the next run when the creating process died by SIGKILL.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{
        Mutex, Once,
        atomic::{AtomicU32, Ordering},
    },
};

use signal_hook::{
    consts::{SIGINT, SIGTERM},
    iterator::Signals,
};

use crate::netns;

/// Every testbed namespace name starts with this, followed by the creator's pid.
pub const PREFIX: &str = "kpt";

/// A name no other testbed of any live process uses: `kpt<pid>x<n>`; the
/// namespaces of a testbed are named `<id>-<role>`.
pub fn unique_id() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{PREFIX}{}x{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static LIVE_CGROUPS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
static HANDLER: Once = Once::new();

pub fn register(ns: &str) {
    install_signal_handler();
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ns.to_owned());
}

pub fn release(ns: &str) {
    netns::delete(ns);
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).remove(ns);
}

pub fn register_cgroup(path: &Path) {
    install_signal_handler();
    LIVE_CGROUPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_owned());
}

pub fn release_cgroup(path: &Path) {
    crate::cgroup::remove(path);
    LIVE_CGROUPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(path);
}

fn install_signal_handler() {
    HANDLER.call_once(|| {
        let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
            return;
        };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let names: Vec<String> = LIVE
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                for ns in &names {
                    netns::delete(ns);
                }
                let cgroups: Vec<PathBuf> = LIVE_CGROUPS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                for cgroup in &cgroups {
                    crate::cgroup::remove(cgroup);
                }
                eprintln!(
                    "testbed: signal {sig}: removed {} namespace(s)",
                    names.len()
                );
                std::process::exit(128 + sig);
            }
        });
    });
}

/// Removes namespaces left by testbed processes that no longer exist.
pub fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if creator_is_gone(&name) {
            netns::delete(&name);
        }
    }
}

/// Whether `name` is a testbed's (`kpt<pid>x…`) whose process is gone.
pub(crate) fn creator_is_gone(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
    pid.parse::<u32>()
        .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}
