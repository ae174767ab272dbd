//! Long-lived connections, to watch what happens to established flows while
//! the datapath changes under them (agent restarts, upgrades).
//!
//! [`EchoServer`] greets every TCP connection with its identity and a newline,
//! then echoes whatever it reads, until the peer closes; UDP datagrams get the
//! identity back. [`Connections`] holds many such TCP connections open and
//! checks that each still answers, from the same backend.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::netns;

/// Greets with its identity and echoes, on TCP and UDP `port`, in namespace `ns`.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServer {
    pub fn start(ns: &str, identity: &str, port: u16) -> anyhow::Result<Self> {
        let addr = SocketAddr::from(([0, 0, 0, 0], port));
        let tcp = netns::run_in(ns, move || TcpListener::bind(addr))?
            .context("binding the TCP echo server")?;
        let udp = netns::run_in(ns, move || UdpSocket::bind(addr))?
            .context("binding the UDP echo server")?;
        tcp.set_nonblocking(true)?;
        udp.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let greeting = format!("{identity}\n").into_bytes();
        let mut threads = Vec::new();
        {
            let (stop, greeting) = (stop.clone(), greeting.clone());
            threads.push(std::thread::spawn(move || {
                serve_tcp(&tcp, &greeting, &stop)
            }));
        }
        {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(&greeting, peer);
                    }
                }
            }));
        }
        Ok(Self { stop, threads })
    }
}

/// One thread for every connection: accept, greet, then echo whatever is
/// readable, without blocking on any one peer.
fn serve_tcp(listener: &TcpListener, greeting: &[u8], stop: &AtomicBool) {
    let mut conns: Vec<TcpStream> = Vec::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let mut busy = false;
        while let Ok((mut conn, _)) = listener.accept() {
            busy = true;
            if conn.write_all(greeting).is_ok() && conn.set_nonblocking(true).is_ok() {
                conns.push(conn);
            }
        }
        conns.retain_mut(|conn| match conn.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => {
                busy = true;
                let _ = conn.set_nonblocking(false);
                let ok = conn.write_all(&buf[..n]).is_ok();
                let _ = conn.set_nonblocking(true);
                ok
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Err(_) => false,
        });
        if !busy {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Many TCP connections to one target, each remembering which backend greeted it.
pub struct Connections {
    conns: Vec<(TcpStream, String)>,
}

/// What a round of pings over every connection found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    pub answered: usize,
    /// Reset, closed, timed out or answered wrongly.
    pub broken: usize,
}

impl Connections {
    /// Opens `count` connections from namespace `ns` and reads each greeting.
    pub fn open(ns: &str, target: SocketAddr, count: usize) -> anyhow::Result<Self> {
        netns::run_in(ns, move || -> anyhow::Result<Self> {
            let mut conns = Vec::with_capacity(count);
            for i in 0..count {
                let conn = TcpStream::connect_timeout(&target, Duration::from_secs(2))
                    .with_context(|| format!("connection {i} to {target}"))?;
                conn.set_read_timeout(Some(Duration::from_secs(2)))?;
                let identity =
                    read_line(&conn).with_context(|| format!("greeting of connection {i}"))?;
                conns.push((conn, identity));
            }
            Ok(Connections { conns })
        })?
    }

    /// The backend identity of every connection, in order.
    pub fn identities(&self) -> impl Iterator<Item = &str> {
        self.conns.iter().map(|(_, id)| id.as_str())
    }

    /// Sends a distinct line on every connection and reads it back.
    pub fn check(&mut self, round: u32) -> Check {
        let mut check = Check::default();
        for (i, (conn, _)) in self.conns.iter_mut().enumerate() {
            let line = format!("round {round} connection {i}\n");
            let ok = conn.write_all(line.as_bytes()).is_ok()
                && read_line(conn).is_ok_and(|echo| echo == line.trim_end());
            if ok {
                check.answered += 1;
            } else {
                check.broken += 1;
            }
        }
        check
    }
}

fn read_line(mut conn: &TcpStream) -> anyhow::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match conn.read(&mut byte) {
            Ok(0) => bail!("closed by the peer"),
            Ok(_) if byte[0] == b'\n' => return Ok(String::from_utf8_lossy(&line).into_owned()),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted && Instant::now() < deadline => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A steady stream of UDP datagrams from one socket (one flow) to a target,
/// counting the replies and the backends they came from.
pub struct UdpStream {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<UdpTally>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpTally {
    pub sent: u64,
    pub answered: u64,
    /// Replies per backend identity, in the order backends first answered.
    pub backends: Vec<(String, u64)>,
}

impl UdpStream {
    /// Sends one datagram every `interval` from namespace `ns`.
    pub fn start(ns: &str, target: SocketAddr, interval: Duration) -> anyhow::Result<Self> {
        let sock = netns::run_in(ns, || UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))))?
            .context("binding the UDP client")?;
        sock.set_read_timeout(Some(interval))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut tally = UdpTally::default();
            let mut buf = [0u8; 1500];
            while !flag.load(Ordering::Relaxed) {
                if sock.send_to(b"ping", target).is_ok() {
                    tally.sent += 1;
                }
                let started = Instant::now();
                if let Ok(n) = sock.recv(&mut buf) {
                    tally.answered += 1;
                    let id = String::from_utf8_lossy(&buf[..n]).trim_end().to_owned();
                    match tally.backends.iter_mut().find(|(b, _)| *b == id) {
                        Some((_, count)) => *count += 1,
                        None => tally.backends.push((id, 1)),
                    }
                }
                if let Some(rest) = interval.checked_sub(started.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            tally
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    pub fn finish(mut self) -> UdpTally {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for UdpStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
