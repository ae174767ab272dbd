//! Backend servers that answer TCP and UDP with their own identity, and
//! the matching clients. Each runs on a thread inside a pod's namespace.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;

use crate::netns;

/// What a server saw: the source address of every request.
#[derive(Default)]
pub struct Seen {
    pub tcp: Mutex<Vec<SocketAddr>>,
    pub udp: Mutex<Vec<SocketAddr>>,
}

/// A TCP + UDP identity server on `port` in one namespace; stops on drop.
pub struct IdentityServer {
    pub identity: String,
    pub seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl IdentityServer {
    pub fn start(ns: &str, identity: &str, port: u16) -> anyhow::Result<Self> {
        Self::start_on(ns, identity, port, false)
    }

    /// The same, answering in IPv6 too (a second, IPv6-only pair of sockets).
    pub fn start_dual_stack(ns: &str, identity: &str, port: u16) -> anyhow::Result<Self> {
        Self::start_on(ns, identity, port, true)
    }

    fn start_on(ns: &str, identity: &str, port: u16, ipv6: bool) -> anyhow::Result<Self> {
        let seen = Arc::new(Seen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut addrs = vec![SocketAddr::from(([0, 0, 0, 0], port))];
        if ipv6 {
            addrs.push(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)));
        }
        let mut threads = Vec::new();
        for addr in addrs {
            let (tcp, udp) = netns::run_in(ns, move || bind_pair(addr))?
                .with_context(|| format!("binding the servers on {addr}"))?;
            tcp.set_nonblocking(true)?;
            udp.set_read_timeout(Some(Duration::from_millis(50)))?;
            {
                let (id, seen, stop) = (identity.as_bytes().to_vec(), seen.clone(), stop.clone());
                threads.push(std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match tcp.accept() {
                            Ok((mut conn, peer)) => {
                                seen.tcp.lock().unwrap().push(peer);
                                let _ = conn.set_nonblocking(false);
                                let _ = conn.write_all(&id);
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(2)),
                        }
                    }
                }));
            }
            {
                let (id, seen, stop) = (identity.as_bytes().to_vec(), seen.clone(), stop.clone());
                threads.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 1500];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                            seen.udp.lock().unwrap().push(peer);
                            let _ = udp.send_to(&id, peer);
                        }
                    }
                }));
            }
        }
        Ok(Self {
            identity: identity.to_owned(),
            seen,
            stop,
            threads,
        })
    }
}

/// A TCP listener and a UDP socket on `addr`; an IPv6 one answers IPv6
/// only, beside its IPv4 twin on the same port.
fn bind_pair(addr: SocketAddr) -> std::io::Result<(TcpListener, UdpSocket)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = Domain::for_address(addr);
    let bind = |ty: Type, proto: Protocol| -> std::io::Result<Socket> {
        let sock = Socket::new(domain, ty, Some(proto))?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        sock.set_reuse_address(true)?;
        sock.bind(&addr.into())?;
        Ok(sock)
    };
    let tcp = bind(Type::STREAM, Protocol::TCP)?;
    tcp.listen(128)?;
    let udp = bind(Type::DGRAM, Protocol::UDP)?;
    Ok((tcp.into(), udp.into()))
}

impl IdentityServer {
    /// The source address of every TCP connection accepted so far, in order:
    /// the client's own, or the node's when the datapath masqueraded it.
    pub fn tcp_sources(&self) -> Vec<Ipv4Addr> {
        ipv4s(&self.seen.tcp)
    }

    /// The source address of every UDP request so far, in order.
    pub fn udp_sources(&self) -> Vec<Ipv4Addr> {
        ipv4s(&self.seen.udp)
    }

    /// Forgets what was seen, e.g. between the phases of a test.
    pub fn clear_seen(&self) {
        self.seen.tcp.lock().unwrap().clear();
        self.seen.udp.lock().unwrap().clear();
    }
}

fn ipv4s(peers: &Mutex<Vec<SocketAddr>>) -> Vec<Ipv4Addr> {
    peers
        .lock()
        .unwrap()
        .iter()
        .filter_map(|peer| match peer {
            SocketAddr::V4(peer) => Some(*peer.ip()),
            SocketAddr::V6(_) => None,
        })
        .collect()
}

impl Drop for IdentityServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One TCP connection to `target`: the identity the server sent.
/// Must run inside the client's namespace (see [`netns::run_in`]).
pub fn tcp_identity(target: SocketAddr, timeout: Duration) -> anyhow::Result<String> {
    let mut conn = TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("connecting to {target}"))?;
    conn.set_read_timeout(Some(timeout))?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)
        .context("reading the identity")?;
    Ok(reply)
}

/// One UDP request to `target` from a fresh socket: the identity and the
/// address the reply came from. Must run inside the client's namespace.
pub fn udp_identity(target: SocketAddr, timeout: Duration) -> anyhow::Result<(String, SocketAddr)> {
    let any = if target.is_ipv6() {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let sock = UdpSocket::bind(any)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.send_to(b"who", target)?;
    let mut buf = [0u8; 1500];
    let (n, from) = sock
        .recv_from(&mut buf)
        .with_context(|| format!("no UDP reply from {target}"))?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
}
