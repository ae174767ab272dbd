//! Writes the mode's kernel settings at start-up and for `--init-only` (config_rules.md §3);
//! which settings each mode needs is the mode's own (`crate::modes::Mode::sysctls`).

use super::params::{KernelParams, ParamWrite, set_if_different, sysctl_key};
use crate::options::{ProxyMode, ProxyOptions};

#[derive(Debug, thiserror::Error)]
#[error("could not set sysctl {key} for the {mode} mode: {source}")]
pub struct ModeSysctlError {
    pub mode: ProxyMode,
    pub key: String,
    #[source]
    pub source: std::io::Error,
}

/// Writes the mode's sysctls (only those that differ).
pub fn apply(
    o: &ProxyOptions,
    p: &mut dyn KernelParams,
) -> Result<Vec<ParamWrite>, ModeSysctlError> {
    let mut writes = Vec::new();
    for (name, value) in crate::modes::of(o.mode).sysctls(o) {
        let key = sysctl_key(name);
        match set_if_different(p, &key, value) {
            Ok(Some(w)) => writes.push(w),
            Ok(None) => {}
            Err(source) => {
                return Err(ModeSysctlError {
                    mode: o.mode,
                    key,
                    source,
                });
            }
        }
    }
    Ok(writes)
}
