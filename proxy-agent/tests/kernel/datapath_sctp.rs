//! SCTP in the real programs (BPF_PROG_TEST_RUN), in both families, on the
//! one-armed node of `datapath_frontends`: an association to a cluster IP
//! is translated both ways and tracked (INIT, INIT ACK, DATA, ABORT or the
//! SHUTDOWN exchange, and a new INIT on the same ports), a NodePort from outside is masqueraded
//! through XDP and through TC, and traffic without endpoints or to an
//! unused port of a cluster IP gets an ICMP port unreachable, as upstream
//! rejects SCTP. Every packet out is compared byte for byte with the one in
//! (only addresses, ports and checksums may differ) and its CRC32c checked
//! with the `crc32c` crate, not the datapath's own arithmetic. Needs root.

use proxy_agent::{
    cli::packet::{Frame, sctp_chunk},
    model::{DesiredService, Protocol},
    modes::ebpf::test_run::Hook::{FromNetdev, FromPod, Xdp},
};
use proxy_common::{
    Counter,
    action::{TC_ACT_OK, TC_ACT_REDIRECT, XDP_PASS, XDP_TX},
};

use crate::datapath_frontends::{
    IPV4, IPV6, Net, Scenario, TARGET, cluster_ip, endpoint, external, standard,
};
use crate::tester::{In, Out::*, counters, in_both_families, pkt, send};

in_both_families!(
    an_association_to_a_cluster_ip_is_translated_both_ways_and_tracked,
    a_node_port_from_outside_is_masqueraded_through_xdp_and_tc,
    no_endpoints_and_unused_ports_get_an_icmp_port_unreachable,
);

/// An INIT ACK chunk (initiate tag, a_rwnd, streams, initial TSN, and a
/// state cookie parameter), as a backend answers an INIT.
const INIT_ACK: &[u8] = &[
    2, 0, 0, 28, // INIT ACK, 28 bytes
    0x0b, 0xac, 0x0e, 0x0d, // initiate tag
    0, 1, 0, 0, // a_rwnd
    0, 10, 0, 10, // streams
    0, 0, 0, 1, // initial TSN
    0, 7, 0, 8, 0xc0, 0x0c, 0x1e, 0x00, // state cookie
];

/// A SHUTDOWN ACK chunk.
const SHUTDOWN_ACK: &[u8] = &[8, 0, 0, 4];

fn sctp_service(net: &Net) -> DesiredService {
    cluster_ip(
        "signal",
        Protocol::Sctp,
        net.cluster_ip,
        80,
        vec![endpoint(net.remote_backend, false)],
    )
}

