//! Clients for the socket hooks: each runs in a child process that has
//! joined a test cgroup (the hooks act on the cgroup a socket is created in,
//! which is per process) and a network namespace, so the test process
//! itself and its other threads stay out of both.
//!
//! The child is this test binary again, running only [`client_process`]
//! with the job in an environment variable; it prints one result line.

use std::{
    io::Read as _,
    net::{SocketAddr, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

const JOB_ENV: &str = "KUBE_EBPF_PROXY_SOCK_CLIENT";
const RESULT: &str = "SOCK_CLIENT_RESULT ";
/// How long a client waits for a connection or an answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// connect(2), getpeername(2), read what the server sends.
    Tcp,
    /// sendto(2) and recvfrom(2) on an unconnected socket.
    Udp,
    /// connect(2), send(2), recv(2), getpeername(2).
    UdpConnected,
}

/// A UDP client that keeps one connected socket and sends every 50 ms,
/// reconnecting (a new socket) when the socket fails, as a resolver does;
/// each answer or failure is one line on its stdout.
pub struct UdpStream {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl UdpStream {
    pub fn start(place: &Place, dst: SocketAddr) -> Self {
        let mut child = client_command(place, "Stream", dst)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting a client process");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(at) = line.find(RESULT) {
                    let _ = tx.send(line[at + RESULT.len()..].to_string());
                }
            }
        });
        UdpStream { child, lines }
    }

    /// The next line within `timeout`: `answer <identity>` or `failed <error>`.
    pub fn next(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for UdpStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This test binary again, running only [`client_process`] with the job.
fn client_command(place: &Place, op: &str, dst: SocketAddr) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([
            "--exact",
            "sock_client::client_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            JOB_ENV,
            format!(
                "{}|/run/netns/{}|{op}|{dst}",
                place.cgroup.display(),
                place.netns
            ),
        );
    command
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server's identity, and the peer the application was shown
    /// (getpeername, or recvfrom's source).
    Answered {
        identity: String,
        peer: SocketAddr,
    },
    /// ECONNREFUSED, and how long it took.
    Refused {
        elapsed: Duration,
    },
    TimedOut,
    Failed(String),
}

impl Outcome {
    pub fn identity(&self) -> Option<&str> {
        match self {
            Outcome::Answered { identity, .. } => Some(identity),
            _ => None,
        }
    }
}

/// Where clients run: a cgroup directory and a network namespace.
#[derive(Clone, Debug)]
pub struct Place {
    pub cgroup: PathBuf,
    pub netns: String,
}

/// Runs `op` against `dst` from a fresh child process in `place`.
pub fn run(place: &Place, op: Op, dst: SocketAddr) -> Outcome {
    let out = client_command(place, &format!("{op:?}"), dst)
        .output()
        .expect("starting a client process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // libtest's own "test ... " may precede it on the line.
    let Some(line) = stdout
        .lines()
        .find_map(|l| l.find(RESULT).map(|at| &l[at + RESULT.len()..]))
    else {
        return Outcome::Failed(format!(
            "no result from the client: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    parse(line)
}

fn parse(line: &str) -> Outcome {
    let mut words = line.splitn(3, ' ');
    match words.next() {
        Some("answered") => {
            let peer = words.next().and_then(|p| p.parse().ok());
            let identity = words.next().unwrap_or_default().to_string();
            match peer {
                Some(peer) => Outcome::Answered { identity, peer },
                None => Outcome::Failed(format!("bad result {line}")),
            }
        }
        Some("refused") => Outcome::Refused {
            elapsed: Duration::from_micros(
                words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(u64::MAX),
            ),
        },
        Some("timeout") => Outcome::TimedOut,
        _ => Outcome::Failed(line.to_string()),
    }
}

/// The child's side when started by [`run`]; in the ordinary test run, a
/// check that every result line the child prints reads back as it was meant.
#[test]
fn client_process() {
    let Ok(job) = std::env::var(JOB_ENV) else {
        let peer: SocketAddr = "198.19.0.10:80".parse().unwrap();
        assert_eq!(
            parse("answered 198.19.0.10:80 pod a"),
            Outcome::Answered {
                identity: "pod a".into(),
                peer
            }
        );
        assert_eq!(
            parse("refused 30"),
            Outcome::Refused {
                elapsed: Duration::from_micros(30)
            }
        );
        assert_eq!(parse("timeout"), Outcome::TimedOut);
        assert!(matches!(parse("failed boom"), Outcome::Failed(_)));
        assert!(matches!(parse("answered nonsense"), Outcome::Failed(_)));
        return;
    };
    let parts: Vec<&str> = job.split('|').collect();
    let [cgroup, netns, op, dst] = parts[..] else {
        panic!("bad job {job}");
    };
    std::fs::write(
        Path::new(cgroup).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .expect("joining the test cgroup");
    let ns = std::fs::File::open(netns).expect("opening the namespace");
    // SAFETY: setns on this thread, which creates the sockets below.
    assert_eq!(
        unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
        0,
        "setns"
    );
    let dst: SocketAddr = dst.parse().expect("destination");
    if op == "Stream" {
        stream(dst);
    }
    let start = Instant::now();
    let result = match op {
        "Tcp" => tcp(dst),
        "Udp" => udp(dst),
        "UdpConnected" => udp_connected(dst),
        _ => panic!("bad op {op}"),
    };
    let line = match result {
        Ok((peer, identity)) => format!("answered {peer} {identity}"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("refused {}", start.elapsed().as_micros())
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            "timeout".to_string()
        }
        Err(e) => format!("failed {e}"),
    };
    println!("{RESULT}{line}");
}

fn tcp(dst: SocketAddr) -> std::io::Result<(SocketAddr, String)> {
    let mut conn = TcpStream::connect_timeout(&dst, TIMEOUT)?;
    let peer = conn.peer_addr()?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    let mut identity = String::new();
    conn.read_to_string(&mut identity)?;
    Ok((peer, identity))
}

/// The unspecified address of `dst`'s family, to bind a client to.
fn any_of(dst: SocketAddr) -> &'static str {
    if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }
}

fn udp(dst: SocketAddr) -> std::io::Result<(SocketAddr, String)> {
    let sock = UdpSocket::bind(any_of(dst))?;
    sock.set_read_timeout(Some(TIMEOUT))?;
    sock.send_to(b"who", dst)?;
    let mut buf = [0u8; 1500];
    let (n, from) = sock.recv_from(&mut buf)?;
    Ok((from, String::from_utf8_lossy(&buf[..n]).into_owned()))
}

fn udp_connected(dst: SocketAddr) -> std::io::Result<(SocketAddr, String)> {
    let sock = UdpSocket::bind(any_of(dst))?;
    sock.set_read_timeout(Some(TIMEOUT))?;
    sock.connect(dst)?;
    sock.send(b"who")?;
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf)?;
    Ok((
        sock.peer_addr()?,
        String::from_utf8_lossy(&buf[..n]).into_owned(),
    ))
}

/// [`UdpStream`]'s side: runs until killed.
fn stream(dst: SocketAddr) -> ! {
    use std::io::Write as _;
    loop {
        let failure = (|| -> std::io::Error {
            let sock = match UdpSocket::bind(any_of(dst)).and_then(|s| s.connect(dst).map(|()| s)) {
                Ok(sock) => sock,
                Err(e) => return e,
            };
            let _ = sock.set_read_timeout(Some(Duration::from_millis(300)));
            let mut buf = [0u8; 1500];
            loop {
                if let Err(e) = sock.send(b"who") {
                    return e;
                }
                match sock.recv(&mut buf) {
                    Ok(n) => println!("{RESULT}answer {}", String::from_utf8_lossy(&buf[..n])),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        println!("{RESULT}silence")
                    }
                    Err(e) => return e,
                }
                let _ = std::io::stdout().flush();
                std::thread::sleep(Duration::from_millis(50));
            }
        })();
        println!("{RESULT}failed {failure}");
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_millis(50));
    }
}
