//! What a [`Trace`] means: forwarded (where to, masqueraded or not),
//! dropped (why), rejected (how), or passed through untouched.

use std::net::SocketAddr;

use proxy_common::{Counter, proto};

use super::{
    probe::{Origin, Probe},
    trace::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, Trace, XDP_ABORTED, XDP_DROP, XDP_TX},
};
use crate::cli::packet::{Frame, Layout};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// A new flow balanced to an endpoint.
    New,
    /// A packet of a flow the conntrack table already knows.
    Established,
    /// A reply of a known flow, translated back.
    Reply,
}

impl Flow {
    pub fn name(self) -> &'static str {
        match self {
            Flow::New => "new",
            Flow::Established => "established",
            Flow::Reply => "reply",
        }
    }
}

/// How a forwarded packet leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// XDP_TX: straight back out of the arrival interface.
    XdpTx,
    /// bpf_fib_lookup + redirect to the next hop.
    FibRedirect,
    /// Handed to the kernel's routing (local destination, no route, TTL 1).
    Kernel,
    /// The socket hook pointed the connection at the endpoint itself.
    Socket,
}

impl Exit {
    pub fn name(self) -> &'static str {
        match self {
            Exit::XdpTx => "xdp_tx",
            Exit::FibRedirect => "fib_redirect",
            Exit::Kernel => "kernel",
            Exit::Socket => "socket",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Exit::XdpTx => "sent back out of the arrival interface by XDP",
            Exit::FibRedirect => "redirected to the FIB's next hop",
            Exit::Kernel => "handed to the kernel's routing",
            Exit::Socket => "connected there by the socket hook: no per-packet NAT",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    TcpReset,
    IcmpPortUnreachable,
    /// The socket hook failed the connect or send itself.
    ConnectionRefused,
}

impl Reply {
    pub fn name(self) -> &'static str {
        match self {
            Reply::TcpReset => "tcp_reset",
            Reply::IcmpPortUnreachable => "icmp_port_unreachable",
            Reply::ConnectionRefused => "connection_refused",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Reply::TcpReset => "a TCP RST",
            Reply::IcmpPortUnreachable => "an ICMP port unreachable",
            Reply::ConnectionRefused => "connect() or send() failing with ECONNREFUSED",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Forwarded {
        flow: Flow,
        /// Where the packet goes: the endpoint (or, for a reply, the client).
        to: SocketAddr,
        /// The source it leaves with.
        from: SocketAddr,
        /// The flow's source is translated (to the node's address).
        masqueraded: bool,
        exit: Exit,
    },
    Dropped {
        reason: Option<Counter>,
    },
    Rejected {
        reply: Reply,
        reason: Option<Counter>,
    },
    /// Not service traffic: left alone.
    Passed,
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Forwarded { .. } => "forwarded",
            Verdict::Dropped { .. } => "dropped",
            Verdict::Rejected { .. } => "rejected",
            Verdict::Passed => "passed",
        }
    }
}

const REJECTS: [Counter; 2] = [Counter::RejectNoEndpoints, Counter::RejectUnknownPort];

pub fn classify(probe: &Probe, trace: &Trace) -> Verdict {
    if probe.origin == Origin::Host {
        return classify_host(probe, trace);
    }
    let Some(last) = trace.steps.last() else {
        return Verdict::Passed;
    };
    let dropped = if last.xdp {
        matches!(last.code, XDP_DROP | XDP_ABORTED)
    } else {
        last.code == TC_ACT_SHOT
    };
    if dropped {
        return Verdict::Dropped {
            reason: drop_reason(trace),
        };
    }
    let rejected = REJECTS.into_iter().find(|c| trace.moved(*c) > 0);
    if !last.xdp
        && last.code == TC_ACT_REDIRECT
        && let Some(reason) = rejected
    {
        let icmp = Layout::of(&trace.output)
            .is_some_and(|l| matches!(l.proto, proto::ICMP | proto::ICMPV6));
        return Verdict::Rejected {
            reply: if icmp {
                Reply::IcmpPortUnreachable
            } else {
                Reply::TcpReset
            },
            reason: Some(reason),
        };
    }
    let flow = if trace.moved(Counter::NewFlow) > 0 {
        Flow::New
    } else if trace.moved(Counter::ReplyNat) > 0 {
        Flow::Reply
    } else if trace.moved(Counter::Established) > 0 {
        Flow::Established
    } else {
        return Verdict::Passed;
    };
    let exit = match (last.xdp, last.code) {
        (true, XDP_TX) => Exit::XdpTx,
        (false, TC_ACT_REDIRECT) => Exit::FibRedirect,
        (false, TC_ACT_OK) => Exit::Kernel,
        _ => Exit::Kernel,
    };
    let input = probe.frame();
    let out = Frame::parse(&trace.output).unwrap_or(input);
    let masqueraded = match flow {
        Flow::Reply => out.dst != input.dst,
        Flow::New | Flow::Established => out.src != input.src,
    };
    Verdict::Forwarded {
        flow,
        to: SocketAddr::new(out.dst, out.dport),
        from: SocketAddr::new(out.src, out.sport),
        masqueraded,
        exit,
    }
}

