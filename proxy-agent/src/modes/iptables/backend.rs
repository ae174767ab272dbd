//! Which iptables backend the rules go to, chosen as upstream's kube-proxy
//! image chooses it (kubernetes-sigs/iptables-wrappers): the backend in
//! which kubelet created its `KUBE-IPTABLES-HINT` or `KUBE-KUBELET-CANARY`
//! chain (nft checked first), else nft. Rules in the other backend would
//! run in an order nobody chose, so the node's own choice wins.

use std::process::{Command, Stdio};

use crate::model::IpFamily;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IptablesBackend {
    Legacy,
    Nft,
}

/// The binaries of one family and backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tools {
    pub iptables: &'static str,
    pub save: &'static str,
    pub restore: &'static str,
}

impl IptablesBackend {
    pub fn name(self) -> &'static str {
        match self {
            IptablesBackend::Legacy => "legacy",
            IptablesBackend::Nft => "nft",
        }
    }

    pub fn tools(self, family: IpFamily) -> Tools {
        use IptablesBackend::*;
        match (self, family) {
            (Nft, IpFamily::V4) => Tools {
                iptables: "iptables-nft",
                save: "iptables-nft-save",
                restore: "iptables-nft-restore",
            },
            (Nft, IpFamily::V6) => Tools {
                iptables: "ip6tables-nft",
                save: "ip6tables-nft-save",
                restore: "ip6tables-nft-restore",
            },
            (Legacy, IpFamily::V4) => Tools {
                iptables: "iptables-legacy",
                save: "iptables-legacy-save",
                restore: "iptables-legacy-restore",
            },
            (Legacy, IpFamily::V6) => Tools {
                iptables: "ip6tables-legacy",
                save: "ip6tables-legacy-save",
                restore: "ip6tables-legacy-restore",
            },
        }
    }

    /// The node's backend, and why.
    pub fn detect() -> (Self, &'static str) {
        let dump = |cmd: &str, args: &[&str]| {
            Command::new(cmd)
                .args(args)
                .stderr(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        // `-t mangle` only for nft: iptables-legacy-save would create the table.
        choose(
            || {
                dump("iptables-nft-save", &["-t", "mangle"])
                    + &dump("ip6tables-nft-save", &["-t", "mangle"])
            },
            || dump("iptables-legacy-save", &[]) + &dump("ip6tables-legacy-save", &[]),
        )
    }
}

/// The wrapper's decision from the nft mangle dump and the legacy dump
/// (each fetched only when needed).
fn choose(
    nft_mangle: impl FnOnce() -> String,
    legacy: impl FnOnce() -> String,
) -> (IptablesBackend, &'static str) {
    if has_kubelet_chains(&nft_mangle()) {
        (
            IptablesBackend::Nft,
            "kubelet's chains are in the nft backend",
        )
    } else if has_kubelet_chains(&legacy()) {
        (
            IptablesBackend::Legacy,
            "kubelet's chains are in the legacy backend",
        )
    } else {
        (
            IptablesBackend::Nft,
            "no kubelet chains in either backend: nft, as upstream's default",
        )
    }
}

fn has_kubelet_chains(dump: &str) -> bool {
    dump.lines()
        .any(|l| l.starts_with(":KUBE-IPTABLES-HINT") || l.starts_with(":KUBE-KUBELET-CANARY"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const CANARY: &str = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";

    #[test]
    fn kubelets_backend_wins_nft_first() {
        assert_eq!(
            choose(|| HINT.into(), || CANARY.into()).0,
            IptablesBackend::Nft
        );
        assert_eq!(
            choose(String::new, || CANARY.into()).0,
            IptablesBackend::Legacy
        );
        assert_eq!(
            choose(String::new, || HINT.into()).0,
            IptablesBackend::Legacy
        );
        assert_eq!(choose(String::new, String::new).0, IptablesBackend::Nft);
        // A rule mentioning the chain is not the chain.
        let rule = "*filter\n-A INPUT -j KUBE-KUBELET-CANARY\nCOMMIT\n";
        assert_eq!(choose(String::new, || rule.into()).0, IptablesBackend::Nft);
    }
}
