//! A table-driven tester for the real programs, after Katran's BPF tester and
//! Cilium's PKTGEN/SETUP/CHECK: a scenario is data, the node and services the
//! agent's programmer puts in the maps (setup), then rows of a packet in, the
//! program it meets (hook), the verdict it must get and the checks the packet
//! out must pass, with the datapath counters in between. [`Datapath::play`]
//! runs the rows in order through BPF_PROG_TEST_RUN.

use std::{fmt, net::IpAddr, time::Duration};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use proxy_agent::{
    cli::packet::{
        self, ETH_HLEN, Frame, IPV4_HLEN, IPV6_HLEN, Layout, checksums_valid, tcp_flags,
    },
    model::{DesiredService, DesiredState},
    modes::ebpf::{
        KernelMaps, Programmer, SyncStats,
        test_run::{self, Hook},
    },
};
use proxy_common::Counter;

/// A loaded object, its maps, and where the packets of each hook arrive.
pub struct Datapath {
    pub ebpf: Ebpf,
    pub maps: KernelMaps,
    pub stats: PerCpuArray<MapData, u64>,
    pub programmer: Programmer,
    /// The interface `tc_from_pod` runs see (0: none, the kernel's loopback).
    pod_ifindex: u32,
    /// The external interface `tc_from_netdev` and XDP runs see.
    ext_ifindex: u32,
}

impl Datapath {
    pub fn new(mut ebpf: Ebpf, pod_ifindex: u32, ext_ifindex: u32) -> Self {
        let (maps, stats) = KernelMaps::take(&mut ebpf).unwrap();
        Self {
            ebpf,
            maps,
            stats,
            programmer: Programmer::new(),
            pod_ifindex,
            ext_ifindex,
        }
    }

    /// Programs exactly `services`, as a sync of the agent would.
    /// Programs exactly `services`; what the sync did.
    pub fn program(&mut self, services: Vec<DesiredService>) -> SyncStats {
        let state = DesiredState {
            services: services.into_iter().map(|s| (s.name.clone(), s)).collect(),
            ..DesiredState::default()
        };
        self.programmer
            .sync(&state, &mut self.maps)
            .expect("programming the maps")
    }

    pub fn run(&self, hook: Hook, pkt: &[u8]) -> test_run::Outcome {
        self.run_gso(hook, pkt, 0)
    }

    /// [`Self::run`], `pkt` a GSO packet of `gso_size` bytes per segment.
    pub fn run_gso(&self, hook: Hook, pkt: &[u8], gso_size: u32) -> test_run::Outcome {
        let ifindex = match hook {
            Hook::FromPod | Hook::FromHost => self.pod_ifindex,
            Hook::FromNetdev | Hook::Xdp => self.ext_ifindex,
        };
        test_run::run_gso(&self.ebpf, hook, pkt, ifindex, 1, gso_size).expect("BPF_PROG_TEST_RUN")
    }

    pub fn counter(&self, c: Counter) -> u64 {
        self.stats.get(&(c as u32), 0).unwrap().iter().sum()
    }

    /// Runs `steps` in order; panics at the first that fails, naming it.
    pub fn play(&mut self, steps: impl IntoIterator<Item = Step>) {
        let mut last_out: Option<Vec<u8>> = None;
        let mut last_in: Option<Vec<u8>> = None;
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Send {
                    hook,
                    packet,
                    verdict,
                    out,
                } => {
                    let (input, gso_size) = match packet {
                        In::Bytes(bytes) => (bytes, 0),
                        In::Gso(bytes, gso_size) => (bytes, gso_size),
                        In::Reply(payload) => {
                            let last = last_out
                                .as_deref()
                                .unwrap_or_else(|| panic!("step {i}: no packet to reply to"));
                            let reply = Frame::parse(last)
                                .unwrap_or_else(|| panic!("step {i}: no frame to reply to"))
                                .reply()
                                .build(payload);
                            (reply, 0)
                        }
                        In::Again => {
                            let last = last_in
                                .clone()
                                .unwrap_or_else(|| panic!("step {i}: no packet to send again"));
                            (last, 0)
                        }
                    };
                    let what = format!("step {i}: {hook:?} <- {}", Shown(&input));
                    let got = self.run_gso(hook, &input, gso_size);
                    assert_eq!(got.verdict, verdict, "{what}: verdict");
                    for check in &out {
                        check.assert(&input, &got.packet, &what);
                    }
                    last_out = Some(got.packet);
                    last_in = Some(input);
                }
                Step::Counters(want) => {
                    let got: Vec<(Counter, u64)> =
                        want.iter().map(|(c, _)| (*c, self.counter(*c))).collect();
                    assert_eq!(got, want, "step {i}: counters");
                }
                Step::Wait(d) => std::thread::sleep(d),
                Step::Setup(change) => change(self),
            }
        }
    }
}

