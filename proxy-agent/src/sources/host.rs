//! The host source: this node's interfaces, their addresses and the default
//! route, as seen from the agent's network namespace, read over rtnetlink.
//! [`HostSource::run`] listens to the kernel's link, address and route
//! notifications and publishes a new snapshot whenever something changed,
//! both as a [`SourceEvent`] for the sync engine and on a watch channel for a
//! mode's own consumers (the ebpf mode keeps its programs attached from it).
//!
//! A burst of notifications (hundreds of pods starting at once) becomes one
//! update a few milliseconds after its first notification, not one each. The
//! links are kept from their notifications (each carries the whole link);
//! the addresses and routes, far smaller, are dumped again at each update,
//! since the kernel removes some routes without telling (the IPv4 routes of
//! a link that goes down). The links are dumped again at the start, after
//! the socket overflowed, and every [`RESYNC`].

use std::{
    collections::BTreeMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::Stream;
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkExtentMask, LinkMessage},
    route::{RouteAttribute, RouteHeader, RouteMessage, RouteType},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::watch,
    time::MissedTickBehavior,
};
use tracing::{debug, info, warn};

use super::SourceEvent;

/// How long after a first notification the host is updated: whatever else
/// arrives meanwhile is part of the same update.
const COALESCE: Duration = Duration::from_millis(5);
/// The safety net: the host is read whole this often even without notifications.
const RESYNC: Duration = Duration::from_secs(30);
/// How often the host is read when notifications cannot be subscribed to.
const FALLBACK_POLL: Duration = Duration::from_secs(1);
/// How often a dump the kernel flags as interrupted by a change is retried.
const DUMP_ATTEMPTS: usize = 5;
/// The receive buffer asked for the notification socket.
const NOTIFICATION_BUFFER: usize = 8 << 20;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostInterface {
    pub name: String,
    pub index: u32,
    /// The device this one is enslaved to (a bridge port's bridge).
    pub master: Option<String>,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub interfaces: Vec<HostInterface>,
    /// The interface of the IPv4 default route with the lowest metric.
    pub default_route_interface: Option<String>,
}

impl HostNetwork {
    /// Dumps the links, addresses and IPv4 routes of the calling thread's
    /// network namespace over rtnetlink.
    pub fn read() -> io::Result<Self> {
        let mut rtnl = Rtnl::open()?;
        let links = rtnl.links()?;
        rtnl.with_addresses_and_routes(&links)
    }

    /// The snapshot of `links` with their addresses (in the kernel's order)
    /// and the default route.
    fn assemble(links: &Links, addresses: &[AddressMessage], routes: &[RouteMessage]) -> Self {
        let mut interfaces: BTreeMap<u32, HostInterface> = links
            .iter()
            .map(|(&index, link)| {
                let iface = HostInterface {
                    name: link.name.clone(),
                    index,
                    master: link.master.and_then(|m| Some(links.get(&m)?.name.clone())),
                    ..HostInterface::default()
                };
                (index, iface)
            })
            .collect();
        for address in addresses {
            // An address of a link this snapshot does not know yet waits for
            // the next update, which that link's notification brings.
            let Some(iface) = interfaces.get_mut(&address.header.index) else {
                continue;
            };
            // As getifaddrs(3): IFA_LOCAL is the address, IFA_ADDRESS then
            // being a point-to-point peer.
            let (mut local, mut addr) = (None, None);
            for attribute in &address.attributes {
                match attribute {
                    AddressAttribute::Local(a) => local = Some(*a),
                    AddressAttribute::Address(a) => addr = Some(*a),
                    _ => {}
                }
            }
            match local.or(addr) {
                Some(IpAddr::V4(a)) => iface.ipv4.push(a),
                Some(IpAddr::V6(a)) => iface.ipv6.push(a),
                None => {}
            }
        }
        HostNetwork {
            default_route_interface: default_route_ifindex(routes)
                .and_then(|index| Some(links.get(&index)?.name.clone())),
            interfaces: interfaces.into_values().collect(),
        }
    }
}

/// The output interface of the lowest-metric IPv4 default route of the main
/// table (its first next hop if it has several); the lowest index on a tie.
fn default_route_ifindex(routes: &[RouteMessage]) -> Option<u32> {
    routes
        .iter()
        .filter_map(|route| {
            let header = &route.header;
            if header.address_family != AddressFamily::Inet
                || header.destination_prefix_length != 0
                || header.kind != RouteType::Unicast
            {
                return None;
            }
            let (mut table, mut metric, mut oif) = (u32::from(header.table), 0, None);
            for attribute in &route.attributes {
                match attribute {
                    RouteAttribute::Table(t) => table = *t,
                    RouteAttribute::Priority(p) => metric = *p,
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::MultiPath(hops) => {
                        oif = oif.or(hops.first().map(|hop| hop.interface_index));
                    }
                    _ => {}
                }
            }
            (table == u32::from(RouteHeader::RT_TABLE_MAIN)).then_some((metric, oif?))
        })
        .min()
        .map(|(_, oif)| oif)
}

/// What a snapshot needs of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    name: String,
    /// The master's index.
    master: Option<u32>,
}

/// The links by index.
type Links = BTreeMap<u32, Link>;

