//! The pinned datapath: the agent leaves its maps and program links on a BPF
//! filesystem, so the datapath keeps serving while no agent runs (as
//! upstream's rules outlive kube-proxy) and the next agent adopts it.
//!
//! Layout under the pin root (`pinning.root`, default `/sys/fs/bpf/kube-ebpf-proxy`):
//!
//! ```text
//! v<ABI>/maps/<MAP>          every map, by name; ABI = proxy_common::ABI_VERSION
//! links/<ifindex>-<program>  the link of each program on each interface
//! ```
//!
//! A start finds one of: nothing (a fresh load, then pinned), maps of this ABI
//! (adopted: reused as they are, links updated to the new programs), or maps of
//! another ABI, which this agent cannot read: it refuses with an error naming
//! both versions, and the pinned datapath keeps serving.
//!
//! `explain --online` reads `v<ABI>/maps` of the default root, or
//! `$KUBE_EBPF_PROXY_PIN_DIR` when set.

use std::{
    collections::BTreeMap,
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use aya::maps::MapData;
use proxy_common::ABI_VERSION;

use crate::options::ebpf::PIN_ROOT;

/// Overrides the maps directory `explain --online` reads.
pub const PIN_DIR_ENV: &str = "KUBE_EBPF_PROXY_PIN_DIR";

/// Link pins of the socket programs start with this; the others with an ifindex.
pub const CGROUP_LINK_PREFIX: &str = "cgroup-";

/// statfs(2) `f_type` of a BPF filesystem.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

/// The maps directory of the default pin root.
pub fn default_dir() -> PathBuf {
    PinLayout::new(PIN_ROOT).maps_dir()
}

/// `$KUBE_EBPF_PROXY_PIN_DIR` when set and not empty, else [`default_dir`].
pub fn pin_dir() -> PathBuf {
    std::env::var_os(PIN_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(default_dir)
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{dir} is not on a BPF filesystem (mount one with `mount -t bpf bpf {mount}`)")]
    NotBpffs { dir: PathBuf, mount: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{root} holds a datapath pinned with map ABI version {found}, but this agent uses version \
         {ours} and cannot migrate it; the pinned datapath keeps serving. Run an agent of ABI \
         version {found}, or `--cleanup` (which cuts established connections) and start again"
    )]
    OtherAbi {
        root: PathBuf,
        found: u32,
        ours: u32,
    },
    #[error(
        "pinned map {path} does not have the layout this agent expects ({what}: pinned {pinned}, \
         expected {expected}); the pinned datapath keeps serving. Its ABI version was not \
         raised when the layout changed: run `--cleanup` and start again"
    )]
    Layout {
        path: PathBuf,
        what: &'static str,
        pinned: u32,
        expected: u32,
    },
    #[error("reading pinned map {path}: {source}")]
    Map {
        path: PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> PinError + '_ {
    move |source| PinError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Fails unless `dir`, or its nearest existing ancestor, is on a BPF filesystem.
pub fn check_bpffs(dir: &Path) -> Result<(), PinError> {
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let path = CString::new(existing.as_os_str().as_bytes()).map_err(|e| PinError::Io {
        path: existing.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    // SAFETY: a zeroed statfs is valid output space for statfs(2).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` lives across the call.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io_error(existing)(io::Error::last_os_error()));
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets.
    if st.f_type as u64 != BPF_FS_MAGIC {
        return Err(PinError::NotBpffs {
            dir: dir.to_owned(),
            mount: existing.to_owned(),
        });
    }
    Ok(())
}

/// Where the pins of one root go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinLayout {
    root: PathBuf,
}

/// What a start finds under the pin root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// No pinned datapath: load fresh and pin.
    Nothing,
    /// A datapath of this ABI: adopt it. The pinned capacity of each map by name.
    Current { capacities: BTreeMap<String, u32> },
    /// A datapath of an older ABI this agent can migrate: its maps are copied
    /// (converted where the layout changed) into new ones, then taken over.
    Older {
        version: u32,
        dir: PathBuf,
        capacities: BTreeMap<String, u32>,
    },
}

impl PinLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PinLayout { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn version_dir(&self, version: u32) -> PathBuf {
        self.root.join(format!("v{version}"))
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.version_dir(ABI_VERSION).join("maps")
    }

    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn link_path(&self, ifindex: u32, program: &str) -> PathBuf {
        self.links_dir().join(format!("{ifindex}-{program}"))
    }

    /// The link of a socket program on the cgroup the socket hooks use.
    pub fn cgroup_link_path(&self, program: &str) -> PathBuf {
        self.links_dir()
            .join(format!("{CGROUP_LINK_PREFIX}{program}"))
    }

    /// The ABI versions with a `v<N>` directory under the root.
    fn versions(&self) -> Result<Vec<u32>, PinError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&self.root)(e)),
        };
        let mut versions = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error(&self.root))?;
            let name = entry.file_name();
            if let Some(v) = name
                .to_str()
                .and_then(|n| n.strip_prefix('v'))
                .and_then(|n| n.parse().ok())
            {
                versions.push(v);
            }
        }
        versions.sort_unstable();
        Ok(versions)
    }

    /// Looks at the root before anything is loaded. `expected` is each map of
    /// the object by name: (map type, key size, value size).
    pub fn inspect(&self, expected: &BTreeMap<String, MapShape>) -> Result<Found, PinError> {
        check_bpffs(&self.root)?;
        let versions = self.versions()?;
        let newest = versions.iter().copied().max();
        match newest {
            None => Ok(Found::Nothing),
            Some(v) if v == ABI_VERSION => {
                let dir = self.maps_dir();
                if !dir.is_dir() {
                    return Ok(Found::Nothing);
                }
                Ok(Found::Current {
                    capacities: check_layout(&dir, expected)?,
                })
            }
            Some(v) if v < ABI_VERSION && super::migrate::can_migrate(v) => {
                let dir = self.version_dir(v).join("maps");
                Ok(Found::Older {
                    version: v,
                    capacities: capacities(&dir)?,
                    dir,
                })
            }
            Some(found) => Err(PinError::OtherAbi {
                root: self.root.clone(),
                found,
                ours: ABI_VERSION,
            }),
        }
    }

    /// Removes the maps of every other ABI version (after a migration).
    pub fn remove_other_versions(&self) -> Result<usize, PinError> {
        let mut removed = 0;
        for v in self.versions()? {
            if v != ABI_VERSION {
                removed += remove_tree(&self.version_dir(v))?;
            }
        }
        Ok(removed)
    }

    /// Removes every pin of this root (maps of every version, links) and the
    /// directories; the kernel frees what no process holds any more.
    pub fn remove_all(&self) -> Result<usize, PinError> {
        remove_tree(&self.root)
    }
}

