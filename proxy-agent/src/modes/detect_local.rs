//! How this node's pod traffic is recognised (`detectLocalMode`), for
//! every mode: the ebpf mode's node facts and the nftables and iptables
//! rules take it from here.

use ipnet::IpNet;

use crate::options::ProxyOptions;

/// How local pod traffic is recognised (`detectLocalMode`). By CIDR, each
/// family has a detector of its own, as upstream's per-family proxiers do:
/// a family without a CIDR has none (upstream's no-op detector).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetectLocal {
    /// No detection (ClusterCIDR mode without any cluster CIDR).
    None,
    /// `clusterCIDR`, both families.
    ClusterCidr(Vec<IpNet>),
    /// The Node's podCIDRs, both families.
    NodeCidr,
    BridgeInterface(String),
    InterfaceNamePrefix(String),
}

impl DetectLocal {
    pub fn from_options(opts: &ProxyOptions) -> Self {
        let config = &opts.config;
        match config.detect_local_mode.as_str() {
            "NodeCIDR" => DetectLocal::NodeCidr,
            "BridgeInterface" => {
                DetectLocal::BridgeInterface(config.detect_local.bridge_interface.clone())
            }
            "InterfaceNamePrefix" => {
                DetectLocal::InterfaceNamePrefix(config.detect_local.interface_name_prefix.clone())
            }
            _ => {
                let cidrs: Vec<IpNet> = opts.cluster_cidrs().iter().map(IpNet::trunc).collect();
                if cidrs.is_empty() {
                    DetectLocal::None
                } else {
                    DetectLocal::ClusterCidr(cidrs)
                }
            }
        }
    }
}
