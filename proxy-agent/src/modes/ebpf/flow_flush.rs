//! Deletes the UDP flows of backends that left their frontends, as upstream
//! deletes their conntrack entries after a sync.
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
use foldhash::{HashSet, HashSetExt as _};
use proxy_common::{
    BackendId, BackendOf, CtKeyOf, CtValueOf, Family, ServiceKeyOf, V4, V6, conntrack::CtDirection,
};
use tracing::{info, warn};

use crate::{metrics::ConntrackReconcilerMetrics, model::IpFamily};

/// A forward entry's frontend address, port and protocol, and its backend.
type ForwardHalf<F> = (<F as Family>::Addr, u16, u8, BackendId);
/// A reply entry's backend address, port and protocol, and the frontend
/// address and port it restores.
type ReplyHalf<F> = (<F as Family>::Addr, u16, u8, <F as Family>::Addr, u16);

/// The flows of backends that left their frontends.
#[derive(Debug)]
pub struct GoneFlows<F: Family> {
    /// Forward entries (client to frontend).
    forward: HashSet<ForwardHalf<F>>,
    /// Reply entries, keyed by the backend's replies.
    reply: HashSet<ReplyHalf<F>>,
    /// Their protocols: an entry of another is passed over unhashed.
    protos: Vec<u8>,
}

impl<F: Family> Default for GoneFlows<F> {
    fn default() -> Self {
        Self {
            forward: HashSet::new(),
            reply: HashSet::new(),
            protos: Vec::new(),
        }
    }
}

impl<F: Family> GoneFlows<F> {
    /// The flows of backend `id` (`backend`) through `frontend`.
    pub fn add(&mut self, frontend: &ServiceKeyOf<F>, id: BackendId, backend: &BackendOf<F>) {
        let fe = frontend;
        self.forward.insert((fe.addr_be, fe.port_be, fe.proto, id));
        self.reply.insert((
            backend.addr_be,
            backend.port_be,
            fe.proto,
            fe.addr_be,
            fe.port_be,
        ));
        if !self.protos.contains(&fe.proto) {
            self.protos.push(fe.proto);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }

    /// How many backends left a frontend.
    pub fn len(&self) -> usize {
        self.forward.len()
    }

    /// Takes in `other`'s flows too.
    pub fn absorb(&mut self, other: Self) {
        self.forward.extend(other.forward);
        self.reply.extend(other.reply);
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
        if value.direction() == CtDirection::Forward {
            self.forward
                .contains(&(key.daddr_be, key.dport_be, key.proto, value.backend_id))
        } else {
            self.reply.contains(&(
                key.saddr_be,
                key.sport_be,
                key.proto,
                value.nat_addr_be,
                value.nat_port_be,
            ))
        }
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
            backends_left = v4.len() + v6.len(),
            flushed_flows = flushed,
            took = ?started.elapsed(),
            "UDP flows of backends that left flushed"
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
                backends_left = gone.len(),
                "cannot flush the UDP flows of backends that left: they keep reaching the \
                 old backend until they idle out or the datapath balances them again (at \
                 most a second after the backend's entry is gone)"
            );
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use proxy_common::{
        Backend, CtKey, CtValue, ServiceKey, conntrack::flags, proto::TCP, proto::UDP,
    };

    use super::GoneFlows;

    const VIP: u32 = 0xc613_000a_u32.to_be(); // 198.19.0.10
    const GONE: u32 = 0xc612_0202_u32.to_be(); // 198.18.2.2
    const CLIENT: u32 = 0xc612_0102_u32.to_be(); // 198.18.1.2

    fn gone_from_dns(id: u32) -> GoneFlows<proxy_common::V4> {
        let mut gone = GoneFlows::default();
        let backend = Backend {
            addr_be: GONE,
            port_be: 5353u16.to_be(),
            proto: UDP,
            flags: 0,
        };
        gone.add(&ServiceKey::frontend(VIP, 53u16.to_be(), UDP), id, &backend);
        gone
    }

    fn forward(dport: u16, proto: u8, backend_id: u32) -> (CtKey, CtValue) {
        let key = CtKey::new(CLIENT, VIP, 40000u16.to_be(), dport.to_be(), proto);
        let value = CtValue {
            nat_addr_be: GONE,
            nat_port_be: 5353u16.to_be(),
            backend_id,
            ..Default::default()
        };
        (key, value)
    }

    fn reply(frontend_port: u16, proto: u8) -> (CtKey, CtValue) {
        let key = CtKey::new(GONE, CLIENT, 5353u16.to_be(), 40000u16.to_be(), proto);
        let value = CtValue {
            nat_addr_be: VIP,
            nat_port_be: frontend_port.to_be(),
            flags: flags::REPLY,
            ..Default::default()
        };
        (key, value)
    }

    #[test]
    fn both_halves_of_a_gone_backends_flows_through_its_frontend_match() {
        let gone = gone_from_dns(7);
        let (k, v) = forward(53, UDP, 7);
        assert!(gone.matches(&k, &v), "forward half");
        let (k, v) = reply(53, UDP);
        assert!(gone.matches(&k, &v), "reply half");
    }

    #[test]
    fn flows_of_another_backend_frontend_or_protocol_do_not_match() {
        let gone = gone_from_dns(7);
        for (what, (k, v)) in [
            ("another backend", forward(53, UDP, 8)),
            ("another frontend port", forward(54, UDP, 7)),
            ("another protocol", forward(53, TCP, 7)),
            ("a reply restoring another port", reply(54, UDP)),
            ("a reply of another protocol", reply(53, TCP)),
        ] {
            assert!(!gone.matches(&k, &v), "{what} matched");
        }
    }

    #[test]
    fn requests_taken_together_match_the_flows_of_each() {
        let mut gone = gone_from_dns(7);
        gone.absorb(gone_from_dns(8));
        assert_eq!(gone.len(), 2);
        for id in [7, 8] {
            let (k, v) = forward(53, UDP, id);
            assert!(gone.matches(&k, &v), "backend {id}");
        }
        assert!(GoneFlows::<proxy_common::V4>::default().is_empty());
    }
}