/// Checks every pinned map of `dir` against the object's definition;
/// returns the pinned capacities.
fn check_layout(
    dir: &Path,
    expected: &BTreeMap<String, MapShape>,
) -> Result<BTreeMap<String, u32>, PinError> {
    let mut capacities = BTreeMap::new();
    for (name, want) in expected {
        let path = dir.join(name);
        if !path.exists() {
            // A map added without an ABI bump: created fresh at load.
            continue;
        }
        let info = map_info(&path)?;
        let map_type = info.map_type().map_or(u32::MAX, |t| t as u32);
        for (what, pinned, expected) in [
            ("map type", map_type, want.map_type),
            ("key size", info.key_size(), want.key_size),
            ("value size", info.value_size(), want.value_size),
        ] {
            if pinned != expected {
                return Err(PinError::Layout {
                    path,
                    what,
                    pinned,
                    expected,
                });
            }
        }
        capacities.insert(name.clone(), info.max_entries());
    }
    Ok(capacities)
}

/// The capacity of every map pinned in `dir`.
fn capacities(dir: &Path) -> Result<BTreeMap<String, u32>, PinError> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        out.insert(name, map_info(&path)?.max_entries());
    }
    Ok(out)
}

fn map_info(path: &Path) -> Result<aya::maps::MapInfo, PinError> {
    MapData::from_pin(path)
        .and_then(|m| m.info())
        .map_err(|source| PinError::Map {
            path: path.to_owned(),
            source,
        })
}

/// A map's definition in the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
}

/// The iterators the kernel itself pins in every new BPF filesystem
/// (`bpf_preload`): never ours, never removed, even when the pin root is a mount root.
pub fn is_kernel_preload(name: &std::ffi::OsStr) -> bool {
    name == "maps.debug" || name == "progs.debug"
}

/// Whether `dir` is the root of a mount (its device differs from its parent's).
pub fn is_mount_root(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(here), Some(Ok(parent))) =
        (std::fs::metadata(dir), dir.parent().map(std::fs::metadata))
    else {
        return false;
    };
    here.dev() != parent.dev()
}

fn remove_tree(dir: &Path) -> Result<usize, PinError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_error(dir)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io_error(dir))?;
        if is_kernel_preload(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        if entry.file_type().map_err(io_error(&path))?.is_dir() {
            removed += remove_tree(&path)?;
        } else {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
            removed += 1;
        }
    }
    // A bpffs mount root cannot be removed, and need not be.
    let _ = std::fs::remove_dir(dir);
    Ok(removed)
}