/// One row of a scenario.
pub enum Step {
    /// `packet` through the program of `hook`, which must return `verdict`
    /// and leave a packet that passes every check of `out`.
    Send {
        hook: Hook,
        packet: In,
        verdict: i32,
        out: Vec<Out>,
    },
    /// The named counters, summed over CPUs, since the datapath was loaded.
    Counters(Vec<(Counter, u64)>),
    /// Time passes (conntrack entries age).
    Wait(Duration),
    /// A change to the node or the maps between two packets.
    Setup(fn(&mut Datapath)),
}

/// A [`Step::Send`] row.
pub fn send(hook: Hook, packet: In, verdict: i32, out: impl Into<Vec<Out>>) -> Step {
    Step::Send {
        hook,
        packet,
        verdict,
        out: out.into(),
    }
}

/// A [`Step::Counters`] row.
pub fn counters(want: impl Into<Vec<(Counter, u64)>>) -> Step {
    Step::Counters(want.into())
}

/// The packet of a [`Step::Send`].
pub enum In {
    Bytes(Vec<u8>),
    /// The answer of whoever received the last packet out: its frame
    /// reversed, with this payload.
    Reply(&'static [u8]),
    /// The last packet in, again (to show another hook what one passed).
    Again,
    /// A GSO packet (a local socket's, TC only) of this many payload bytes
    /// per segment.
    Gso(Vec<u8>, u32),
}

/// `frame` with `payload`, as [`Frame::build`] makes it (TCP: a SYN).
pub fn pkt(frame: Frame, payload: &[u8]) -> In {
    In::Bytes(frame.build(payload))
}

/// A TCP SYN without payload.
pub fn syn(src: impl Into<IpAddr>, sport: u16, dst: impl Into<IpAddr>, dport: u16) -> In {
    pkt(Frame::tcp(src, sport, dst, dport), b"")
}

/// `frame` (a TCP SYN, no payload) arriving with TTL (hop limit) `ttl`.
pub fn with_ttl(frame: Frame, ttl: u8) -> In {
    let mut p = frame.build(b"");
    packet::set_ttl(&mut p, ttl);
    In::Bytes(p)
}

/// `frame` as a TCP segment with only RST set.
pub fn rst(frame: Frame) -> In {
    In::Bytes(tcp_segment(frame, tcp_flags::RST))
}

/// A check on the packet a program left.
#[derive(Debug)]
pub enum Out {
    // The frame, which must parse and have valid checksums:
    /// Exactly these addresses, ports and protocol.
    Is(Frame),
    Src(IpAddr),
    Dst(IpAddr),
    SrcPort(u16),
    /// This destination address and port.
    To(IpAddr, u16),
    /// A source port from the masquerade range.
    MasqueradePort,

