//! Reading and writing kernel parameters (`/proc/sys/...`, `/sys/module/...`).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

/// Kernel parameters addressed by their path below the filesystem root, e.g.
/// `proc/sys/net/netfilter/nf_conntrack_max` or `sys/module/nf_conntrack/parameters/hashsize`.
pub trait KernelParams {
    fn read(&self, key: &str) -> io::Result<String>;
    fn write(&mut self, key: &str, value: &str) -> io::Result<()>;
}

/// A sysctl under `/proc/sys` by its dotted or slashed name (`net.ipv4.ip_forward`).
pub fn sysctl_key(name: &str) -> String {
    format!("proc/sys/{}", name.replace('.', "/"))
}

pub const HASHSIZE_KEY: &str = "sys/module/nf_conntrack/parameters/hashsize";

/// One write that was made (or would be made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamWrite {
    pub key: String,
    pub old: Option<String>,
    pub new: String,
}

/// The real files, below `root` (`/` in production).
#[derive(Debug, Clone)]
pub struct ProcParams {
    pub root: PathBuf,
}

impl Default for ProcParams {
    fn default() -> Self {
        ProcParams {
            root: PathBuf::from("/"),
        }
    }
}

impl KernelParams for ProcParams {
    fn read(&self, key: &str) -> io::Result<String> {
        std::fs::read_to_string(self.root.join(key)).map(|s| s.trim().to_string())
    }
    fn write(&mut self, key: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.root.join(key), value)
    }
}

/// In-memory parameters; records every write in order.
#[derive(Debug, Clone, Default)]
pub struct FakeParams {
    pub values: BTreeMap<String, String>,
    pub writes: Vec<(String, String)>,
    /// Keys whose writes fail with EROFS.
    pub read_only: Vec<String>,
}

impl FakeParams {
    pub fn with(values: &[(&str, &str)]) -> Self {
        FakeParams {
            values: values
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }
}

impl KernelParams for FakeParams {
    fn read(&self, key: &str) -> io::Result<String> {
        self.values
            .get(key)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{key} not present")))
    }
    fn write(&mut self, key: &str, value: &str) -> io::Result<()> {
        if self.read_only.iter().any(|k| k == key) {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.writes.push((key.to_string(), value.to_string()));
        self.values.insert(key.to_string(), value.to_string());
        Ok(())
    }
}

/// Writes `value` to `key` unless it already holds it; returns the write made, if any.
pub fn set_if_different(
    p: &mut dyn KernelParams,
    key: &str,
    value: &str,
) -> io::Result<Option<ParamWrite>> {
    let old = p.read(key).ok();
    if old.as_deref() == Some(value) {
        return Ok(None);
    }
    p.write(key, value)?;
    Ok(Some(ParamWrite {
        key: key.to_string(),
        old,
        new: value.to_string(),
    }))
}
