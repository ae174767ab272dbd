//! The address family on the agent's side: how a model address becomes a
//! map address of [`V4`] or [`V6`], and which of the kernel maps hold that
//! family's entries. The programmers are written once, generic over it.

use std::{
    fmt,
    hash::Hash,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::{Pod, maps::lpm_trie::Key};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proxy_common::{Family, PrefixOf, SourceRangeOf, V4, V6, maps as names};

use crate::model::IpFamily;

pub trait AgentFamily: Family + fmt::Debug {
    /// The model's address of this family.
    type Ip: Copy + Ord + Hash + fmt::Debug + fmt::Display + Into<IpAddr>;
    type Net: Copy + Ord + Hash + fmt::Debug + fmt::Display + Into<IpNet>;
    const FAMILY: IpFamily;
    /// The map names of this family, for errors.
    const SERVICES: &'static str;
    const BACKENDS: &'static str;
    const CONNTRACK: &'static str;
    const SOURCE_RANGES: &'static str;
    const LOCAL_POD_CIDRS: &'static str;
    const SERVICE_CIDRS: &'static str;
    const MAGLEV: &'static str;
    const SLOTS: &'static str;
    const FILTER: &'static str;
    const SOCKETS: &'static str;

    fn ip(addr: &IpAddr) -> Option<Self::Ip>;
    fn net(net: &IpNet) -> Option<Self::Net>;
    /// In network byte order, as the maps hold it.
    fn to_be(ip: Self::Ip) -> Self::Addr;
    fn from_be(addr: Self::Addr) -> Self::Ip;
    fn host_net(ip: Self::Ip) -> Self::Net;
    fn contains(net: &Self::Net, ip: &Self::Ip) -> bool;
    /// The prefix length and first address of `net`, truncated.
    fn prefix(net: &Self::Net) -> (u8, Self::Ip);
    fn net_of(ip: Self::Ip, prefix_len: u8) -> Self::Net;

    /// The `SOURCE_RANGES*` key of `range` for `service_id`: the id is
    /// matched exactly (its 32 bits come first), then the range's prefix.
    fn source_range_key(service_id: u32, range: Self::Net) -> Key<SourceRangeOf<Self>>;
    /// The key of `cidr` in a prefix trie (`LOCAL_POD_CIDRS*`, `SERVICE_CIDRS*`).
    fn prefix_key(cidr: Self::Net) -> Key<PrefixOf<Self>>;
}

fn source_range_key<F: AgentFamily>(service_id: u32, range: F::Net) -> Key<SourceRangeOf<F>>
where
    SourceRangeOf<F>: Pod,
{
    let (len, addr) = F::prefix(&range);
    Key::new(
        32 + u32::from(len),
        SourceRangeOf {
            service_be: service_id.to_be(),
            addr_be: F::to_be(addr),
        },
    )
}

fn prefix_key<F: AgentFamily>(cidr: F::Net) -> Key<PrefixOf<F>>
where
    PrefixOf<F>: Pod,
{
    let (len, addr) = F::prefix(&cidr);
    Key::new(
        u32::from(len),
        PrefixOf {
            addr_be: F::to_be(addr),
        },
    )
}

impl AgentFamily for V4 {
    type Ip = Ipv4Addr;
    type Net = Ipv4Net;
    const FAMILY: IpFamily = IpFamily::V4;
    const SERVICES: &'static str = names::SERVICES;
    const MAGLEV: &'static str = names::MAGLEV;
    const SLOTS: &'static str = names::SLOTS;
    const FILTER: &'static str = names::FILTER;
    const BACKENDS: &'static str = names::BACKENDS;
    const CONNTRACK: &'static str = names::CONNTRACK;
    const SOCKETS: &'static str = names::SOCKETS;
    const SOURCE_RANGES: &'static str = names::SOURCE_RANGES;
    const LOCAL_POD_CIDRS: &'static str = names::LOCAL_POD_CIDRS;
    const SERVICE_CIDRS: &'static str = names::SERVICE_CIDRS;

    fn ip(addr: &IpAddr) -> Option<Ipv4Addr> {
        match addr {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        }
    }
    fn net(net: &IpNet) -> Option<Ipv4Net> {
        match net {
            IpNet::V4(n) => Some(n.trunc()),
            IpNet::V6(_) => None,
        }
    }
    fn to_be(ip: Ipv4Addr) -> u32 {
        u32::from(ip).to_be()
    }
    fn from_be(addr: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from_be(addr))
    }
    fn host_net(ip: Ipv4Addr) -> Ipv4Net {
        Ipv4Net::from(ip)
    }
    fn contains(net: &Ipv4Net, ip: &Ipv4Addr) -> bool {
        net.contains(ip)
    }
    fn prefix(net: &Ipv4Net) -> (u8, Ipv4Addr) {
        let net = net.trunc();
        (net.prefix_len(), net.addr())
    }
    fn source_range_key(service_id: u32, range: Ipv4Net) -> Key<SourceRangeOf<Self>> {
        source_range_key::<Self>(service_id, range)
    }
    fn prefix_key(cidr: Ipv4Net) -> Key<PrefixOf<Self>> {
        prefix_key::<Self>(cidr)
    }
    fn net_of(ip: Ipv4Addr, prefix_len: u8) -> Ipv4Net {
        Ipv4Net::new(ip, prefix_len.min(32)).unwrap_or_default()
    }
}

