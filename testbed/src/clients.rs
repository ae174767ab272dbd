//! Clients that report what happened to one TCP connection or UDP request,
//! so tests can tell a reply from a refusal (RST / ICMP port unreachable)
//! from silence (a drop). Each runs on a thread inside the given namespace.

use std::{
    io::{self, Read as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};

use crate::netns;

#[derive(Debug)]
pub enum ConnectOutcome {
    /// `identity` is everything the server sent before closing (an
    /// [`crate::servers::IdentityServer`] sends its identity); `elapsed` is
    /// the time `connect` took.
    Connected { identity: String, elapsed: Duration },
    /// A RST or an ICMP port unreachable answered the SYN (ECONNREFUSED);
    /// `elapsed` is the time until it did.
    Refused { elapsed: Duration },
    /// Nothing answered the SYN within the timeout.
    TimedOut,
    /// Anything else, e.g. `NetworkUnreachable` when there is no route.
    Other(io::Error),
}

impl ConnectOutcome {
    pub fn identity(&self) -> Option<&str> {
        match self {
            ConnectOutcome::Connected { identity, .. } => Some(identity),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub enum UdpOutcome {
    /// The socket is connected to the destination, so `from` is always the
    /// destination: a reply from any other address (a missing reverse NAT) is
    /// dropped by the kernel and shows as [`UdpOutcome::TimedOut`].
    Reply {
        identity: String,
        from: SocketAddrV4,
    },
    /// An ICMP port unreachable came back (ECONNREFUSED). Other ICMP errors
    /// show as [`UdpOutcome::Other`], e.g. `HostUnreachable`.
    Refused,
    TimedOut,
    Other(io::Error),
}

impl UdpOutcome {
    pub fn identity(&self) -> Option<&str> {
        match self {
            UdpOutcome::Reply { identity, .. } => Some(identity),
            _ => None,
        }
    }
}

/// Connects from namespace `ns` (from address `src` if given) to `dst` and
/// reads what the server sends until it closes.
pub fn tcp_connect_outcome(
    ns: &str,
    src: Option<Ipv4Addr>,
    dst: SocketAddrV4,
    timeout: Duration,
) -> ConnectOutcome {
    netns::run_in(ns, move || tcp_connect_here(src, dst, timeout))
        .unwrap_or_else(|e| ConnectOutcome::Other(io::Error::other(e)))
}

fn tcp_connect_here(src: Option<Ipv4Addr>, dst: SocketAddrV4, timeout: Duration) -> ConnectOutcome {
    let sock = match bound_socket(Type::STREAM, Protocol::TCP, src) {
        Ok(sock) => sock,
        Err(e) => return ConnectOutcome::Other(e),
    };
    let start = Instant::now();
    if let Err(e) = sock.connect_timeout(&dst.into(), timeout) {
        return match e.kind() {
            io::ErrorKind::ConnectionRefused => ConnectOutcome::Refused {
                elapsed: start.elapsed(),
            },
            io::ErrorKind::TimedOut => ConnectOutcome::TimedOut,
            _ => ConnectOutcome::Other(e),
        };
    }
    let elapsed = start.elapsed();
    let mut stream = TcpStream::from(sock);
    let mut identity = String::new();
    let read = stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.read_to_string(&mut identity));
    match read {
        Ok(_) => ConnectOutcome::Connected { identity, elapsed },
        Err(e) => ConnectOutcome::Other(io::Error::new(
            e.kind(),
            format!("connected to {dst}, then reading what it sent: {e}"),
        )),
    }
}

/// Sends one datagram from namespace `ns` (from address `src` if given) on a
/// socket connected to `dst`, and waits for one reply.
pub fn udp_outcome(
    ns: &str,
    src: Option<Ipv4Addr>,
    dst: SocketAddrV4,
    timeout: Duration,
) -> UdpOutcome {
    netns::run_in(ns, move || udp_here(src, dst, timeout))
        .unwrap_or_else(|e| UdpOutcome::Other(io::Error::other(e)))
}

fn udp_here(src: Option<Ipv4Addr>, dst: SocketAddrV4, timeout: Duration) -> UdpOutcome {
    let exchange = || -> io::Result<(String, SocketAddrV4)> {
        let sock = UdpSocket::from(bound_socket(Type::DGRAM, Protocol::UDP, src)?);
        sock.connect(dst)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.send(b"who")?;
        let mut buf = [0u8; 1500];
        let (n, from) = sock.recv_from(&mut buf)?;
        let from = match from {
            std::net::SocketAddr::V4(from) => from,
            std::net::SocketAddr::V6(_) => unreachable!("an IPv4 socket"),
        };
        Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
    };
    match exchange() {
        Ok((identity, from)) => UdpOutcome::Reply { identity, from },
        Err(e) => match e.kind() {
            io::ErrorKind::ConnectionRefused => UdpOutcome::Refused,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => UdpOutcome::TimedOut,
            _ => UdpOutcome::Other(e),
        },
    }
}

fn bound_socket(ty: Type, proto: Protocol, src: Option<Ipv4Addr>) -> io::Result<Socket> {
    let sock = Socket::new(Domain::IPV4, ty, Some(proto))?;
    if let Some(src) = src {
        sock.bind(&SocketAddrV4::new(src, 0).into())?;
    }
    Ok(sock)
}
