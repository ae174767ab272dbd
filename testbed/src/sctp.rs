//! SCTP without SCTP sockets (these kernels have none): a backend that
//! answers an INIT with an INIT ACK carrying its identity in the state
//! cookie, and a client that sends an INIT and reads the answer, both over
//! raw IP sockets of protocol 132 on a thread inside a pod's namespace.
//! Every packet received has its CRC32c checked (the `crc32c` crate);
//! the backend counts the bad ones and the client refuses them.

use std::{
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::netns;

const IPPROTO_SCTP: i32 = 132;
const HLEN: usize = 12;
const INIT: u8 = 1;
const INIT_ACK: u8 = 2;
const STATE_COOKIE: u16 = 7;

/// An SCTP packet: the common header and its chunks, with a valid CRC32c.
fn packet(sport: u16, dport: u16, tag: u32, chunks: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(HLEN + chunks.len());
    p.extend(sport.to_be_bytes());
    p.extend(dport.to_be_bytes());
    p.extend(tag.to_be_bytes());
    p.extend([0; 4]);
    p.extend(chunks);
    let crc = crc32c::crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
}

/// Whether an SCTP packet's CRC32c verifies.
pub fn crc_valid(sctp: &[u8]) -> bool {
    if sctp.len() < HLEN {
        return false;
    }
    let mut zeroed = sctp.to_vec();
    zeroed[8..12].fill(0);
    sctp[8..12] == crc32c::crc32c(&zeroed).to_le_bytes()
}

fn chunk(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut c = vec![kind, 0];
    c.extend(((4 + value.len()) as u16).to_be_bytes());
    c.extend(value);
    c.resize(c.len().next_multiple_of(4), 0);
    c
}

/// INIT or INIT ACK's fixed part, then optional parameters.
fn init_chunk(kind: u8, tag: u32, params: &[u8]) -> Vec<u8> {
    let mut v = tag.to_be_bytes().to_vec();
    v.extend(65_535u32.to_be_bytes());
    v.extend([0, 10, 0, 10]);
    v.extend(1u32.to_be_bytes());
    v.extend(params);
    chunk(kind, &v)
}

fn raw_socket(ipv6: bool) -> anyhow::Result<Socket> {
    let domain = if ipv6 { Domain::IPV6 } else { Domain::IPV4 };
    Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))
        .context("a raw IP socket of protocol 132 (SCTP)")
}

/// One packet received: its source and its SCTP bytes (an IPv4 raw socket
/// hands the IP header too; it is skipped).
fn receive(sock: &Socket, buf: &mut [MaybeUninit<u8>]) -> std::io::Result<(IpAddr, Vec<u8>)> {
    let (n, from) = sock.recv_from(buf)?;
    // SAFETY: recv_from initialised the first n bytes.
    let bytes: Vec<u8> = buf[..n]
        .iter()
        .map(|b| unsafe { b.assume_init() })
        .collect();
    let source = from
        .as_socket()
        .map(|a| a.ip())
        .ok_or_else(|| std::io::Error::other("a packet without an IP source"))?;
    let sctp = if source.is_ipv4() {
        let ihl = bytes.first().map_or(0, |b| (b & 0x0f) as usize * 4);
        bytes.get(ihl..).unwrap_or_default().to_vec()
    } else {
        bytes
    };
    Ok((source, sctp))
}

/// What an [`SctpServer`] saw.
#[derive(Default)]
pub struct SctpSeen {
    /// The source of every INIT with a valid CRC32c.
    pub inits: Mutex<Vec<SocketAddr>>,
    /// Packets whose CRC32c did not verify.
    pub bad_crc: AtomicUsize,
}