/// A link notification: the whole link as it is now, or its removal.
#[derive(Debug, PartialEq, Eq)]
enum LinkChange {
    Set(u32, Link),
    Removed(u32),
}

impl LinkChange {
    /// The change a link message describes; `None` for the bridge's
    /// per-port messages (AF_BRIDGE: a port leaving its bridge is an
    /// RTM_DELLINK of that family) and for other messages.
    fn of(message: &RouteNetlinkMessage) -> Option<Self> {
        match message {
            RouteNetlinkMessage::NewLink(m)
                if m.header.interface_family == AddressFamily::Unspec =>
            {
                let (mut name, mut master) = (None, None);
                for attribute in &m.attributes {
                    match attribute {
                        LinkAttribute::IfName(n) => name = Some(n.clone()),
                        LinkAttribute::Controller(i) => master = Some(*i),
                        _ => {}
                    }
                }
                Some(LinkChange::Set(
                    m.header.index,
                    Link {
                        name: name?,
                        master,
                    },
                ))
            }
            RouteNetlinkMessage::DelLink(m)
                if m.header.interface_family == AddressFamily::Unspec =>
            {
                Some(LinkChange::Removed(m.header.index))
            }
            _ => None,
        }
    }

    fn apply(self, links: &mut Links) {
        match self {
            LinkChange::Set(index, link) => {
                links.insert(index, link);
            }
            LinkChange::Removed(index) => {
                links.remove(&index);
            }
        }
    }
}

/// A NETLINK_ROUTE socket for dumps. It belongs to the network namespace of
/// the thread that opened it, whichever thread uses it later.
struct Rtnl {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnl {
            socket,
            sequence: 0,
            buf: vec![0; 64 << 10],
        })
    }

    fn links(&mut self) -> io::Result<Links> {
        let request = || {
            let mut get = LinkMessage::default();
            get.attributes
                .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
            RouteNetlinkMessage::GetLink(get)
        };
        let links = self
            .dump(request)?
            .iter()
            .filter_map(LinkChange::of)
            .filter_map(|change| match change {
                LinkChange::Set(index, link) => Some((index, link)),
                LinkChange::Removed(_) => None,
            })
            .collect();
        Ok(links)
    }

    /// The snapshot of `links` with the addresses and IPv4 routes dumped now.
    fn with_addresses_and_routes(&mut self, links: &Links) -> io::Result<HostNetwork> {
        let get_routes = || {
            let mut get = RouteMessage::default();
            get.header.address_family = AddressFamily::Inet;
            RouteNetlinkMessage::GetRoute(get)
        };
        let (mut addresses, mut routes) = (Vec::new(), Vec::new());
        let answers = self
            .dump(|| RouteNetlinkMessage::GetAddress(AddressMessage::default()))?
            .into_iter()
            .chain(self.dump(get_routes)?);
        for answer in answers {
            match answer {
                RouteNetlinkMessage::NewAddress(m) => addresses.push(m),
                RouteNetlinkMessage::NewRoute(m) => routes.push(m),
                _ => {}
            }
        }
        Ok(HostNetwork::assemble(links, &addresses, &routes))
    }

    /// The answers to a dump `request`, dumped again while the kernel flags
    /// the dump as interrupted by a change (then kept as they are).
    fn dump(
        &mut self,
        request: impl Fn() -> RouteNetlinkMessage,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        let mut attempt = 1;
        loop {
            let (messages, interrupted) = self.dump_once(request())?;
            if !interrupted || attempt == DUMP_ATTEMPTS {
                return Ok(messages);
            }
            attempt += 1;
        }
    }

    /// The answers to one dump, and whether it was interrupted.
    fn dump_once(
        &mut self,
        request: RouteNetlinkMessage,
    ) -> io::Result<(Vec<RouteNetlinkMessage>, bool)> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut message = NetlinkMessage::from(request);
        message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        message.header.sequence_number = self.sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        let (mut messages, mut interrupted) = (Vec::new(), false);
        let mut unparsed: Option<(usize, String)> = None;
        loop {
            let len = receive(&self.socket, &mut self.buf)?;
            for frame in frames(&self.buf[..len]) {
                // Answers to an earlier request that failed half-way.
                if frame.sequence_number != self.sequence {
                    continue;
                }
                interrupted |= frame.flags & NLM_F_DUMP_INTR != 0;
                match frame.parse() {
                    Ok(NetlinkPayload::Done(_)) => {
                        if let Some((count, error)) = unparsed {
                            warn!(count, %error, "skipped rtnetlink answers that could not be parsed");
                        }
                        return Ok((messages, interrupted));
                    }
                    Ok(NetlinkPayload::Error(e)) => return Err(e.to_io()),
                    Ok(NetlinkPayload::InnerMessage(m)) => messages.push(m),
                    Ok(_) => {}
                    Err(e) => {
                        let count = unparsed.map_or(0, |(count, _)| count);
                        unparsed = Some((count + 1, e.to_string()));
                    }
                }
            }
        }
    }
}

/// One netlink message of a datagram, its payload not parsed yet.
struct Frame<'a> {
    message_type: u16,
    flags: u16,
    sequence_number: u32,
    bytes: &'a [u8],
}

