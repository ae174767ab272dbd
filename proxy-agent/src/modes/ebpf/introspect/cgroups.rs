//! The socket hooks as the kernel has them: our programs' cgroup links, with
//! the cgroup each is attached to.

use std::{
    collections::{BTreeMap, VecDeque},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{IntrospectError, ProgramStats};
use crate::modes::ebpf::sys;

/// One socket program attached to a cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CgroupHook {
    pub program: String,
    pub program_id: u32,
    pub link_id: u32,
    /// The kernel's `bpf_attach_type` (10 = inet4 connect, ...).
    pub attach_type: u32,
    /// The cgroup's id: its cgroup v2 directory's inode number.
    pub cgroup_id: u64,
    /// That directory, when the cgroup v2 hierarchy is mounted here and the
    /// directory is found within a bounded walk.
    pub cgroup_path: Option<PathBuf>,
}

/// Directories looked at, at most, to name a cgroup.
const CGROUP_WALK_LIMIT: usize = 20_000;

/// The cgroup links of `programs`. `cgroup2` is the cgroup v2 mount to name
/// the cgroups in (`None`: ids only).
pub fn cgroup_hooks(
    programs: &[ProgramStats],
    cgroup2: Option<&Path>,
) -> Result<Vec<CgroupHook>, IntrospectError> {
    let ours: BTreeMap<u32, &str> = programs.iter().map(|p| (p.id, p.name.as_str())).collect();
    let links = sys::links().map_err(IntrospectError::Links)?;
    let mut paths: BTreeMap<u64, Option<PathBuf>> = BTreeMap::new();
    let mut out = Vec::new();
    for link in links {
        if link.link_type != sys::BPF_LINK_TYPE_CGROUP {
            continue;
        }
        let Some(name) = ours.get(&link.prog_id) else {
            continue;
        };
        let cgroup_id = link.cgroup_id();
        let cgroup_path = paths
            .entry(cgroup_id)
            .or_insert_with(|| cgroup2.and_then(|root| find_cgroup(root, cgroup_id)))
            .clone();
        out.push(CgroupHook {
            program: (*name).to_owned(),
            program_id: link.prog_id,
            link_id: link.id,
            attach_type: link.cgroup_attach_type(),
            cgroup_id,
            cgroup_path,
        });
    }
    out.sort_by(|a, b| (&a.program, a.link_id).cmp(&(&b.program, b.link_id)));
    Ok(out)
}

/// The directory under `root` whose inode is `id`, breadth first.
fn find_cgroup(root: &Path, id: u64) -> Option<PathBuf> {
    let mut queue = VecDeque::from([root.to_owned()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > CGROUP_WALK_LIMIT {
            return None;
        }
        if std::fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            return Some(dir);
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        queue.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}
