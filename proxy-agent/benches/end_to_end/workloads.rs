//! What runs through each datapath: the servers' listeners and the clients'
//! workloads, each returning what it measured. They run in a worker
//! ([`super::worker`]) on the host of their role.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::common;

pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 8053;
const REQUEST: &[u8] = b"GET / HTTP/1.0\r\nHost: bench\r\n\r\n";
/// A bulk transfer starts with this instead of a request.
const BULK: &[u8] = b"BULK\r\n\r\n";
/// Payload of a small UDP packet (64 bytes on the wire with headers: 18 + 28).
const UDP_PAYLOAD: [u8; 18] = [0x55; 18];

/// A server's listeners: TCP answers a request with its name (or sinks a
/// bulk transfer and answers with the byte count), UDP counts datagrams
/// into `udp_received`.
pub fn serve(
    name: &str,
    stop: Arc<AtomicBool>,
    udp_received: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let tcp = TcpListener::bind(("0.0.0.0", TCP_PORT)).context("TCP listener")?;
    let udp = UdpSocket::bind(("0.0.0.0", UDP_PORT)).context("UDP listener")?;
    let reply = format!(
        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\nok-{name}",
        name.len() + 3
    );
    let stop_tcp = stop.clone();
    std::thread::spawn(move || {
        for conn in tcp.incoming() {
            if stop_tcp.load(Ordering::Relaxed) {
                return;
            }
            let Ok(c) = conn else { continue };
            answer(c, reply.as_bytes());
        }
    });
    udp.set_read_timeout(Some(Duration::from_millis(200)))?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if udp.recv(&mut buf).is_ok() {
                udp_received.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ok(())
}

fn answer(mut c: TcpStream, reply: &[u8]) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut seen = 0;
    while !buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf[seen..1024]) {
            Ok(0) | Err(_) => return,
            Ok(n) => seen = (seen + n).min(1023),
        }
    }
    if buf.starts_with(b"BULK") {
        let mut total = 0u64;
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(_) => return,
            }
        }
        let _ = c.write_all(format!("ok {total}").as_bytes());
    } else {
        let _ = c.write_all(reply);
    }
}

/// One short connection: its duration and the server that answered.
pub fn one_request(target: SocketAddr, timeout: Duration) -> anyhow::Result<(Duration, String)> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&target, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    s.write_all(REQUEST)?;
    let mut reply = Vec::with_capacity(96);
    s.read_to_end(&mut reply)?;
    let text = String::from_utf8_lossy(&reply);
    let Some(server) = text.rsplit_once("ok-").map(|(_, name)| name.to_owned()) else {
        bail!("unexpected reply {text:?}");
    };
    // A RST instead of a FIN: no TIME_WAIT piles up over thousands of connections.
    let _ = common::socket_linger_zero(&s);
    Ok((t.elapsed(), server))
}

/// When the proxy whose metrics are at `metrics` finished its last sync
/// (seconds since the epoch, its clock), or an error before its first:
/// upstream's `kubeproxy_sync_proxy_rules_last_timestamp_seconds` is set
/// after each one, and the first is the whole state (every service), not
/// only the services written first. (`/healthz` cannot tell: upstream marks
/// it updated when the sync loop starts.) The latest of the families'.
pub fn last_sync(metrics: SocketAddr, timeout: Duration) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect_timeout(&metrics, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut reply = Vec::with_capacity(16 << 10);
    s.read_to_end(&mut reply)?;
    let text = String::from_utf8_lossy(&reply);
    // One sample per IP family the proxy serves.
    let syncs = text
        .lines()
        .filter_map(|l| l.strip_prefix("kubeproxy_sync_proxy_rules_last_timestamp_seconds"))
        .filter(|rest| rest.starts_with(['{', ' ']))
        .map(|rest| {
            let value = rest.rsplit(' ').next().unwrap_or_default();
            value.parse::<f64>().context("the sync timestamp")
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    match syncs.iter().copied().reduce(f64::max) {
        Some(latest) if syncs.iter().all(|t| *t > 0.0) => Ok(latest),
        Some(_) => bail!("a family has not synced yet"),
        None => bail!("no sync timestamp in the metrics at {metrics}"),
    }
}

/// `count` connections, one at a time: the elapsed time and each
/// connection's latency.
pub fn connections(target: SocketAddr, count: usize) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let mut latencies = Vec::with_capacity(count);
    let start = Instant::now();
    for _ in 0..count {
        latencies.push(one_request(target, Duration::from_secs(2))?.0);
    }
    Ok((start.elapsed(), latencies))
}

/// One TCP connection sending for `length`: bits per second the server received.
pub fn bulk(target: SocketAddr, length: Duration) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(BULK)?;
    let chunk = vec![0x42u8; 128 * 1024];
    let start = Instant::now();
    while start.elapsed() < length {
        s.write_all(&chunk)?;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let elapsed = start.elapsed();
    let received: u64 = reply
        .strip_prefix("ok ")
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("bulk: unexpected reply {reply:?}"))?;
    Ok(received as f64 * 8.0 / elapsed.as_secs_f64())
}

/// Small datagrams from one connected socket for `length`, as fast as it
/// can send (the servers count what arrives): how long it sent.
pub fn udp(target: SocketAddr, length: Duration) -> anyhow::Result<Duration> {
    let s = UdpSocket::bind(("0.0.0.0", 0))?;
    s.connect(target)?;
    let start = Instant::now();
    while start.elapsed() < length {
        for _ in 0..64 {
            // A full socket buffer or an ICMP error from an earlier
            // packet: the rate counts what arrived.
            let _ = s.send(&UDP_PAYLOAD);
        }
    }
    Ok(start.elapsed())
}

/// Softirq time of every CPU so far, in ns (/proc/stat counts USER_HZ ticks).
pub fn softirq_ns() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: u64 = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse().ok())
        .context("/proc/stat: no softirq time")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(ticks * 1_000_000_000 / hz)
}
