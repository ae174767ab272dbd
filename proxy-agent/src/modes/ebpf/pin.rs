//! Pins the maps of the loaded object by name under a directory of a BPF
//! filesystem, so `proxy-agent explain --online` (and bpftool) can read what
//! the running agent programmed. Pins left by an earlier run are replaced;
//! [`Pins::unpin`] (or dropping the [`Pins`]) removes them again.
//!
//! The directory is `$KUBE_EBPF_PROXY_PIN_DIR` when set, else
//! `/sys/fs/bpf/kube-ebpf-proxy/maps`. Without a BPF filesystem there (under
//! `ip netns exec`, which remounts /sys, for example) the agent runs without
//! pins.

use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use aya::Ebpf;
use tracing::{info, warn};

use crate::options::ebpf::PIN_ROOT;

/// Overrides the pin directory, for the agent and `explain --online` alike.
pub const PIN_DIR_ENV: &str = "KUBE_EBPF_PROXY_PIN_DIR";

/// statfs(2) `f_type` of a BPF filesystem.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

/// The default pin directory: `PIN_ROOT/maps`.
pub fn default_dir() -> PathBuf {
    Path::new(PIN_ROOT).join("maps")
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
    #[error("pinning map {name} at {path}: {source}")]
    Pin {
        name: String,
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
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

/// The maps pinned by this process; removed by [`Pins::unpin`] or on drop.
#[derive(Debug)]
pub struct Pins {
    dir: PathBuf,
    paths: Vec<PathBuf>,
}

/// Pins every map of `ebpf` at `dir/NAME`, creating `dir` and replacing
/// whatever an earlier run left there.
pub fn pin_maps(ebpf: &Ebpf, dir: &Path) -> Result<Pins, PinError> {
    check_bpffs(dir)?;
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    remove_files(dir)?;
    let mut pins = Pins {
        dir: dir.to_owned(),
        paths: Vec::new(),
    };
    for (name, map) in ebpf.maps() {
        let path = dir.join(name);
        map.pin(&path).map_err(|source| PinError::Pin {
            name: name.to_owned(),
            path: path.clone(),
            source,
        })?;
        pins.paths.push(path);
    }
    Ok(pins)
}

/// Stale pins of an earlier run: every file in `dir` (the directory is ours).
fn remove_files(dir: &Path) -> Result<(), PinError> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let path = entry.path();
        if !entry.file_type().map_err(io_error(&path))?.is_dir() {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    Ok(())
}

/// [`pin_maps`] at [`pin_dir`], logging the outcome; `None` (with a
/// warning) when the maps cannot be pinned, which is not fatal.
pub fn pin_or_warn(ebpf: &Ebpf) -> Option<Pins> {
    let dir = pin_dir();
    match pin_maps(ebpf, &dir) {
        Ok(pins) => {
            info!(dir = %dir.display(), maps = pins.paths.len(), "maps pinned");
            Some(pins)
        }
        Err(e) => {
            warn!(
                error = %e,
                "running without pinned maps: `proxy-agent explain --online` cannot read this agent's maps"
            );
            None
        }
    }
}

impl Pins {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Removes the pins and the directory (and the default pin root when
    /// that leaves it empty). The maps themselves live on while this
    /// process holds them.
    pub fn unpin(mut self) -> Result<(), PinError> {
        self.remove()
    }

    fn remove(&mut self) -> Result<(), PinError> {
        let mut first_error = None;
        for path in std::mem::take(&mut self.paths) {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error.get_or_insert(io_error(&path)(e));
                }
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            first_error.get_or_insert(io_error(&self.dir)(e));
        }
        if self.dir.parent() == Some(Path::new(PIN_ROOT)) {
            // Only succeeds when nothing else lives there.
            let _ = std::fs::remove_dir(PIN_ROOT);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if !self.paths.is_empty()
            && let Err(e) = self.remove()
        {
            warn!(error = %e, "removing pinned maps");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_outside_bpffs_is_refused_before_anything_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        match check_bpffs(&dir) {
            Err(PinError::NotBpffs { mount, .. }) => assert_eq!(mount, tmp.path()),
            other => panic!("expected NotBpffs, got {other:?}"),
        }
        assert!(!tmp.path().join("a").exists());
    }

    #[test]
    fn the_default_directory_is_under_the_pin_root() {
        assert_eq!(
            default_dir(),
            PathBuf::from("/sys/fs/bpf/kube-ebpf-proxy/maps")
        );
    }
}