impl AgentFamily for V6 {
    type Ip = Ipv6Addr;
    type Net = Ipv6Net;
    const FAMILY: IpFamily = IpFamily::V6;
    const SERVICES: &'static str = names::SERVICES6;
    const MAGLEV: &'static str = names::MAGLEV6;
    const SLOTS: &'static str = names::SLOTS6;
    const FILTER: &'static str = names::FILTER6;
    const BACKENDS: &'static str = names::BACKENDS6;
    const CONNTRACK: &'static str = names::CONNTRACK6;
    const SOCKETS: &'static str = names::SOCKETS6;
    const SOURCE_RANGES: &'static str = names::SOURCE_RANGES6;
    const LOCAL_POD_CIDRS: &'static str = names::LOCAL_POD_CIDRS6;
    const SERVICE_CIDRS: &'static str = names::SERVICE_CIDRS6;

    fn ip(addr: &IpAddr) -> Option<Ipv6Addr> {
        match addr {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        }
    }
    fn net(net: &IpNet) -> Option<Ipv6Net> {
        match net {
            IpNet::V6(n) => Some(n.trunc()),
            IpNet::V4(_) => None,
        }
    }
    fn to_be(ip: Ipv6Addr) -> [u32; 4] {
        let o = ip.octets();
        std::array::from_fn(|i| {
            u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
        })
    }
    fn from_be(addr: [u32; 4]) -> Ipv6Addr {
        let mut o = [0u8; 16];
        for (i, w) in addr.iter().enumerate() {
            o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        Ipv6Addr::from(o)
    }
    fn host_net(ip: Ipv6Addr) -> Ipv6Net {
        Ipv6Net::from(ip)
    }
    fn contains(net: &Ipv6Net, ip: &Ipv6Addr) -> bool {
        net.contains(ip)
    }
    fn prefix(net: &Ipv6Net) -> (u8, Ipv6Addr) {
        let net = net.trunc();
        (net.prefix_len(), net.addr())
    }
    fn source_range_key(service_id: u32, range: Ipv6Net) -> Key<SourceRangeOf<Self>> {
        source_range_key::<Self>(service_id, range)
    }
    fn prefix_key(cidr: Ipv6Net) -> Key<PrefixOf<Self>> {
        prefix_key::<Self>(cidr)
    }
    fn net_of(ip: Ipv6Addr, prefix_len: u8) -> Ipv6Net {
        Ipv6Net::new(ip, prefix_len.min(128)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_round_trip_in_network_order() {
        let ip: Ipv6Addr = "2001:db8::1:2".parse().unwrap();
        let be = V6::to_be(ip);
        assert_eq!(be[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(be[3].to_ne_bytes(), [0, 1, 0, 2]);
        assert_eq!(V6::from_be(be), ip);
    }

    #[test]
    fn source_range_keys_put_the_service_first_in_both_families() {
        let key = V6::source_range_key(7, "2001:db8:1::5/48".parse().unwrap());
        assert_eq!(key.prefix_len(), 32 + 48);
        assert_eq!(key.data().service_be.to_ne_bytes(), [0, 0, 0, 7]);
        assert_eq!(
            V6::from_be(key.data().addr_be),
            "2001:db8:1::".parse::<Ipv6Addr>().unwrap()
        );
        let key = V4::source_range_key(7, "10.1.2.3/16".parse().unwrap());
        assert_eq!(key.prefix_len(), 48);
        assert_eq!(key.data().addr_be.to_ne_bytes(), [10, 1, 0, 0]);
    }
}
