//! Upstream's conntrack sysctls (`platformSetup`, config_rules.md §3.2), for the modes that
//! use the kernel's conntrack. In ebpf mode the same settings size our own BPF table instead
//! (see `options::ebpf::conntrack_params`), and nothing here runs.

use super::params::{HASHSIZE_KEY, KernelParams, ParamWrite, set_if_different, sysctl_key};
use crate::options::KubeProxyConfiguration;

/// Upper bound of nf_conntrack_max, as in the newest upstream.
pub const MAX_CONNTRACK: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("could not set conntrack parameters: {key}: {source}")]
    Write {
        key: String,
        #[source]
        source: std::io::Error,
    },
}

/// The outcome: writes made, and problems that upstream only logs.
#[derive(Debug, Default, Clone)]
pub struct ConntrackReport {
    pub writes: Vec<ParamWrite>,
    pub warnings: Vec<String>,
}

/// nf_conntrack_max wanted for `max_per_core` x `cpus` with floor `min`; `None` = leave alone.
pub fn wanted_max(max_per_core: i32, min: i32, cpus: u32) -> Option<u64> {
    if max_per_core <= 0 {
        return None;
    }
    let v = (max_per_core as u64 * cpus as u64).max(min.max(0) as u64);
    Some(v.min(MAX_CONNTRACK))
}

/// Online CPUs of the node (`/sys/devices/system/cpu/online`, e.g. `0-3,6`), not the cpuset.
pub fn online_cpus() -> u32 {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        })
}

pub fn parse_cpu_list(s: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<u32>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

/// Applies the conntrack settings of `c`. A failed write is fatal, except the hashsize
/// (read-only /sys outside the initial network namespace), which upstream only logs.
pub fn apply(
    c: &KubeProxyConfiguration,
    cpus: u32,
    p: &mut dyn KernelParams,
) -> Result<ConntrackReport, ConntrackError> {
    let mut report = ConntrackReport::default();
    let fail = |key: &str, source| ConntrackError::Write {
        key: key.to_string(),
        source,
    };
    let ct = &c.conntrack;

    if let Some(max) = wanted_max(ct.max_per_core.unwrap_or(0), ct.min.unwrap_or(0), cpus) {
        let key = sysctl_key("net/netfilter/nf_conntrack_max");
        let current = p.read(&key).ok().and_then(|v| v.parse::<u64>().ok());
        if current.is_none_or(|cur| cur < max) {
            p.write(&key, &max.to_string()).map_err(|e| fail(&key, e))?;
            report.writes.push(ParamWrite {
                key,
                old: current.map(|c| c.to_string()),
                new: max.to_string(),
            });
        }
        let want_hash = max / 4;
        let hash = p
            .read(HASHSIZE_KEY)
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        if hash.is_none_or(|h| h < want_hash) {
            match p.write(HASHSIZE_KEY, &want_hash.to_string()) {
                Ok(()) => report.writes.push(ParamWrite {
                    key: HASHSIZE_KEY.into(),
                    old: hash.map(|h| h.to_string()),
                    new: want_hash.to_string(),
                }),
                Err(e) => report.warnings.push(format!(
                    "could not raise {HASHSIZE_KEY} to {want_hash} ({e}); /sys may be read-only or not in the initial network namespace"
                )),
            }
        }
    }

    let timeouts = [
        (
            "nf_conntrack_tcp_timeout_established",
            ct.tcp_established_timeout.unwrap_or_default(),
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            ct.tcp_close_wait_timeout.unwrap_or_default(),
        ),
        ("nf_conntrack_udp_timeout", ct.udp_timeout),
        ("nf_conntrack_udp_timeout_stream", ct.udp_stream_timeout),
    ];
    for (name, d) in timeouts {
        if d.nanos() > 0 {
            let key = sysctl_key(&format!("net/netfilter/{name}"));
            if let Some(w) =
                set_if_different(p, &key, &d.as_secs().to_string()).map_err(|e| fail(&key, e))?
            {
                report.writes.push(w);
            }
        }
    }
    if ct.tcp_be_liberal {
        let key = sysctl_key("net/netfilter/nf_conntrack_tcp_be_liberal");
        if let Some(w) = set_if_different(p, &key, "1").map_err(|e| fail(&key, e))? {
            report.writes.push(w);
        }
    }
    Ok(report)
}