    // The bytes:
    /// The packet is the input, untouched.
    Unchanged,
    /// The input with only addresses, ports and checksums rewritten, to
    /// exactly this frame, and the checksums verify.
    Rewritten(Frame),
    /// [`Out::Rewritten`], forwarded by this node: the Ethernet addresses
    /// and the TTL (hop limit) may differ too.
    Forwarded(Frame),
    /// [`Out::Rewritten`] to the input's frame with the destination one of
    /// these addresses, at this port.
    DnatToOneOf(Vec<IpAddr>, u16),
    EthDst([u8; 6]),
    EthSrc([u8; 6]),
    /// The TTL (IPv4) or hop limit (IPv6).
    Ttl(u8),
    /// The destination address field, whatever the packet carries.
    IpDst(IpAddr),
    /// This TCP flag is set.
    TcpFlag(u8),
    /// A UDP checksum of 0 (none) stays 0, and the headers verify.
    NoUdpChecksum,
    /// The TCP RST answering the input SYN, byte for byte.
    Rst,
    /// The ICMP port unreachable answering the input UDP datagram.
    PortUnreachable,
}

const MASQUERADE_PORTS: std::ops::RangeInclusive<u16> = 61000..=65535;

impl Out {
    fn assert(&self, input: &[u8], out: &[u8], what: &str) {
        let what = format!("{what}: {self:?}");
        let parsed = || {
            assert!(checksums_valid(out), "{what}: checksums must verify");
            Frame::parse(out).unwrap_or_else(|| panic!("{what}: no frame out"))
        };
        match self {
            Out::Is(want) => assert_eq!(parsed(), *want, "{what}"),
            Out::Src(want) => assert_eq!(parsed().src, *want, "{what}"),
            Out::Dst(want) => assert_eq!(parsed().dst, *want, "{what}"),
            Out::SrcPort(want) => assert_eq!(parsed().sport, *want, "{what}"),
            Out::To(ip, port) => {
                let f = parsed();
                assert_eq!((f.dst, f.dport), (*ip, *port), "{what}");
            }
            Out::MasqueradePort => {
                let port = parsed().sport;
                assert!(MASQUERADE_PORTS.contains(&port), "{what}: port {port}");
            }
            Out::Unchanged => assert_eq!(out, input, "{what}"),
            Out::Rewritten(want) => assert_rewritten(input, out, *want, &what, false),
            Out::Forwarded(want) => assert_rewritten(input, out, *want, &what, true),
            Out::DnatToOneOf(backends, port) => {
                let backend = Frame::parse(out)
                    .unwrap_or_else(|| panic!("{what}: no frame out"))
                    .dst;
                assert!(
                    backends.contains(&backend),
                    "{what}: {backend} is not a backend"
                );
                let req = Frame::parse(input).expect("a frame in");
                let want = Frame {
                    dst: backend,
                    dport: *port,
                    ..req
                };
                assert_rewritten(input, out, want, &what, false);
            }
            Out::EthDst(mac) => assert_eq!(&out[0..6], mac, "{what}"),
            Out::EthSrc(mac) => assert_eq!(&out[6..12], mac, "{what}"),
            Out::Ttl(ttl) => assert_eq!(out[layout(out).ttl()], *ttl, "{what}"),
            Out::IpDst(ip) => {
                let got = Frame::parse(out).map(|f| f.dst);
                assert_eq!(got, Some(*ip), "{what}");
            }
            Out::TcpFlag(flag) => assert_eq!(out[layout(out).l4 + 13] & flag, *flag, "{what}"),
            Out::NoUdpChecksum => {
                let off = packet::l4_checksum_offset(input);
                assert_eq!(
                    out[off..off + 2],
                    [0, 0],
                    "{what}: UDP checksum 0 means none and must stay 0"
                );
                assert!(checksums_valid(out), "{what}");
            }
            Out::Rst => assert_eq!(out, expected_rst(input), "{what}"),
            Out::PortUnreachable => assert_port_unreachable(input, out, &what),
        }
    }
}

fn layout(pkt: &[u8]) -> Layout {
    Layout::of(pkt).expect("an IP frame")
}

/// Asserts `out` equals `input` except for the rewritten addresses, ports
/// and checksums (and, `forwarded`, the Ethernet addresses and the TTL),
/// and that the checksums verify.
fn assert_rewritten(input: &[u8], out: &[u8], expect: Frame, what: &str, forwarded: bool) {
    assert_eq!(out.len(), input.len(), "{what}");
    assert_eq!(Frame::parse(out), Some(expect), "{what}");
    assert!(
        checksums_valid(out),
        "{what}: checksums must verify after rewrite"
    );
    let mut normalized = out.to_vec();
    let mut want = input.to_vec();
    // Blank the fields the datapath may change, then everything else must be equal.
    for buf in [&mut normalized, &mut want] {
        let layout = layout(buf);
        // IPv4: header checksum and addresses; IPv6: addresses.
        let addresses = if layout.ipv6 {
            ETH_HLEN + 8..ETH_HLEN + 40
        } else {
            ETH_HLEN + 10..ETH_HLEN + 20
        };
        let csum = layout.l4_checksum();
        // SCTP's CRC32c takes 4 bytes.
        let csum_len = if layout.proto == proxy_common::proto::SCTP {
            4
        } else {
            2
        };
        for range in [addresses, layout.l4..layout.l4 + 4, csum..csum + csum_len] {
            buf[range].fill(0);
        }
        if forwarded {
            buf[0..12].fill(0);
            buf[layout.ttl()] = 0;
        }
    }
    assert_eq!(
        normalized, want,
        "{what}: bytes outside addresses, ports and checksums changed"
    );
}

/// The RST the datapath must answer `syn` with, byte for byte.
fn expected_rst(syn: &[u8]) -> Vec<u8> {
    let req = Frame::parse(syn).expect("a frame in");
    let mut want = Frame::tcp(req.dst, req.dport, req.src, req.sport).build(b"");
    want[0..6].copy_from_slice(&syn[6..12]);
    want[6..12].copy_from_slice(&syn[0..6]);
    let ip = ETH_HLEN;
    let tcp = layout(&want).l4;
    if !req.is_ipv6() {
        want[ip + 1] = 0;
        want[ip + 4..ip + 6].fill(0); // id
    }
    want[tcp + 4..tcp + 8].fill(0); // seq
    want[tcp + 8..tcp + 12].copy_from_slice(&2u32.to_be_bytes()); // SYN seq 1 + 1
    want[tcp + 13] = tcp_flags::RST | tcp_flags::ACK;
    want[tcp + 14..tcp + 16].fill(0); // window
    packet::fix_checksums(&mut want);
    want
}

/// ICMP type 3 code 3 (RFC 792) or ICMPv6 type 1 code 4 (RFC 4443), from
/// the address asked for, quoting the IP header and 8 bytes of the datagram.
fn assert_port_unreachable(udp: &[u8], icmp: &[u8], what: &str) {
    let req = Frame::parse(udp).expect("a frame in");
    let (ip_len, proto, type_code) = if req.is_ipv6() {
        (IPV6_HLEN, proxy_common::proto::ICMPV6, [1, 4])
    } else {
        (IPV4_HLEN, proxy_common::proto::ICMP, [3, 3])
    };
    let quoted = ip_len + 8;
    assert_eq!(icmp.len(), ETH_HLEN + ip_len + 8 + quoted, "{what}");
    assert_eq!(&icmp[0..6], &udp[6..12], "{what}");
    assert_eq!(&icmp[6..12], &udp[0..6], "{what}");
    let l = layout(icmp);
    assert_eq!((l.ipv6, l.proto), (req.is_ipv6(), proto), "{what}");
    let out = Frame::parse(icmp).expect("an IP frame out");
    assert_eq!((out.src, out.dst), (req.dst, req.src), "{what}");
    assert!(checksums_valid(icmp), "{what}: IP and ICMP checksums");
    assert_eq!(
        &icmp[l.l4..l.l4 + 2],
        &type_code,
        "{what}: port unreachable"
    );
    assert_eq!(
        &icmp[l.l4 + 8..],
        &udp[ETH_HLEN..ETH_HLEN + quoted],
        "{what}: quotes the original header and 8 bytes"
    );
}

/// A packet in a failure message: its frame, or its length.
struct Shown<'a>(&'a [u8]);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Frame::parse(self.0) {
            Some(fr) => write!(
                f,
                "proto {} {}:{} -> {}:{} ({} bytes)",
                fr.proto,
                fr.src,
                fr.sport,
                fr.dst,
                fr.dport,
                self.0.len()
            ),
            None => write!(f, "{} bytes", self.0.len()),
        }
    }
}

