//! Deletes the UDP flows to endpoints that no longer serve their service,
//! as upstream's stale-flow cleanup deletes their conntrack entries after a
//! sync. An endpoint that serves but is no longer balanced to (terminating
//! while others are ready, another zone's) keeps its flows, as a TCP
//! connection keeps going (see `flow.rs`).
//!
//! Finding them means reading the whole conntrack table: about 9 ms for the
//! 28,000 entries of an end-to-end run (a cold cache line or two each), in
//! a table of at least 131,072 by default. So the agent does it on a
//! thread of its own ([`Flusher`]): a sync hands over what left and goes on,
//! and the syncs that come while a walk runs are not held up by it. Requests
//! that arrive during a walk are served together by the next one.

use std::{
    io,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::mpsc,
    time::Instant,
};

use aya::Pod;
use foldhash::{HashMap, HashMapExt as _, HashSet};
use proxy_common::{CtKeyOf, CtValueOf, Family, ServiceKeyOf, V4, V6, conntrack::CtDirection};
use tracing::{info, warn};

use crate::{metrics::ConntrackReconcilerMetrics, model::IpFamily};

/// A frontend as its flows' entries name it: address, port, protocol.
type FrontendOf<F> = (<F as Family>::Addr, u16, u8);

/// Which UDP flows of some frontends go: those whose backend's address is
/// not one the frontend keeps (its port's serving endpoints', as upstream's
/// stale-flow cleanup judges them; none, for a frontend that is gone), and
/// that began before the judgement: requests wait for a walk, and a flow
/// the datapath opened since (to a frontend added back, an address that
/// serves again) follows maps newer than the rule.
#[derive(Debug)]
pub struct GoneFlows<F: Family> {
    /// Per frontend: when it was judged (the datapath's coarse clock, as
    /// entries' `created_ns`) and the addresses it keeps.
    keep: HashMap<FrontendOf<F>, (u64, HashSet<F::Addr>)>,
    /// Their protocols: an entry of another is passed over unhashed.
    protos: Vec<u8>,
}

impl<F: Family> Default for GoneFlows<F> {
    fn default() -> Self {
        Self {
            keep: HashMap::new(),
            protos: Vec::new(),
        }
    }
}