impl Frame<'_> {
    fn parse(
        &self,
    ) -> Result<NetlinkPayload<RouteNetlinkMessage>, netlink_packet_core::DecodeError> {
        NetlinkMessage::<RouteNetlinkMessage>::deserialize(self.bytes).map(|m| m.payload)
    }
}

/// The messages of a datagram, up to the first malformed one.
fn frames(mut datagram: &[u8]) -> impl Iterator<Item = Frame<'_>> {
    std::iter::from_fn(move || {
        let buffer = NetlinkBuffer::new_checked(datagram).ok()?;
        let len = buffer.length() as usize;
        let (message_type, flags, sequence_number) = (
            buffer.message_type(),
            buffer.flags(),
            buffer.sequence_number(),
        );
        let (bytes, rest) = datagram.split_at(len);
        datagram = rest
            .get(len.next_multiple_of(4) - len..)
            .unwrap_or_default();
        Some(Frame {
            message_type,
            flags,
            sequence_number,
            bytes,
        })
    })
}

/// A socket subscribed to the kernel's link, IPv4/IPv6 address and IPv4/IPv6
/// route notifications. Link notifications are kept; the others only say
/// that the addresses or routes must be dumped again.
struct Notifications {
    fd: AsyncFd<Socket>,
    buf: Vec<u8>,
}

/// What one wait for notifications brought.
#[derive(Debug, Default)]
struct Batch {
    notifications: u64,
    links: Vec<LinkChange>,
    /// The socket overflowed (ENOBUFS: notifications were dropped) or
    /// failed, or a link notification could not be parsed: the links must
    /// be dumped again.
    lost: Option<io::Error>,
}