/// Answers INITs to `port` with an INIT ACK whose state cookie is its
/// identity, in IPv4 and IPv6; stops on drop.
pub struct SctpServer {
    pub seen: Arc<SctpSeen>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl SctpServer {
    pub fn start(ns: &str, identity: &str, port: u16) -> anyhow::Result<Self> {
        let seen = Arc::new(SctpSeen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for ipv6 in [false, true] {
            let sock = netns::run_in(ns, move || raw_socket(ipv6))??;
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            let (seen, stop, identity) = (seen.clone(), stop.clone(), identity.as_bytes().to_vec());
            threads.push(std::thread::spawn(move || {
                let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((from, sctp)) = receive(&sock, &mut buf) else {
                        continue;
                    };
                    if sctp.len() < HLEN + 4 + 16 || u16::from_be_bytes([sctp[2], sctp[3]]) != port
                    {
                        continue;
                    }
                    if !crc_valid(&sctp) {
                        seen.bad_crc.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if sctp[HLEN] != INIT {
                        continue;
                    }
                    let sport = u16::from_be_bytes([sctp[0], sctp[1]]);
                    let peer_tag = u32::from_be_bytes(sctp[HLEN + 4..HLEN + 8].try_into().unwrap());
                    seen.inits
                        .lock()
                        .unwrap()
                        .push(SocketAddr::new(from, sport));
                    let mut cookie = STATE_COOKIE.to_be_bytes().to_vec();
                    cookie.extend(((4 + identity.len()) as u16).to_be_bytes());
                    cookie.extend(&identity);
                    cookie.resize(cookie.len().next_multiple_of(4), 0);
                    let answer = packet(
                        port,
                        sport,
                        peer_tag,
                        &init_chunk(INIT_ACK, 0x0bac_0e0d, &cookie),
                    );
                    let _ = sock.send_to(&answer, &SockAddr::from(SocketAddr::new(from, 0)));
                }
            }));
        }
        Ok(Self {
            seen,
            stop,
            threads,
        })
    }
}

impl Drop for SctpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What one association attempt got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitAck {
    /// The state cookie: the server's identity.
    pub identity: String,
    /// Where the INIT ACK came from (address and port).
    pub from: SocketAddr,
}

/// Sends an INIT from port `sport` to `target` and waits for the INIT ACK
/// answering it (to `sport`, with the INIT's tag, a valid CRC32c). Must run
/// inside the client's namespace (see [`netns::run_in`]).
pub fn init(target: SocketAddr, sport: u16, timeout: Duration) -> anyhow::Result<InitAck> {
    let sock = raw_socket(target.is_ipv6())?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let tag = 0x5c7f_0000 | u32::from(sport);
    let request = packet(sport, target.port(), 0, &init_chunk(INIT, tag, &[]));
    sock.send_to(&request, &SockAddr::from(SocketAddr::new(target.ip(), 0)))
        .with_context(|| format!("sending an INIT to {target}"))?;
    let deadline = Instant::now() + timeout;
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    while Instant::now() < deadline {
        let Ok((from, sctp)) = receive(&sock, &mut buf) else {
            continue;
        };
        if sctp.len() < HLEN + 4 || u16::from_be_bytes([sctp[2], sctp[3]]) != sport {
            continue;
        }
        if !crc_valid(&sctp) {
            bail!("an answer from {from} with a bad CRC32c");
        }
        if sctp[HLEN] != INIT_ACK || sctp[4..8] != tag.to_be_bytes() {
            continue;
        }
        let from = SocketAddr::new(from, u16::from_be_bytes([sctp[0], sctp[1]]));
        // The state cookie parameter follows the INIT ACK's 16 fixed bytes.
        let params = sctp.get(HLEN + 20..).unwrap_or_default();
        if params.len() < 4 || u16::from_be_bytes([params[0], params[1]]) != STATE_COOKIE {
            bail!("an INIT ACK from {from} without a state cookie");
        }
        let len = u16::from_be_bytes([params[2], params[3]]) as usize;
        let identity = params.get(4..len).unwrap_or_default();
        return Ok(InitAck {
            identity: String::from_utf8_lossy(identity).into_owned(),
            from,
        });
    }
    bail!("no INIT ACK from {target} within {timeout:?}")
}
