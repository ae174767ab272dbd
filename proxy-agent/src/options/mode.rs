//! The proxy mode setting: upstream's `iptables`, `ipvs`, `nftables`, plus our `ebpf`.
//! A blank mode picks the best one this node supports (ebpf, else nftables, else iptables),
//! and an explicitly requested mode that cannot work here is a fatal error, as upstream.
//! The probes themselves live with each mode (`crate::modes`).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    Iptables,
    Ipvs,
    Nftables,
    Ebpf,
}

impl ProxyMode {
    pub const ALL: [ProxyMode; 4] = [Self::Iptables, Self::Ipvs, Self::Nftables, Self::Ebpf];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
            Self::Nftables => "nftables",
            Self::Ebpf => "ebpf",
        }
    }

    /// Parses a non-blank mode string; `None` for anything else (validation reports it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// Whether the mode relies on the kernel's netfilter conntrack (and so gets the
    /// `nf_conntrack_*` sysctls); ebpf keeps its own conntrack table instead.
    pub fn uses_kernel_conntrack(self) -> bool {
        !matches!(self, Self::Ebpf)
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What this node can run. `crate::modes::HostSupport` probes the node; tests use [`FixedSupport`].
pub trait ModeSupport {
    /// `Ok(())` when the mode can work here, else the reason it cannot.
    fn check(&self, mode: ProxyMode) -> Result<(), String>;
}

/// A fixed answer per mode, for tests and `--write-config-to` golden files.
#[derive(Debug, Clone, Default)]
pub struct FixedSupport {
    pub supported: Vec<ProxyMode>,
}

impl ModeSupport for FixedSupport {
    fn check(&self, mode: ProxyMode) -> Result<(), String> {
        if self.supported.contains(&mode) {
            Ok(())
        } else {
            Err(format!("{mode} is not supported (test fixture)"))
        }
    }
}

/// The outcome of resolving the configured mode string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: ProxyMode,
    /// Human-readable reason, logged at startup.
    pub reason: String,
}

/// Picks the best available mode for a blank setting: ebpf, else nftables, else iptables.
pub fn pick_best(support: &dyn ModeSupport) -> ModeChoice {
    let mut why_not = Vec::new();
    for mode in [ProxyMode::Ebpf, ProxyMode::Nftables] {
        match support.check(mode) {
            Ok(()) => {
                let reason = if why_not.is_empty() {
                    format!("mode is blank; {mode} is the best mode this node supports")
                } else {
                    format!(
                        "mode is blank; {mode} chosen because {}",
                        why_not.join("; ")
                    )
                };
                return ModeChoice { mode, reason };
            }
            Err(e) => why_not.push(format!("{mode} is unavailable: {e}")),
        }
    }
    ModeChoice {
        mode: ProxyMode::Iptables,
        reason: format!(
            "mode is blank; falling back to iptables because {}",
            why_not.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_prefers_ebpf_then_nftables_then_iptables() {
        let all = FixedSupport {
            supported: ProxyMode::ALL.to_vec(),
        };
        assert_eq!(pick_best(&all).mode, ProxyMode::Ebpf);
        let nft = FixedSupport {
            supported: vec![ProxyMode::Nftables, ProxyMode::Iptables],
        };
        let c = pick_best(&nft);
        assert_eq!(c.mode, ProxyMode::Nftables);
        assert!(c.reason.contains("ebpf is unavailable"), "{}", c.reason);
        let none = FixedSupport::default();
        assert_eq!(pick_best(&none).mode, ProxyMode::Iptables);
    }

    #[test]
    fn parse_round_trips() {
        for m in ProxyMode::ALL {
            assert_eq!(ProxyMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(ProxyMode::parse("kernelspace"), None);
        assert_eq!(ProxyMode::parse(""), None);
    }
}
