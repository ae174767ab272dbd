//! The kernel's conntrack table, for the modes that NAT with it (nftables,
//! iptables): UDP flows never end on their own, so after each sync the
//! flows to a service that no longer lead to one of its endpoints are
//! deleted, as upstream's `conntrack.CleanStaleEntries` does — a flow to a
//! service address whose endpoint left, and a flow that was not translated
//! because the service had no endpoint when it began but has one now.
//! Through netlink (`netlink-packet-netfilter`, `super::nfnetlink`), as upstream.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::{IpAddr, SocketAddr},
};

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_netfilter::{
    NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple},
};

use crate::{
    metrics::ConntrackReconcilerMetrics,
    model::{DesiredState, IpFamily, Protocol as SvcProtocol},
};

/// One conntrack entry as the cleanup sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub proto: u8,
    /// The original direction: client to the address it asked for.
    pub orig_src: SocketAddr,
    pub orig_dst: SocketAddr,
    /// Where the reply comes from: the endpoint after DNAT (the original
    /// destination when nothing translated it).
    pub reply_src: SocketAddr,
}

/// The UDP flows of `desired`'s services that no longer reach a serving
/// endpoint, as upstream judges them: by the endpoint's address alone, a
/// port without serving endpoints left alone, and the policies, topology
/// and termination that choose among endpoints not taken into account (a
/// change to them does not break a flow, as it does not a TCP connection's).
pub fn stale_udp(desired: &DesiredState, flows: &[Flow]) -> Vec<Flow> {
    // Service address:port (cluster, external, LB) and node ports, each with
    // the endpoint addresses whose flows are kept.
    let mut by_addr: BTreeMap<SocketAddr, BTreeSet<IpAddr>> = BTreeMap::new();
    let mut by_node_port: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
    for svc in desired
        .services
        .values()
        .filter(|s| s.protocol == SvcProtocol::Udp)
    {
        let keepers = svc.udp_flow_keepers();
        if keepers.is_empty() {
            continue;
        }
        for ip in svc
            .cluster_ips
            .iter()
            .chain(&svc.external_ips)
            .chain(&svc.load_balancer_ips)
        {
            by_addr
                .entry(SocketAddr::new(*ip, svc.port))
                .or_default()
                .extend(keepers.iter().copied());
        }
        if let Some(np) = svc.node_port {
            by_node_port
                .entry(np)
                .or_default()
                .extend(keepers.iter().copied());
        }
    }
    flows
        .iter()
        .filter(|f| f.proto == proxy_common::proto::UDP)
        .filter(|f| {
            // A flow not translated (begun while the service had no
            // endpoint) has the service address as its reply source: never
            // a keeper.
            let stale = |keepers: &BTreeSet<IpAddr>| !keepers.contains(&f.reply_src.ip());
            by_addr.get(&f.orig_dst).is_some_and(stale)
                || by_node_port.get(&f.orig_dst.port()).is_some_and(stale)
        })
        .cloned()
        .collect()
}

/// Upstream's conntrack reconciler, run after each family's rules are
/// written: a failure is logged, not fatal.
#[derive(Clone, Debug)]
pub struct Reconciler {
    metrics: ConntrackReconcilerMetrics,
}

impl Default for Reconciler {
    fn default() -> Self {
        Self {
            metrics: ConntrackReconcilerMetrics::new(&IpFamily::BOTH),
        }
    }
}

impl Reconciler {
    /// Deletes `family`'s stale UDP flows, counted in the metrics.
    pub fn reconcile(&self, family: IpFamily, desired: &DesiredState) {
        let started = std::time::Instant::now();
        match clean_stale_udp(family, desired) {
            Ok(n) => {
                self.metrics.observe(family, started.elapsed(), n);
                if n > 0 {
                    tracing::info!(?family, flows = n, "deleted stale UDP conntrack entries");
                }
            }
            Err(e) => {
                self.metrics.observe(family, started.elapsed(), 0);
                tracing::warn!(?family, error = %e, "could not clean stale UDP conntrack entries");
            }
        }
    }

    /// The metrics, to be served.
    pub fn metrics(&self) -> ConntrackReconcilerMetrics {
        self.metrics.clone()
    }
}