impl<F: Family> GoneFlows<F> {
    /// The flows through `frontend` that began by `judged_ns` (coarse
    /// monotonic) to any address but `kept` go.
    pub fn keep_only(
        &mut self,
        frontend: &ServiceKeyOf<F>,
        judged_ns: u64,
        kept: impl IntoIterator<Item = F::Addr>,
    ) {
        let fe = frontend;
        self.keep.insert(
            (fe.addr_be, fe.port_be, fe.proto),
            (judged_ns, kept.into_iter().collect()),
        );
        if !self.protos.contains(&fe.proto) {
            self.protos.push(fe.proto);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// How many frontends' flows are judged.
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// Takes in `other`'s frontends too; for one in both, `other`'s (the
    /// later) addresses hold.
    pub fn absorb(&mut self, other: Self) {
        self.keep.extend(other.keep);
        for proto in other.protos {
            if !self.protos.contains(&proto) {
                self.protos.push(proto);
            }
        }
    }

    /// Whether the entry `key`, `value` is one half of such a flow.
    pub fn matches(&self, key: &CtKeyOf<F>, value: &CtValueOf<F>) -> bool {
        if !self.protos.contains(&key.proto) {
            return false;
        }
        // The frontend and the backend's address: from the key and the
        // translation of a forward half, the other way round for a reply.
        let (frontend, backend) = if value.direction() == CtDirection::Forward {
            ((key.daddr_be, key.dport_be, key.proto), value.nat_addr_be)
        } else {
            (
                (value.nat_addr_be, value.nat_port_be, key.proto),
                key.saddr_be,
            )
        };
        self.keep.get(&frontend).is_some_and(|(judged_ns, kept)| {
            value.created_ns <= *judged_ns && !kept.contains(&backend)
        })
    }
}

/// Deletes the entries of the conntrack table `fd` that `matches`, a batch
/// at a time: each taken out (lookup-and-delete, one step) and judged again
/// on the value it had, so an entry the datapath opened anew under the same
/// key since the walk read it (a flow to a live backend) goes back. How
/// many were deleted.
pub fn flush_table<F: Family>(
    fd: BorrowedFd<'_>,
    matches: &dyn Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool,
) -> io::Result<usize>
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let mut doomed: Vec<CtKeyOf<F>> = Vec::new();
    let mut deleted = 0;
    let mut failed = None;
    super::sys::walk_typed_batches::<CtKeyOf<F>, CtValueOf<F>>(fd, |entries| {
        doomed.extend(entries.filter(|(k, v)| matches(k, v)).map(|(k, _)| k));
        for key in doomed.drain(..) {
            if failed.is_some() {
                break;
            }
            match delete_if_still::<F>(fd, &key, matches) {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(e) => failed = Some(e),
            }
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(deleted),
    }
}

/// Takes `key` out of `fd` and puts it back unless it still `matches`.
fn delete_if_still<F: Family>(
    fd: BorrowedFd<'_>,
    key: &CtKeyOf<F>,
    matches: &dyn Fn(&CtKeyOf<F>, &CtValueOf<F>) -> bool,
) -> io::Result<bool>
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    let taken = super::collector::take_if::<F, _>(fd, key, |v| matches(key, v).then_some(()))?;
    Ok(taken.is_some())
}

/// The model's name of family `F`.
pub fn ip_family<F: Family>() -> IpFamily {
    if F::AF == V4::AF {
        IpFamily::V4
    } else {
        IpFamily::V6
    }
}

/// A request to the [`Flusher`]: one family's gone flows.
#[derive(Debug)]
pub enum Request {
    V4(GoneFlows<V4>),
    V6(GoneFlows<V6>),
}

/// The thread that deletes gone flows, fed by the syncs.
#[derive(Debug)]
pub struct Flusher {
    requests: mpsc::Sender<Request>,
    metrics: ConntrackReconcilerMetrics,
}

impl Flusher {
    /// Starts the thread on the two conntrack tables (IPv4, IPv6). It ends
    /// when the `Flusher` is dropped, once it has served what it was given.
    /// Each walk is observed in `metrics` (upstream's reconciler metrics).
    pub fn spawn(
        conntrack: OwnedFd,
        conntrack6: OwnedFd,
        metrics: ConntrackReconcilerMetrics,
    ) -> io::Result<Self> {
        let (requests, received) = mpsc::channel();
        let observed = metrics.clone();
        std::thread::Builder::new()
            .name("flow-flusher".into())
            .spawn(move || serve(&received, (&conntrack, &conntrack6), &observed))?;
        Ok(Self { requests, metrics })
    }

    pub fn metrics(&self) -> &ConntrackReconcilerMetrics {
        &self.metrics
    }

    /// Hands `request` to the thread; back when the thread is gone.
    pub fn queue(&self, request: Request) -> Result<(), Request> {
        self.requests.send(request).map_err(|e| e.0)
    }
}

fn serve(
    received: &mpsc::Receiver<Request>,
    (conntrack, conntrack6): (&OwnedFd, &OwnedFd),
    metrics: &ConntrackReconcilerMetrics,
) {
    while let Ok(first) = received.recv() {
        let (mut v4, mut v6) = (GoneFlows::<V4>::default(), GoneFlows::<V6>::default());
        for request in std::iter::once(first).chain(received.try_iter()) {
            match request {
                Request::V4(gone) => v4.absorb(gone),
                Request::V6(gone) => v6.absorb(gone),
            }
        }
        let started = Instant::now();
        let flushed = flush_family(conntrack.as_fd(), &v4, metrics)
            + flush_family(conntrack6.as_fd(), &v6, metrics);
        info!(
            frontends = v4.len() + v6.len(),
            flushed_flows = flushed,
            took = ?started.elapsed(),
            "UDP flows to endpoints that no longer serve flushed"
        );
    }
}

fn flush_family<F: Family>(
    fd: BorrowedFd<'_>,
    gone: &GoneFlows<F>,
    metrics: &ConntrackReconcilerMetrics,
) -> usize
where
    CtKeyOf<F>: Pod,
    CtValueOf<F>: Pod,
{
    if gone.is_empty() {
        return 0;
    }
    let family = ip_family::<F>();
    let table = match family {
        IpFamily::V4 => proxy_common::maps::CONNTRACK,
        IpFamily::V6 => proxy_common::maps::CONNTRACK6,
    };
    let started = Instant::now();
    let flushed = flush_table::<F>(fd, &|k, v| gone.matches(k, v));
    metrics.observe(family, started.elapsed(), *flushed.as_ref().unwrap_or(&0));
    match flushed {
        Ok(n) => n,
        Err(e) => {
            warn!(
                error = %e,
                table,
                frontends = gone.len(),
                "cannot flush the UDP flows to endpoints that no longer serve: they keep \
                 reaching them until they idle out"
            );
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use proxy_common::{CtKey, CtValue, ServiceKey, conntrack::flags, proto::TCP, proto::UDP};

    use super::GoneFlows;

    const VIP: u32 = 0xc613_000a_u32.to_be(); // 198.19.0.10
    const GONE: u32 = 0xc612_0202_u32.to_be(); // 198.18.2.2
    const SERVING: u32 = 0xc612_0203_u32.to_be(); // 198.18.2.3
    const CLIENT: u32 = 0xc612_0102_u32.to_be(); // 198.18.1.2
    /// When the test's rules were made; its entries began before.
    const JUDGED: u64 = 1_000;

    fn dns_keeps(kept: &[u32]) -> GoneFlows<proxy_common::V4> {
        let mut gone = GoneFlows::default();
        let frontend = ServiceKey::frontend(VIP, 53u16.to_be(), UDP);
        gone.keep_only(&frontend, JUDGED, kept.iter().copied());
        gone
    }

    fn forward(dport: u16, proto: u8, backend: u32) -> (CtKey, CtValue) {
        let key = CtKey::new(CLIENT, VIP, 40000u16.to_be(), dport.to_be(), proto);
        let value = CtValue {
            nat_addr_be: backend,
            nat_port_be: 5353u16.to_be(),
            ..Default::default()
        };
        (key, value)
    }

    fn reply(frontend_port: u16, proto: u8, backend: u32) -> (CtKey, CtValue) {
        let key = CtKey::new(backend, CLIENT, 5353u16.to_be(), 40000u16.to_be(), proto);
        let value = CtValue {
            nat_addr_be: VIP,
            nat_port_be: frontend_port.to_be(),
            flags: flags::REPLY,
            ..Default::default()
        };
        (key, value)
    }

    #[test]
    fn both_halves_of_a_flow_to_an_address_not_kept_match() {
        let gone = dns_keeps(&[SERVING]);
        let (k, v) = forward(53, UDP, GONE);
        assert!(gone.matches(&k, &v), "forward half");
        let (k, v) = reply(53, UDP, GONE);
        assert!(gone.matches(&k, &v), "reply half");
        let gone = dns_keeps(&[]);
        let (k, v) = forward(53, UDP, SERVING);
        assert!(gone.matches(&k, &v), "a frontend that keeps none");
    }

    #[test]
    fn flows_to_a_kept_address_or_through_another_frontend_or_protocol_do_not_match() {
        let gone = dns_keeps(&[SERVING]);
        for (what, (k, v)) in [
            ("a kept address", forward(53, UDP, SERVING)),
            ("a kept address's reply", reply(53, UDP, SERVING)),
            ("another frontend port", forward(54, UDP, GONE)),
            ("another protocol", forward(53, TCP, GONE)),
            ("a reply restoring another port", reply(54, UDP, GONE)),
            ("a reply of another protocol", reply(53, TCP, GONE)),
        ] {
            assert!(!gone.matches(&k, &v), "{what} matched");
        }
    }

    #[test]
    fn a_flow_begun_after_the_judgement_is_not_judged() {
        // Its frontend went and came back, or its address serves again,
        // before the walk: the datapath opened it from the newer maps.
        let gone = dns_keeps(&[]);
        let (k, mut v) = forward(53, UDP, GONE);
        v.created_ns = JUDGED + 1;
        assert!(!gone.matches(&k, &v));
        v.created_ns = JUDGED;
        assert!(gone.matches(&k, &v));
    }

    #[test]
    fn requests_taken_together_judge_each_frontend_by_the_latest() {
        let mut gone = dns_keeps(&[GONE]);
        gone.absorb(dns_keeps(&[SERVING]));
        assert_eq!(gone.len(), 1);
        let (k, v) = forward(53, UDP, GONE);
        assert!(gone.matches(&k, &v), "no longer kept");
        let (k, v) = forward(53, UDP, SERVING);
        assert!(!gone.matches(&k, &v), "kept now");
        assert!(GoneFlows::<proxy_common::V4>::default().is_empty());
    }
}