/// Runs `ip ARGS` in this thread's network namespace.
pub fn ip(args: &str) {
    let status = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .unwrap();
    assert!(status.success(), "ip {args}");
}

/// The ifindex in this thread's namespace (/sys/class/net shows the mounter's).
pub fn ifindex(name: &str) -> u32 {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: a valid NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {name:?}");
    index
}

pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// One ClusterIP service, `web`, on `vip`:80/TCP with `backends`:`port`.
pub fn web_service<A: Into<IpAddr> + Copy>(vip: A, backends: &[A], port: u16) -> DesiredState {
    use proxy_agent::model::{Endpoint, Protocol, ServicePortName};
    let name = ServicePortName {
        namespace: "default".into(),
        name: "web".into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
    };
    let eps = backends
        .iter()
        .map(|ip| Endpoint::new((*ip).into(), port))
        .collect();
    DesiredState {
        services: [(
            name.clone(),
            DesiredService::cluster_ip(name, vec![vip.into()], 80, eps),
        )]
        .into_iter()
        .collect(),
        ..DesiredState::default()
    }
}

/// CLOCK_MONOTONIC_COARSE, the clock of the datapath's conntrack and
/// collector times (`bpf_ktime_get_coarse_ns`).
pub use proxy_agent::clock::coarse_monotonic_ns as coarse_now_ns;

/// `frame` as a TCP segment carrying exactly `flags`, with valid checksums.
pub fn tcp_segment(frame: Frame, flags: u8) -> Vec<u8> {
    tcp_data(frame, flags, b"")
}

/// [`tcp_segment`] with `payload`.
pub fn tcp_data(frame: Frame, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut pkt = frame.build(payload);
    let l4 = layout(&pkt).l4;
    pkt[l4 + 13] = flags;
    packet::fix_checksums(&mut pkt);
    pkt
}

/// `mod name { #[test] fn ipv4(), #[test] fn ipv6() }` for each scenario
/// `fn name(net: &Net)` of the calling module, run with its `IPV4` and
/// `IPV6` address plans: one scenario, written once, in both families.
macro_rules! in_both_families {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn ipv4() {
                    super::$name(&super::IPV4)
                }
                #[test]
                fn ipv6() {
                    super::$name(&super::IPV6)
                }
            }
        )*
    };
}
pub(crate) use in_both_families;

/// Pins the calling thread to the CPU it runs on.
pub fn stay_on_this_cpu() {
    // SAFETY: plain syscalls on this thread's own affinity mask.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        let done = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        assert_eq!(
            done,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}