/// Deletes the stale UDP flows of `desired`'s services in `family`;
/// returns how many.
pub fn clean_stale_udp(family: IpFamily, desired: &DesiredState) -> io::Result<usize> {
    let flows = dump(family)?;
    let stale = stale_udp(desired, &flows);
    for f in &stale {
        // Gone meanwhile is as good as deleted.
        match delete(family, f) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(stale.len())
}

fn nf_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// Sends `message` for `family` with `flags`; each conntrack answer to `each`.
fn exchange(
    flags: u16,
    family: IpFamily,
    message: ConntrackMessage,
    mut each: impl FnMut(ConntrackMessage),
) -> io::Result<()> {
    let request = super::nfnetlink::message(flags, nf_family(family), message.into());
    super::nfnetlink::exchange(&request, |inner| {
        if let NetfilterMessageInner::Conntrack(c) = inner {
            each(c);
        }
    })
}

/// Every conntrack entry of `family`.
pub fn dump(family: IpFamily) -> io::Result<Vec<Flow>> {
    let mut flows = Vec::new();
    exchange(
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        ConntrackMessage::Get(vec![]),
        |m| {
            if let ConntrackMessage::New(attrs) | ConntrackMessage::Get(attrs) = m
                && let Some(f) = flow_of(&attrs)
            {
                flows.push(f);
            }
        },
    )?;
    Ok(flows)
}

/// Deletes the entry whose original tuple is `flow`'s.
pub fn delete(family: IpFamily, flow: &Flow) -> io::Result<()> {
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(flow.orig_src.ip()),
            IPTuple::DestinationAddress(flow.orig_dst.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::from(flow.proto)),
            ProtoTuple::SourcePort(flow.orig_src.port()),
            ProtoTuple::DestinationPort(flow.orig_dst.port()),
        ]),
    ];
    exchange(
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]),
        |_| {},
    )
}

fn flow_of(attrs: &[ConntrackAttribute]) -> Option<Flow> {
    let mut orig = None;
    let mut reply = None;
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => orig = tuple_of(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = tuple_of(t),
            _ => {}
        }
    }
    let (proto, orig_src, orig_dst) = orig?;
    let (_, reply_src, _) = reply?;
    Some(Flow {
        proto,
        orig_src,
        orig_dst,
        reply_src,
    })
}

fn tuple_of(tuple: &[Tuple]) -> Option<(u8, SocketAddr, SocketAddr)> {
    let (mut src, mut dst): (Option<IpAddr>, Option<IpAddr>) = (None, None);
    let (mut proto, mut sport, mut dport) = (None, 0, 0);
    for t in tuple {
        match t {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(p) => proto = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(p) => sport = *p,
                        ProtoTuple::DestinationPort(p) => dport = *p,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        proto?,
        SocketAddr::new(src?, sport),
        SocketAddr::new(dst?, dport),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DesiredService, Endpoint, Protocol, ServicePortName};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn flow(dst: &str, reply_src: &str) -> Flow {
        Flow {
            proto: proxy_common::proto::UDP,
            orig_src: sa("198.18.1.2:40000"),
            orig_dst: sa(dst),
            reply_src: sa(reply_src),
        }
    }

    #[test]
    fn flows_to_gone_endpoints_and_untranslated_flows_are_stale() {
        let state = dns(
            vec![Endpoint::new("198.18.2.10".parse().unwrap(), 5353)],
            &[],
        );
        let live = flow("198.19.0.10:53", "198.18.2.10:5353");
        let gone = flow("198.19.0.10:53", "198.18.2.11:5353");
        let untranslated = flow("198.19.0.10:53", "198.19.0.10:53");
        let node_port_gone = flow("198.18.0.1:30053", "198.18.2.11:5353");
        let other = flow("198.18.9.9:53", "198.18.9.9:53");
        let stale = stale_udp(
            &state,
            &[
                live,
                gone.clone(),
                untranslated.clone(),
                node_port_gone.clone(),
                other,
            ],
        );
        assert_eq!(stale, vec![gone, untranslated, node_port_gone]);
    }

    fn dns(endpoints: Vec<Endpoint>, other_serving: &[&str]) -> DesiredState {
        let svc = DesiredService {
            node_port: Some(30053),
            other_serving_ips: other_serving.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..DesiredService::cluster_ip(
                ServicePortName {
                    namespace: "ns".into(),
                    name: "dns".into(),
                    port_name: "dns".into(),
                    protocol: Protocol::Udp,
                },
                vec!["198.19.0.10".parse().unwrap()],
                53,
                endpoints,
            )
        };
        DesiredState {
            services: [(svc.name.clone(), svc)].into(),
            ..DesiredState::default()
        }
    }

    #[test]
    fn flows_to_serving_endpoints_outside_the_balanced_sets_are_kept() {
        // A terminating endpoint passed over while others are ready, or
        // another zone's: still serving, so its flows go on.
        let state = dns(
            vec![Endpoint::new("198.18.2.10".parse().unwrap(), 5353)],
            &["198.18.2.11"],
        );
        let terminating = flow("198.19.0.10:53", "198.18.2.11:5353");
        let by_node_port = flow("198.18.0.1:30053", "198.18.2.11:5353");
        // Judged by address, as upstream: another target port is the same endpoint.
        let other_port = flow("198.19.0.10:53", "198.18.2.10:5354");
        let gone = flow("198.19.0.10:53", "198.18.2.12:5353");
        let stale = stale_udp(
            &state,
            &[terminating, by_node_port, other_port, gone.clone()],
        );
        assert_eq!(stale, vec![gone]);
    }

    #[test]
    fn a_port_without_serving_endpoints_keeps_its_flows() {
        let state = dns(vec![], &[]);
        let flows = [
            flow("198.19.0.10:53", "198.18.2.11:5353"),
            flow("198.19.0.10:53", "198.19.0.10:53"),
            flow("198.18.0.1:30053", "198.18.2.11:5353"),
        ];
        assert_eq!(stale_udp(&state, &flows), vec![]);
    }
}
