//! BPF leftovers of the ebpf mode: pins (maps, programs, links) under our pin root, and our
//! programs still attached to interfaces through netlink (XDP, TC clsact filters). Links held
//! only by a process vanish with it; pinned links vanish with their pin.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cleanup::exec::CommandRunner;
use crate::cleanup::{Removed, Report};

/// Names of the programs our datapath attaches (kernel program names, at most 15 characters).
/// Keep in step with `proxy-ebpf`.
pub const OUR_PROGRAMS: &[&str] = &[
    "tc_from_pod",
    "tc_from_netdev",
    "tc_from_host",
    "xdp_from_netdev",
    "sock_getpeername4",
    "sock_peername6",
    "tc_to_pod",
    "tc_ingress",
    "tc_egress",
    "xdp_lb",
    "xdp_nodeport",
    "sock_connect4",
    "sock_connect6",
    "sock_sendmsg4",
    "sock_sendmsg6",
    "sock_recvmsg4",
    "sock_recvmsg6",
    "sock_release",
];

fn ours(name: &str) -> bool {
    OUR_PROGRAMS
        .iter()
        .any(|p| *p == name || (name.len() == 15 && p.starts_with(name)))
}

/// Removes everything below `root` (and `root` itself). Files in bpffs are pins.
pub fn remove_pins(root: &Path, report: &mut Report) {
    if !root.exists() {
        return;
    }
    fn walk(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if super::pin::is_kernel_preload(&e.file_name()) {
                continue;
            }
            let p = e.path();
            if e.file_type()?.is_dir() {
                walk(&p, files, dirs)?;
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
        Ok(())
    }
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    if let Err(e) = walk(root, &mut files, &mut dirs) {
        report
            .errors
            .push(format!("reading {}: {e}", root.display()));
    }
    files.sort();
    for f in files {
        match std::fs::remove_file(&f) {
            Ok(()) => report.removed.push(Removed::BpfPin { path: f }),
            Err(e) => report
                .errors
                .push(format!("removing pin {}: {e}", f.display())),
        }
    }
    // A pin root that is a BPF filesystem's mount root stays (it cannot go).
    if !super::pin::is_mount_root(root) {
        dirs.push(root.to_path_buf());
    }
    for d in dirs {
        if let Err(e) = std::fs::remove_dir(&d) {
            report.errors.push(format!("removing {}: {e}", d.display()));
        }
    }
}

/// (interface, `ip link set` keyword) for every XDP program of ours, from `ip -d -j link show`.
pub fn plan_xdp(links_json: &str) -> Vec<(String, &'static str)> {
    let links: Vec<Value> = serde_json::from_str(links_json).unwrap_or_default();
    let mut out = Vec::new();
    for l in &links {
        let Some(ifname) = l.get("ifname").and_then(Value::as_str) else {
            continue;
        };
        let Some(xdp) = l.get("xdp") else { continue };
        let mut progs = vec![xdp.clone()];
        if let Some(att) = xdp.get("attached").and_then(Value::as_array) {
            progs.extend(att.iter().cloned());
        }
        for p in progs {
            let name = p
                .pointer("/prog/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !ours(name) {
                continue;
            }
            let kw = match p.get("mode").and_then(Value::as_u64) {
                Some(2) => "xdpgeneric",
                Some(3) => "xdpoffload",
                _ => "xdpdrv",
            };
            out.push((ifname.to_string(), kw));
        }
    }
    out
}

/// `pref` of every TC filter of ours, from `tc -j filter show dev X ingress|egress`.
pub fn plan_tc(filters_json: &str) -> Vec<u64> {
    let filters: Vec<Value> = serde_json::from_str(filters_json).unwrap_or_default();
    let mut prefs: Vec<u64> = filters
        .iter()
        .filter(|f| {
            f.pointer("/options/bpf_name")
                .and_then(Value::as_str)
                .is_some_and(|n| ours(n.split(':').next().unwrap_or(n)))
        })
        .filter_map(|f| f.get("pref").and_then(Value::as_u64))
        .collect();
    prefs.dedup();
    prefs
}

/// Detaches our XDP and TC programs from every interface.
pub fn detach(run: &mut dyn CommandRunner, report: &mut Report) {
    let Ok(o) = run.run("ip", &["-d", "-j", "link", "show"], None) else {
        return;
    };
    if !o.success {
        return;
    }
    for (ifname, kw) in plan_xdp(&o.stdout) {
        match run.run("ip", &["link", "set", "dev", &ifname, kw, "off"], None) {
            Ok(r) if r.success => report.removed.push(Removed::Xdp { iface: ifname }),
            Ok(r) => report
                .errors
                .push(format!("detaching XDP from {ifname}: {}", r.stderr.trim())),
            Err(e) => report
                .errors
                .push(format!("detaching XDP from {ifname}: {e}")),
        }
    }
    let links: Vec<Value> = serde_json::from_str(&o.stdout).unwrap_or_default();
    for ifname in links
        .iter()
        .filter_map(|l| l.get("ifname").and_then(Value::as_str))
    {
        for dir in ["ingress", "egress"] {
            let Ok(f) = run.run("tc", &["-j", "filter", "show", "dev", ifname, dir], None) else {
                return;
            };
            if !f.success {
                continue;
            }
            for pref in plan_tc(&f.stdout) {
                let pref = pref.to_string();
                match run.run(
                    "tc",
                    &["filter", "del", "dev", ifname, dir, "pref", &pref],
                    None,
                ) {
                    Ok(r) if r.success => report.removed.push(Removed::TcFilter {
                        iface: ifname.into(),
                        direction: dir,
                    }),
                    Ok(r) => report.errors.push(format!(
                        "removing tc filter {dir} pref {pref} from {ifname}: {}",
                        r.stderr.trim()
                    )),
                    Err(e) => report
                        .errors
                        .push(format!("removing tc filter from {ifname}: {e}")),
                }
            }
        }
    }
}