impl Batch {
    /// Takes the notifications of one datagram.
    fn add(&mut self, datagram: &[u8]) {
        for frame in frames(datagram) {
            self.notifications += 1;
            let message_type = frame.message_type;
            if message_type != libc::RTM_NEWLINK && message_type != libc::RTM_DELLINK {
                continue;
            }
            match frame.parse() {
                Ok(NetlinkPayload::InnerMessage(m)) => self.links.extend(LinkChange::of(&m)),
                Ok(_) => {}
                Err(e) => {
                    let e = format!("unreadable link notification: {e}");
                    self.lost = Some(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
        }
    }
}

impl Notifications {
    fn subscribe() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        set_receive_buffer(&socket, NOTIFICATION_BUFFER);
        for group in [
            libc::RTNLGRP_LINK,
            libc::RTNLGRP_IPV4_IFADDR,
            libc::RTNLGRP_IPV6_IFADDR,
            libc::RTNLGRP_IPV4_ROUTE,
            libc::RTNLGRP_IPV6_ROUTE,
        ] {
            socket.add_membership(group)?;
        }
        socket.set_non_blocking(true)?;
        // SAFETY: the socket owns its descriptor, which stays open and the
        // same until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }?;
        Ok(Notifications {
            fd,
            buf: vec![0; 64 << 10],
        })
    }

    /// Waits for a notification, then [`COALESCE`] for more, and takes
    /// everything that arrived.
    async fn next_batch(&mut self) -> Batch {
        let mut batch = Batch::default();
        loop {
            let mut ready = match self.fd.readable().await {
                Ok(ready) => ready,
                Err(e) => {
                    batch.lost = Some(e);
                    return batch;
                }
            };
            let buf = &mut self.buf;
            match ready.try_io(|fd| receive(fd.get_ref(), buf)) {
                Ok(Ok(len)) => {
                    batch.add(&self.buf[..len]);
                    break;
                }
                Ok(Err(e)) => {
                    batch.lost = Some(e);
                    break;
                }
                Err(_would_block) => continue,
            }
        }
        tokio::time::sleep(COALESCE).await;
        loop {
            let buf = &mut self.buf;
            match self.fd.try_io(Interest::READABLE, |fd| receive(fd, buf)) {
                Ok(len) => batch.add(&self.buf[..len]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return batch,
                // After an overflow the socket carries on: keep draining.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => batch.lost = Some(e),
                Err(e) => {
                    batch.lost = Some(e);
                    return batch;
                }
            }
        }
    }
}

/// One whole datagram into `buf`, grown first if the datagram needs it.
fn receive(socket: &Socket, buf: &mut Vec<u8>) -> io::Result<usize> {
    let len = socket.recv(&mut &mut buf[..], libc::MSG_PEEK | libc::MSG_TRUNC)?;
    if len > buf.len() {
        buf.resize(len, 0);
    }
    socket.recv(&mut &mut buf[..], 0)
}

/// Asks for a receive buffer of `bytes`: beyond net.core.rmem_max when the
/// agent may (CAP_NET_ADMIN), else as much as that limit allows.
fn set_receive_buffer(socket: &Socket, bytes: usize) {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: a valid socket and a c_int option value of the size given.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw const value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

/// The dump socket and the links as the notifications left them.
struct Reader {
    rtnl: Rtnl,
    /// `None`: dump them at the next read.
    links: Option<Links>,
}

impl Reader {
    /// The snapshot after `changes` (superseded, and dropped, when the links
    /// are dumped: they arrived before the dump).
    fn read(&mut self, changes: Vec<LinkChange>) -> io::Result<HostNetwork> {
        let links = match &mut self.links {
            Some(links) => {
                for change in changes {
                    change.apply(links);
                }
                links
            }
            None => self.links.insert(self.rtnl.links()?),
        };
        self.rtnl.with_addresses_and_routes(links)
    }
}

/// What woke [`HostSource::run`] up.
enum Wake {
    Notified(Batch),
    Resync,
}

/// Publishes the host's network; [`HostSource::run`] keeps it current.
pub struct HostSource {
    tx: watch::Sender<Arc<HostNetwork>>,
    /// Notifications received and snapshots published, for the logs.
    notifications: AtomicU64,
    published: AtomicU64,
}

impl HostSource {
    /// Reads the host once, so the first snapshot is there before anything starts.
    pub fn new() -> io::Result<Self> {
        let (tx, _) = watch::channel(Arc::new(HostNetwork::read()?));
        Ok(HostSource {
            tx,
            notifications: AtomicU64::new(0),
            published: AtomicU64::new(0),
        })
    }

    pub fn current(&self) -> Arc<HostNetwork> {
        self.tx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<HostNetwork>> {
        self.tx.subscribe()
    }

    /// The current snapshot, then one event per change.
    pub fn events(&self) -> impl Stream<Item = SourceEvent> + Send + use<> {
        let mut rx = self.tx.subscribe();
        rx.mark_changed();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            let host = rx.borrow_and_update().clone();
            Some((SourceEvent::HostChanged(host), rx))
        })
    }

    /// Subscribes to the kernel's notifications in the network namespace of
    /// the thread that first polls it, and updates the host after each
    /// batch of them (and reads it whole every [`RESYNC`]); never returns.
    pub async fn run(&self) {
        let mut reader = None;
        let mut notifications = match Notifications::subscribe() {
            Ok(n) => Some(n),
            Err(e) => {
                warn!(
                    error = %e,
                    "cannot subscribe to the kernel's link, address and route notifications; \
                     reading the node's interfaces every {FALLBACK_POLL:?} instead"
                );
                None
            }
        };
        let period = if notifications.is_some() {
            RESYNC
        } else {
            FALLBACK_POLL
        };
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // What changed between `new` and the subscription.
        self.refresh(&mut reader, Vec::new()).await;
        loop {
            let wake = match notifications.as_mut() {
                Some(n) => tokio::select! {
                    batch = n.next_batch() => Wake::Notified(batch),
                    _ = resync.tick() => Wake::Resync,
                },
                None => {
                    resync.tick().await;
                    Wake::Resync
                }
            };
            let changes = match wake {
                Wake::Notified(batch) => {
                    self.notifications
                        .fetch_add(batch.notifications, Ordering::Relaxed);
                    if let Some(e) = batch.lost {
                        warn!(
                            error = %e,
                            "lost rtnetlink notifications; reading the node's interfaces whole"
                        );
                        forget_links(&mut reader);
                        if e.raw_os_error() != Some(libc::ENOBUFS) {
                            // Not an overflow: do not spin on a broken socket.
                            tokio::time::sleep(FALLBACK_POLL).await;
                        }
                    }
                    batch.links
                }
                Wake::Resync => {
                    forget_links(&mut reader);
                    Vec::new()
                }
            };
            self.refresh(&mut reader, changes).await;
        }
    }

    /// Reads the host on a blocking thread (with the socket opened on this
    /// one, so in this namespace) and publishes the snapshot if it changed.
    async fn refresh(&self, reader: &mut Option<Reader>, changes: Vec<LinkChange>) {
        let taken = match reader.take() {
            Some(taken) => taken,
            None => match Rtnl::open() {
                Ok(rtnl) => Reader { rtnl, links: None },
                Err(e) => {
                    warn!(error = %e, "opening an rtnetlink socket");
                    return;
                }
            },
        };
        let (taken, read) = match tokio::task::spawn_blocking(move || {
            let mut taken = taken;
            let read = taken.read(changes);
            (taken, read)
        })
        .await
        {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return, // the runtime is shutting down
        };
        match read {
            Ok(host) => {
                *reader = Some(taken);
                self.publish(host);
            }
            // Socket and links are read anew next time.
            Err(e) => warn!(error = %e, "reading the node's interfaces"),
        }
    }

    fn publish(&self, host: HostNetwork) {
        let changed = self.tx.send_if_modified(|current| {
            if **current == host {
                return false;
            }
            *current = Arc::new(host);
            true
        });
        if changed {
            let published = self.published.fetch_add(1, Ordering::Relaxed) + 1;
            info!(
                interfaces = self.tx.borrow().interfaces.len(),
                "the host's interfaces or addresses changed"
            );
            debug!(
                published,
                notifications = self.notifications.load(Ordering::Relaxed),
                "host snapshots published since the start"
            );
        }
    }
}

/// The links are dumped again at the next read.
fn forget_links(reader: &mut Option<Reader>) {
    if let Some(reader) = reader {
        reader.links = None;
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        process::Command,
        time::{Duration, Instant},
    };

    use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL};
    use netlink_packet_route::{
        link::{InfoData, InfoKind, InfoVeth, LinkInfo},
        route::RouteNextHop,
    };

    use super::*;

    fn route(table: u8, dst_len: u8, metric: Option<u32>, oif: u32) -> RouteMessage {
        let mut route = RouteMessage::default();
        route.header.address_family = AddressFamily::Inet;
        route.header.table = table;
        route.header.destination_prefix_length = dst_len;
        route.header.kind = RouteType::Unicast;
        route.attributes.push(RouteAttribute::Oif(oif));
        route
            .attributes
            .extend(metric.map(RouteAttribute::Priority));
        route
    }

    #[test]
    fn default_route_is_the_lowest_metric() {
        const MAIN: u8 = RouteHeader::RT_TABLE_MAIN;
        let mut routes = vec![
            route(MAIN, 0, Some(200), 3),
            route(MAIN, 0, Some(100), 2),
            // Not default routes, or not of the main table: never chosen.
            route(MAIN, 24, None, 7),
            route(100, 0, Some(1), 8),
        ];
        let mut in_table_attribute = route(RouteHeader::RT_TABLE_UNSPEC, 0, Some(5), 9);
        in_table_attribute
            .attributes
            .push(RouteAttribute::Table(1000));
        routes.push(in_table_attribute);
        let mut unreachable = route(MAIN, 0, Some(0), 10);
        unreachable.header.kind = RouteType::Unreachable;
        routes.push(unreachable);
        assert_eq!(default_route_ifindex(&routes), Some(2));

        // No RTA_PRIORITY is metric 0; a multipath route goes by its first hop.
        let mut multipath = route(MAIN, 0, None, 0);
        multipath.attributes.clear();
        let hop = |index| {
            let mut hop = RouteNextHop::default();
            hop.interface_index = index;
            hop
        };
        multipath
            .attributes
            .push(RouteAttribute::MultiPath(vec![hop(5), hop(6)]));
        routes.push(multipath);
        assert_eq!(default_route_ifindex(&routes), Some(5));

        let mut main_by_attribute = route(RouteHeader::RT_TABLE_UNSPEC, 0, None, 4);
        main_by_attribute
            .attributes
            .push(RouteAttribute::Table(u32::from(MAIN)));
        routes.push(main_by_attribute);
        assert_eq!(default_route_ifindex(&routes), Some(4), "tie: lowest index");

        assert_eq!(default_route_ifindex(&routes[2..4]), None);
        assert_eq!(default_route_ifindex(&[]), None);
    }

    fn link_message(index: u32, name: &str, master: Option<u32>) -> LinkMessage {
        let mut link = LinkMessage::default();
        link.header.index = index;
        link.attributes.push(LinkAttribute::IfName(name.into()));
        link.attributes
            .extend(master.map(LinkAttribute::Controller));
        link
    }

    #[test]
    fn assembly_resolves_masters_and_prefers_the_local_address() {
        let links: Links = [
            link_message(3, "br0", None),
            link_message(2, "veth0", Some(3)),
            link_message(4, "ghost", Some(99)),
        ]
        .into_iter()
        .filter_map(|m| match LinkChange::of(&RouteNetlinkMessage::NewLink(m)) {
            Some(LinkChange::Set(index, link)) => Some((index, link)),
            _ => None,
        })
        .collect();
        let address = |index, attributes: Vec<AddressAttribute>| {
            let mut address = AddressMessage::default();
            address.header.index = index;
            address.attributes = attributes;
            address
        };
        let v4 = |s: &str| IpAddr::V4(s.parse().unwrap());
        let v6 = |s: &str| IpAddr::V6(s.parse().unwrap());
        let addresses = [
            address(3, vec![AddressAttribute::Address(v4("198.18.0.1"))]),
            // Point-to-point: IFA_ADDRESS is the peer, IFA_LOCAL ours.
            address(
                2,
                vec![
                    AddressAttribute::Address(v4("198.18.9.9")),
                    AddressAttribute::Local(v4("198.18.0.2")),
                ],
            ),
            address(3, vec![AddressAttribute::Address(v6("2001:db8::1"))]),
            address(3, vec![AddressAttribute::Address(v4("198.18.0.3"))]),
            // The link of this one is not known yet.
            address(42, vec![AddressAttribute::Address(v4("198.18.0.4"))]),
        ];
        let routes = [route(RouteHeader::RT_TABLE_MAIN, 0, None, 3)];
        let host = HostNetwork::assemble(&links, &addresses, &routes);
        let iface =
            |name: &str, index, master: Option<&str>, ipv4: &[&str], ipv6: &[&str]| HostInterface {
                name: name.into(),
                index,
                master: master.map(Into::into),
                ipv4: ipv4.iter().map(|a| a.parse().unwrap()).collect(),
                ipv6: ipv6.iter().map(|a| a.parse().unwrap()).collect(),
            };
        assert_eq!(
            host,
            HostNetwork {
                interfaces: vec![
                    iface("veth0", 2, Some("br0"), &["198.18.0.2"], &[]),
                    iface(
                        "br0",
                        3,
                        None,
                        &["198.18.0.1", "198.18.0.3"],
                        &["2001:db8::1"]
                    ),
                    iface("ghost", 4, None, &[], &[]),
                ],
                default_route_interface: Some("br0".into()),
            }
        );
    }

    fn datagram(messages: Vec<RouteNetlinkMessage>) -> Vec<u8> {
        let mut datagram = Vec::new();
        for message in messages {
            let mut message = NetlinkMessage::from(message);
            message.finalize();
            let mut bytes = vec![0; message.buffer_len()];
            message.serialize(&mut bytes);
            bytes.resize(bytes.len().next_multiple_of(4), 0);
            datagram.extend(bytes);
        }
        datagram
    }

    #[test]
    fn a_batch_keeps_the_link_notifications_and_counts_all() {
        let bridge_port = |m: RouteNetlinkMessage| match m {
            RouteNetlinkMessage::NewLink(mut l) => {
                l.header.interface_family = AddressFamily::Bridge;
                RouteNetlinkMessage::NewLink(l)
            }
            RouteNetlinkMessage::DelLink(mut l) => {
                l.header.interface_family = AddressFamily::Bridge;
                RouteNetlinkMessage::DelLink(l)
            }
            m => m,
        };
        let mut batch = Batch::default();
        batch.add(&datagram(vec![
            RouteNetlinkMessage::NewLink(link_message(7, "veth7", Some(3))),
            // A port leaving its bridge: the port itself stays.
            bridge_port(RouteNetlinkMessage::DelLink(link_message(
                7,
                "veth7",
                Some(3),
            ))),
            bridge_port(RouteNetlinkMessage::NewLink(link_message(
                7,
                "veth7",
                Some(3),
            ))),
            RouteNetlinkMessage::NewAddress(AddressMessage::default()),
        ]));
        batch.add(&datagram(vec![RouteNetlinkMessage::DelLink(link_message(
            8, "veth8", None,
        ))]));
        let veth7 = Link {
            name: "veth7".into(),
            master: Some(3),
        };
        assert_eq!(batch.notifications, 5);
        assert_eq!(
            batch.links,
            [LinkChange::Set(7, veth7.clone()), LinkChange::Removed(8)]
        );
        assert!(batch.lost.is_none());

        let mut links = Links::from([(8, veth7.clone())]);
        for change in batch.links {
            change.apply(&mut links);
        }
        assert_eq!(links, Links::from([(7, veth7)]));

        // A truncated datagram: its whole messages count, the rest is dropped.
        let bytes = datagram(vec![
            RouteNetlinkMessage::NewAddress(AddressMessage::default()),
            RouteNetlinkMessage::NewLink(link_message(9, "veth9", None)),
        ]);
        let mut batch = Batch::default();
        batch.add(&bytes[..bytes.len() - 3]);
        assert_eq!((batch.notifications, batch.links.len()), (1, 0));
    }

    #[test]
    fn the_live_host_lists_its_loopback_interface() {
        let host = HostNetwork::read().unwrap();
        let lo = host.interfaces.iter().find(|i| i.name == "lo").unwrap();
        assert_eq!(lo.index, 1);
        assert!(lo.ipv4.iter().all(Ipv4Addr::is_loopback));
    }

    /// Runs `f` on a thread of its own in a fresh network namespace, which
    /// goes away with the thread, whether `f` returns or panics. Skipped
    /// (said on stderr) where namespaces cannot be made: these tests run in
    /// the unit tests, which need no root.
    fn in_fresh_netns(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread; child processes inherit it.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                let e = io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "unshare: {e}");
                eprintln!("skipped: a network namespace needs CAP_SYS_ADMIN ({e})");
                return;
            }
            // No IPv6 link-local addresses on new interfaces: exact snapshots.
            // /proc/sys/net is the namespace of the thread that opens it.
            std::fs::write("/proc/sys/net/ipv6/conf/default/addr_gen_mode", "1").unwrap();
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// `ip` with these whitespace-separated arguments, in this thread's namespace.
    fn ip(args: &str) {
        let out = Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .expect("running ip");
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ifindex(name: &str) -> u32 {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: a valid NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        assert_ne!(index, 0, "no interface {name}");
        index
    }

    #[test]
    fn read_reports_links_addresses_masters_and_the_default_route() {
        in_fresh_netns(|| {
            for command in [
                "link set lo up",
                "link add hv0 type veth peer name hv1",
                "link add hv2 type veth peer name hv3",
                "link add hbr0 type bridge",
                "link set hv1 master hbr0",
                "addr add 198.18.0.1/24 dev hv0",
                "addr add 198.18.0.2/24 dev hv0",
                "addr add 2001:db8::1/64 dev hv0 nodad",
                "addr add 198.18.1.1/24 dev hv2",
                "link set hv0 up",
                "link set hv1 up",
                "link set hv2 up",
                "link set hv3 up",
                "link set hbr0 up",
                "route add default via 198.18.0.254 dev hv0 metric 200",
                "route add default via 198.18.1.254 dev hv2 metric 100",
                "route add default via 198.18.0.253 dev hv0 table 100",
            ] {
                ip(command);
            }
            let iface =
                |name: &str, master: Option<&str>, ipv4: &[&str], ipv6: &[&str]| HostInterface {
                    name: name.into(),
                    index: ifindex(name),
                    master: master.map(Into::into),
                    ipv4: ipv4.iter().map(|a| a.parse().unwrap()).collect(),
                    ipv6: ipv6.iter().map(|a| a.parse().unwrap()).collect(),
                };
            let mut interfaces = vec![
                iface("lo", None, &["127.0.0.1"], &["::1"]),
                iface("hv0", None, &["198.18.0.1", "198.18.0.2"], &["2001:db8::1"]),
                iface("hv1", Some("hbr0"), &[], &[]),
                iface("hv2", None, &["198.18.1.1"], &[]),
                iface("hv3", None, &[], &[]),
                iface("hbr0", None, &[], &[]),
            ];
            interfaces.sort_by_key(|i| i.index);
            let expected = HostNetwork {
                interfaces,
                default_route_interface: Some("hv2".into()),
            };
            assert_eq!(HostNetwork::read().unwrap(), expected);

            // The lowest metric goes; then there is no default route at all.
            ip("route del default dev hv2");
            let host = HostNetwork::read().unwrap();
            assert_eq!(host.default_route_interface.as_deref(), Some("hv0"));
            ip("route del default dev hv0");
            assert_eq!(HostNetwork::read().unwrap().default_route_interface, None);
        });
    }

    /// Sends `request` and waits for the kernel's acknowledgement.
    fn execute(rtnl: &mut Rtnl, request: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        rtnl.sequence += 1;
        let mut message = NetlinkMessage::from(request);
        message.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        message.header.sequence_number = rtnl.sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        rtnl.socket.send(&bytes, 0)?;
        loop {
            let len = receive(&rtnl.socket, &mut rtnl.buf)?;
            let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rtnl.buf[..len])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if answer.header.sequence_number != rtnl.sequence {
                continue;
            }
            if let NetlinkPayload::Error(e) = answer.payload {
                return match e.code {
                    None => Ok(()),
                    Some(_) => Err(e.to_io()),
                };
            }
        }
    }

    fn new_veth(rtnl: &mut Rtnl, name: &str, peer: &str) -> io::Result<()> {
        let mut peer_link = LinkMessage::default();
        peer_link
            .attributes
            .push(LinkAttribute::IfName(peer.into()));
        let mut link = LinkMessage::default();
        link.attributes.push(LinkAttribute::IfName(name.into()));
        link.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_link))),
        ]));
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        execute(rtnl, RouteNetlinkMessage::NewLink(link), flags)
    }

    fn delete_link(rtnl: &mut Rtnl, name: &str) -> io::Result<()> {
        let mut link = LinkMessage::default();
        link.attributes.push(LinkAttribute::IfName(name.into()));
        execute(rtnl, RouteNetlinkMessage::DelLink(link), 0)
    }

    /// Waits for a published snapshot that satisfies `done`; when it came.
    async fn published(
        rx: &mut watch::Receiver<Arc<HostNetwork>>,
        what: &str,
        done: impl Fn(&HostNetwork) -> bool,
    ) -> Instant {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if done(&rx.borrow_and_update()) {
                return Instant::now();
            }
            tokio::time::timeout_at(deadline, rx.changed())
                .await
                .unwrap_or_else(|_| panic!("no snapshot with {what} within 10 s"))
                .unwrap();
        }
    }

    #[test]
    fn an_overflowing_subscription_says_so() {
        in_fresh_netns(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut notifications = Notifications::subscribe().unwrap();
                // The smallest buffer the kernel allows: a few messages.
                set_receive_buffer(notifications.fd.get_ref(), 0);
                for i in 0..20 {
                    ip(&format!("link add ho{i}a type veth peer name ho{i}b"));
                }
                let batch = notifications.next_batch().await;
                let lost = batch.lost.as_ref().expect("an overflow");
                assert_eq!(lost.raw_os_error(), Some(libc::ENOBUFS), "{lost}");
                assert!(batch.notifications < 40, "{batch:?}");

                // The socket carries on.
                set_receive_buffer(notifications.fd.get_ref(), 1 << 20);
                let (a, b) = (ifindex("ho0a"), ifindex("ho0b"));
                ip("link del ho0a");
                let batch = notifications.next_batch().await;
                assert!(batch.lost.is_none(), "{batch:?}");
                for index in [a, b] {
                    assert!(
                        batch.links.contains(&LinkChange::Removed(index)),
                        "{batch:?}"
                    );
                }
            });
        });
    }

    /// What a burst of changes measured.
    struct Burst {
        /// How long making the changes took.
        took: Duration,
        /// From each change's request to the first snapshot showing it, sorted.
        delays: Vec<Duration>,
    }

    impl Burst {
        fn percentile(&self, p: usize) -> Duration {
            self.delays[(self.delays.len() * p / 100).min(self.delays.len() - 1)]
        }
    }

    impl std::fmt::Display for Burst {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "in {:?}; request to publication p50 {:?}, p99 {:?}, max {:?}",
                self.took,
                self.percentile(50),
                self.percentile(99),
                self.delays[self.delays.len() - 1]
            )
        }
    }

    /// Applies `change` to every pair as fast as it can, from another thread
    /// through `rtnl` (opened in the namespace), and waits until every name
    /// is `present` (or absent) in a published snapshot.
    async fn burst(
        rx: &mut watch::Receiver<Arc<HostNetwork>>,
        mut rtnl: Rtnl,
        pairs: &[(String, String)],
        change: fn(&mut Rtnl, &str, &str) -> io::Result<()>,
        present: bool,
    ) -> (Rtnl, Burst) {
        let changing = std::thread::spawn({
            let pairs = pairs.to_vec();
            move || {
                let started = Instant::now();
                let requested: Vec<Instant> = pairs
                    .iter()
                    .map(|(name, peer)| {
                        let at = Instant::now();
                        change(&mut rtnl, name, peer).unwrap();
                        at
                    })
                    .collect();
                (rtnl, requested, started.elapsed())
            }
        });
        let mut seen: HashMap<&str, Instant> = HashMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while seen.len() < 2 * pairs.len() {
            tokio::time::timeout_at(deadline, rx.changed())
                .await
                .unwrap_or_else(|_| panic!("{} of {} changes seen", seen.len(), 2 * pairs.len()))
                .unwrap();
            let now = Instant::now();
            let host = rx.borrow_and_update().clone();
            for (a, b) in pairs {
                for name in [a, b] {
                    if host.interfaces.iter().any(|i| &i.name == name) == present {
                        seen.entry(name).or_insert(now);
                    }
                }
            }
        }
        let (rtnl, requested, took) = changing.join().unwrap();
        let mut delays: Vec<Duration> = pairs
            .iter()
            .zip(&requested)
            .flat_map(|((a, b), at)| [seen[a.as_str()] - *at, seen[b.as_str()] - *at])
            .collect();
        delays.sort();
        (rtnl, Burst { took, delays })
    }

    #[test]
    fn run_publishes_a_burst_of_new_interfaces_within_milliseconds() {
        const PAIRS: usize = 200;
        in_fresh_netns(|| {
            // Opened here, the socket changes links in this namespace from
            // another thread.
            let rtnl = Rtnl::open().unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let source = Arc::new(HostSource::new().unwrap());
                let mut rx = source.subscribe();
                let runner = tokio::spawn({
                    let source = source.clone();
                    async move { source.run().await }
                });
                // Let run() subscribe and do its first read.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let counts = || {
                    (
                        source.notifications.load(Ordering::Relaxed),
                        source.published.load(Ordering::Relaxed),
                    )
                };
                let before = counts();

                let pairs: Vec<(String, String)> = (0..PAIRS)
                    .map(|i| (format!("hb{i}a"), format!("hb{i}b")))
                    .collect();
                let (rtnl, created) = burst(&mut rx, rtnl, &pairs, new_veth, true).await;
                let after = counts();
                let (notifications, snapshots) = (after.0 - before.0, after.1 - before.1);
                eprintln!(
                    "{PAIRS} veth pairs created {created}; \
                     {notifications} notifications, {snapshots} snapshots published"
                );
                assert!(created.percentile(99) < Duration::from_secs(1), "{created}");
                assert!(
                    snapshots * 4 <= notifications,
                    "{snapshots} snapshots for {notifications} notifications: not coalesced"
                );
                let host = source.current();
                for (name, peer) in &pairs {
                    let iface = host.interfaces.iter().find(|i| &i.name == name).unwrap();
                    assert_eq!((iface.index, iface.master.as_ref()), (ifindex(name), None));
                    assert!(host.interfaces.iter().any(|i| &i.name == peer));
                }

                // Addresses and a default route come and go.
                ip("link set hb0a up");
                ip("link set hb0b up");
                ip("addr add 198.18.7.1/24 dev hb0a");
                ip("addr add 2001:db8:7::1/64 dev hb0a nodad");
                ip("route add default via 198.18.7.254 dev hb0a");
                let with = |h: &HostNetwork, v4: bool, v6: bool| {
                    h.interfaces.iter().any(|i| {
                        i.name == "hb0a"
                            && i.ipv4.contains(&"198.18.7.1".parse().unwrap()) == v4
                            && i.ipv6.contains(&"2001:db8:7::1".parse().unwrap()) == v6
                    })
                };
                published(&mut rx, "hb0a's addresses and default route", |h| {
                    with(h, true, true) && h.default_route_interface.as_deref() == Some("hb0a")
                })
                .await;
                ip("addr del 2001:db8:7::1/64 dev hb0a");
                published(&mut rx, "hb0a's IPv6 address gone", |h| {
                    with(h, true, false)
                })
                .await;
                // The kernel drops the default route with the last IPv4
                // address, without a route notification.
                ip("addr del 198.18.7.1/24 dev hb0a");
                published(&mut rx, "hb0a without addresses or default route", |h| {
                    with(h, false, false) && h.default_route_interface.is_none()
                })
                .await;

                // Deleting one end of a pair deletes both.
                let delete = |rtnl: &mut Rtnl, name: &str, _: &str| delete_link(rtnl, name);
                let (_, deleted) = burst(&mut rx, rtnl, &pairs, delete, false).await;
                eprintln!("{PAIRS} veth pairs deleted {deleted}");
                assert!(deleted.percentile(99) < Duration::from_secs(1), "{deleted}");
                let names: Vec<String> = source
                    .current()
                    .interfaces
                    .iter()
                    .map(|i| i.name.clone())
                    .collect();
                assert_eq!(names, ["lo"]);
                runner.abort();
            });
        });
    }
}
