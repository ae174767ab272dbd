//! The packet asked about, and the frame built from it.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
};

use crate::cli::packet::Frame;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// A TCP SYN.
    #[value(alias = "TCP")]
    Tcp,
    /// A UDP datagram.
    #[value(alias = "UDP")]
    Udp,
    /// An SCTP INIT.
    #[value(alias = "SCTP")]
    Sctp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }

    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => proxy_common::proto::TCP,
            Proto::Udp => proxy_common::proto::UDP,
            Proto::Sctp => proxy_common::proto::SCTP,
        }
    }
}

/// Where the packet arrives on the node, which decides the programs that see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Origin {
    /// From a pod of this node: `tc_from_pod`.
    Pod,
    /// On an external interface: `xdp_from_netdev`, then `tc_from_netdev`
    /// when XDP passes it on.
    Outside,
    /// A connection of the node itself (the kubelet, a hostNetwork pod):
    /// the socket hook `sock_connect4`.
    #[value(alias = "node")]
    Host,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::Pod => "pod",
            Origin::Outside => "outside",
            Origin::Host => "host",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub proto: Proto,
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub origin: Origin,
}

impl Probe {
    /// A packet has one family: the error names `--dst` when it is not the source's.
    pub fn check(&self) -> Result<(), String> {
        if self.proto == Proto::Sctp && self.origin == Origin::Host {
            return Err(
                "--proto sctp --from host: the node's own SCTP connections are not balanced \
                 (the socket hooks serve TCP and UDP; docs/datapath.md)"
                    .into(),
            );
        }
        let family = |ip: &IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
        if self.src.is_ipv4() == self.dst.is_ipv4() {
            return Ok(());
        }
        Err(format!(
            "--dst: {} is {} but --src {} is {} (a packet has one family)",
            self.dst,
            family(&self.dst),
            self.src,
            family(&self.src)
        ))
    }

    pub fn is_ipv6(&self) -> bool {
        self.dst.is_ipv6()
    }

    pub fn source(&self) -> SocketAddr {
        SocketAddr::new(self.src, self.sport)
    }

    pub fn destination(&self) -> SocketAddr {
        SocketAddr::new(self.dst, self.dport)
    }

    /// The same packet from another source port.
    pub fn with_sport(self, sport: u16) -> Self {
        Self { sport, ..self }
    }

    /// The addresses and ports as the test-run frame carries them.
    pub fn frame(&self) -> Frame {
        match self.proto {
            Proto::Tcp => Frame::tcp(self.src, self.sport, self.dst, self.dport),
            Proto::Udp => Frame::udp(self.src, self.sport, self.dst, self.dport),
            Proto::Sctp => Frame::sctp(self.src, self.sport, self.dst, self.dport),
        }
    }

    /// An Ethernet + IPv4/IPv6 frame: a TCP SYN, a UDP datagram with a
    /// small payload, or an SCTP INIT.
    pub fn bytes(&self) -> Vec<u8> {
        let payload: &[u8] = match self.proto {
            Proto::Tcp | Proto::Sctp => b"",
            Proto::Udp => b"explain",
        };
        self.frame().build(payload)
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} -> {} from {}",
            self.proto.name(),
            self.source(),
            self.destination(),
            self.origin.name()
        )
    }
}

/// `n` distinct source ports from `first` on, wrapping past 65535 to 1.
pub fn source_ports(first: u16, n: u32) -> impl Iterator<Item = u16> {
    (0..n).map(move |i| ((u32::from(first) - 1 + i) % 65_535 + 1) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_are_distinct_and_wrap() {
        let ports: Vec<u16> = source_ports(65_534, 4).collect();
        assert_eq!(ports, vec![65_534, 65_535, 1, 2]);
        let all: std::collections::BTreeSet<u16> = source_ports(40_000, 65_535).collect();
        assert_eq!(all.len(), 65_535);
    }

    #[test]
    fn frames_carry_the_probe() {
        let p = Probe {
            proto: Proto::Udp,
            src: [192, 0, 2, 1].into(),
            sport: 1000,
            dst: [192, 0, 2, 2].into(),
            dport: 53,
            origin: Origin::Pod,
        };
        assert_eq!(Frame::parse(&p.bytes()), Some(p.frame()));
        assert_eq!(p.to_string(), "udp 192.0.2.1:1000 -> 192.0.2.2:53 from pod");
        let v6 = Probe {
            src: "2001:db8::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            ..p
        };
        assert_eq!(Frame::parse(&v6.bytes()), Some(v6.frame()));
        assert_eq!(
            v6.to_string(),
            "udp [2001:db8::1]:1000 -> [2001:db8::2]:53 from pod"
        );
    }
}