/// The socket hook either pointed the connection at an endpoint, refused
/// it, or left it alone (no service: nothing to translate).
fn classify_host(probe: &Probe, trace: &Trace) -> Verdict {
    if trace.moved(Counter::SockRefused) > 0 {
        let unallocated = trace.moved(Counter::DropUnallocated) > 0;
        return Verdict::Rejected {
            reply: Reply::ConnectionRefused,
            reason: Some(if unallocated {
                Counter::DropUnallocated
            } else {
                Counter::SockRefused
            }),
        };
    }
    if trace.moved(Counter::SockTranslated) == 0 {
        return Verdict::Passed;
    }
    let input = probe.frame();
    let out = Frame::parse(&trace.output).unwrap_or(input);
    Verdict::Forwarded {
        flow: Flow::New,
        to: SocketAddr::new(out.dst, out.dport),
        from: SocketAddr::new(input.src, input.sport),
        masqueraded: false,
        exit: Exit::Socket,
    }
}

/// The first drop counter that moved; else a reject counter (a reset is
/// never answered, so a reject of one is a drop).
fn drop_reason(trace: &Trace) -> Option<Counter> {
    trace
        .counters
        .iter()
        .map(|(c, _)| *c)
        .find(|c| c.name().starts_with("drop_"))
        .or_else(|| REJECTS.into_iter().find(|c| trace.moved(*c) > 0))
}

/// What a drop or reject counter means, for people.
pub fn describe(reason: Counter) -> &'static str {
    match reason {
        Counter::DropNoLocalEndpoints => {
            "the traffic policy is Local and this node has no ready endpoint of the service"
        }
        Counter::DropSourceRange => "the source is outside the service's loadBalancerSourceRanges",
        Counter::DropBackendMissing => {
            "a backend slot or backend is missing (the agent is in the middle of an update)"
        }
        Counter::DropMalformed => "truncated or malformed headers",
        Counter::DropRewriteFailed => "rewriting the packet failed",
        Counter::DropConntrackFull => "the conntrack table refused the new flow",
        Counter::DropSnatExhausted => "no free masquerade source port",
        Counter::DropRejectFailed => "a reject could not be built",
        Counter::DropUnallocated => {
            "the address is inside a service CIDR but no service holds it (an unallocated cluster IP)"
        }
        Counter::RejectNoEndpoints => "the service has no endpoints",
        Counter::RejectUnknownPort => "the cluster IP serves no service on this port",
        Counter::SockRefused => {
            "no endpoint may serve the node's own connection (the service has none, or none on \
             this node under a Local traffic policy, or the source ranges leave out the node), \
             or the cluster IP serves no service on this port"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::cli::explain::{
        probe::{Origin, Proto},
        trace::{Step, XDP_PASS},
    };
    use crate::cli::packet::ETH_HLEN;

    fn probe() -> Probe {
        Probe {
            proto: Proto::Tcp,
            src: Ipv4Addr::new(192, 0, 2, 100).into(),
            sport: 40000,
            dst: Ipv4Addr::new(192, 0, 2, 1).into(),
            dport: 30080,
            origin: Origin::Outside,
        }
    }

    fn trace(steps: &[(bool, i32)], output: Vec<u8>, counters: &[Counter]) -> Trace {
        Trace {
            steps: steps
                .iter()
                .map(|(xdp, code)| Step {
                    program: "p",
                    xdp: *xdp,
                    code: *code,
                })
                .collect(),
            output,
            counters: counters.iter().map(|c| (*c, 1)).collect(),
        }
    }

    #[test]
    fn xdp_tx_of_a_new_masqueraded_flow() {
        let out = Frame::tcp(
            Ipv4Addr::new(192, 0, 2, 1),
            61000,
            Ipv4Addr::new(10, 0, 0, 5),
            8080,
        )
        .build(b"");
        let v = classify(
            &probe(),
            &trace(
                &[(true, XDP_TX)],
                out,
                &[Counter::NewFlow, Counter::Masqueraded],
            ),
        );
        assert_eq!(
            v,
            Verdict::Forwarded {
                flow: Flow::New,
                to: "10.0.0.5:8080".parse().unwrap(),
                from: "192.0.2.1:61000".parse().unwrap(),
                masqueraded: true,
                exit: Exit::XdpTx,
            }
        );
    }

    #[test]
    fn drops_name_their_reason_and_untouched_packets_pass() {
        let p = probe();
        let v = classify(
            &p,
            &trace(
                &[(true, XDP_DROP)],
                vec![],
                &[Counter::DropNoLocalEndpoints],
            ),
        );
        assert_eq!(
            v,
            Verdict::Dropped {
                reason: Some(Counter::DropNoLocalEndpoints)
            }
        );
        let v = classify(
            &p,
            &trace(
                &[(true, XDP_PASS), (false, TC_ACT_OK)],
                p.bytes(),
                &[Counter::Packets],
            ),
        );
        assert_eq!(v, Verdict::Passed);
    }

    #[test]
    fn rejects_tell_rst_from_icmp() {
        let p = probe();
        let rst = Frame::tcp(p.dst, p.dport, p.src, p.sport).build(b"");
        let v = classify(
            &p,
            &trace(
                &[(false, TC_ACT_REDIRECT)],
                rst,
                &[Counter::RejectNoEndpoints],
            ),
        );
        assert_eq!(
            v,
            Verdict::Rejected {
                reply: Reply::TcpReset,
                reason: Some(Counter::RejectNoEndpoints)
            }
        );
        let mut icmp = vec![0u8; 70];
        icmp[12..14].copy_from_slice(&[0x08, 0x00]);
        icmp[ETH_HLEN] = 0x45;
        icmp[ETH_HLEN + 9] = proto::ICMP;
        let v = classify(
            &p,
            &trace(
                &[(false, TC_ACT_REDIRECT)],
                icmp,
                &[Counter::RejectUnknownPort],
            ),
        );
        assert!(matches!(
            v,
            Verdict::Rejected {
                reply: Reply::IcmpPortUnreachable,
                ..
            }
        ));
    }
}