fn an_association_to_a_cluster_ip_is_translated_both_ways_and_tracked(net: &Net) {
    let init = Frame::sctp(net.local_pod, 5000, net.cluster_ip, 80);
    let to_backend = Frame::sctp(net.local_pod, 5000, net.remote_backend, TARGET);
    let data = sctp_chunk::data(1, b"hello, association");
    let abort = sctp_chunk::chunk(sctp_chunk::ABORT, 0, &[]);
    let shutdown = sctp_chunk::chunk(sctp_chunk::SHUTDOWN, 0, &1u32.to_be_bytes());
    let complete = sctp_chunk::chunk(sctp_chunk::SHUTDOWN_COMPLETE, 0, &[]);
    Scenario {
        net,
        config: standard(net),
        services: vec![sctp_service(net)],
        steps: vec![
            send(
                FromPod,
                pkt(init, b""),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            // The backend's INIT ACK: the cluster IP and port restored (and
            // handed to the stack, which delivers to the pod).
            send(
                FromNetdev,
                In::Reply(INIT_ACK),
                TC_ACT_OK,
                [Forwarded(init.reply())],
            ),
            // DATA of the association: the same backend, by conntrack.
            send(
                FromPod,
                pkt(init, &data),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            counters([
                (Counter::NewFlow, 1),
                (Counter::ReplyNat, 1),
                (Counter::Established, 1),
            ]),
            // ABORT ends it; an INIT on the same ports opens a new one.
            send(
                FromPod,
                pkt(init, &abort),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            send(
                FromPod,
                pkt(init, b""),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            counters([(Counter::Reopened, 1), (Counter::NewFlow, 2)]),
            // A graceful end: SHUTDOWN, SHUTDOWN ACK, SHUTDOWN COMPLETE; then
            // an INIT on the same ports is a new association too.
            send(
                FromPod,
                pkt(init, &shutdown),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            send(
                FromNetdev,
                In::Reply(SHUTDOWN_ACK),
                TC_ACT_OK,
                [Forwarded(init.reply())],
            ),
            send(
                FromPod,
                pkt(init, &complete),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            send(
                FromPod,
                pkt(init, b""),
                TC_ACT_REDIRECT,
                [Forwarded(to_backend)],
            ),
            counters([(Counter::Reopened, 2), (Counter::NewFlow, 3)]),
        ],
    }
    .run();
}

fn a_node_port_from_outside_is_masqueraded_through_xdp_and_tc(net: &Net) {
    let svc = external(
        "signal",
        Protocol::Sctp,
        net.service(20),
        30090,
        vec![endpoint(net.remote_backend, false)],
    );
    Scenario {
        net,
        config: standard(net),
        services: vec![svc],
        steps: vec![
            send(
                Xdp,
                pkt(Frame::sctp(net.client, 5000, net.node, 30090), b""),
                XDP_TX,
                [
                    To(net.remote_backend, TARGET),
                    Src(net.node),
                    MasqueradePort,
                ],
            ),
            send(
                Xdp,
                In::Reply(INIT_ACK),
                XDP_TX,
                [Forwarded(Frame::sctp(net.node, 30090, net.client, 5000))],
            ),
            send(
                FromNetdev,
                pkt(Frame::sctp(net.client, 5001, net.node, 30090), b""),
                TC_ACT_REDIRECT,
                [
                    To(net.remote_backend, TARGET),
                    Src(net.node),
                    MasqueradePort,
                ],
            ),
            send(
                FromNetdev,
                In::Reply(INIT_ACK),
                TC_ACT_REDIRECT,
                [Forwarded(Frame::sctp(net.node, 30090, net.client, 5001))],
            ),
            counters([(Counter::Masqueraded, 2), (Counter::XdpTx, 2)]),
        ],
    }
    .run();
}

fn no_endpoints_and_unused_ports_get_an_icmp_port_unreachable(net: &Net) {
    let empty = external("empty", Protocol::Sctp, net.service(21), 30091, Vec::new());
    Scenario {
        net,
        config: standard(net),
        services: vec![empty, sctp_service(net)],
        steps: vec![
            send(
                FromPod,
                pkt(Frame::sctp(net.local_pod, 5000, net.service(21), 80), b""),
                TC_ACT_REDIRECT,
                [PortUnreachable],
            ),
            // The XDP program leaves rejects to TC.
            send(
                Xdp,
                pkt(Frame::sctp(net.client, 5000, net.node, 30091), b""),
                XDP_PASS,
                [],
            ),
            send(
                FromNetdev,
                pkt(Frame::sctp(net.client, 5000, net.node, 30091), b""),
                TC_ACT_REDIRECT,
                [PortUnreachable],
            ),
            // Another port of the cluster IP.
            send(
                FromPod,
                pkt(Frame::sctp(net.local_pod, 5000, net.cluster_ip, 81), b""),
                TC_ACT_REDIRECT,
                [PortUnreachable],
            ),
            // Not a service: passed untouched.
            send(
                FromPod,
                pkt(Frame::sctp(net.local_pod, 5000, net.remote_backend, 9), b""),
                TC_ACT_OK,
                [Unchanged],
            ),
            counters([
                (Counter::RejectNoEndpoints, 2),
                (Counter::RejectUnknownPort, 1),
            ]),
        ],
    }
    .run();
}
