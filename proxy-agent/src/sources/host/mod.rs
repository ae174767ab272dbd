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
    link::{InfoKind, LinkAttribute, LinkExtentMask, LinkInfo, LinkMessage},
    route::{RouteAttribute, RouteHeader, RouteMessage, RouteType},
    rule::RuleMessage,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::watch,
    time::MissedTickBehavior,
};
use tracing::{debug, info, warn};

use super::SourceEvent;

mod routing;

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
    /// A veth or netkit device whose peer is in another network namespace
    /// (a pod's): a packet for the peer may be handed straight to its
    /// ingress (`bpf_redirect_peer`).
    pub peer_in_other_netns: bool,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub interfaces: Vec<HostInterface>,
    /// The interface of the IPv4 default route with the lowest metric.
    pub default_route_interface: Option<String>,
    /// Which families route by destination (and input interface) alone.
    pub destination_routing: DestinationRouting,
}

/// Per family: whether a forwarded packet's route depends on its
/// destination and input interface alone (no rule by source, ports or
/// protocol, no source-specific or multipath route), so that flows to one
/// destination may share a cached next hop (proxy-ebpf's `hops`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestinationRouting {
    pub ipv4: bool,
    pub ipv6: bool,
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
    fn assemble(
        links: &Links,
        addresses: &[AddressMessage],
        routes: &[RouteMessage],
        rules: &[RuleMessage],
    ) -> Self {
        let mut interfaces: BTreeMap<u32, HostInterface> = links
            .iter()
            .map(|(&index, link)| {
                let iface = HostInterface {
                    name: link.name.clone(),
                    index,
                    master: link.master.and_then(|m| Some(links.get(&m)?.name.clone())),
                    peer_in_other_netns: link.peer_in_other_netns,
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
            destination_routing: DestinationRouting {
                ipv4: routing::by_destination(AddressFamily::Inet, rules, routes),
                ipv6: routing::by_destination(AddressFamily::Inet6, rules, routes),
            },
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
    /// See [`HostInterface::peer_in_other_netns`].
    peer_in_other_netns: bool,
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
                let (mut paired, mut link_netns) = (false, false);
                for attribute in &m.attributes {
                    match attribute {
                        LinkAttribute::IfName(n) => name = Some(n.clone()),
                        LinkAttribute::Controller(i) => master = Some(*i),
                        LinkAttribute::LinkInfo(infos) => {
                            paired = infos.iter().any(|i| {
                                matches!(i, LinkInfo::Kind(InfoKind::Veth | InfoKind::Netkit))
                            })
                        }
                        // Sent only when the link's other end is in another namespace.
                        LinkAttribute::LinkNetNsId(_) => link_netns = true,
                        _ => {}
                    }
                }
                Some(LinkChange::Set(
                    m.header.index,
                    Link {
                        name: name?,
                        master,
                        peer_in_other_netns: paired && link_netns,
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
/// the thread that opened it, whichever thread uses it later. Also used by
/// [`crate::modes::ebpf::introspect`] to read the interfaces' XDP programs.
pub(crate) struct Rtnl {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    pub(crate) fn open() -> io::Result<Self> {
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

    /// The snapshot of `links` with the addresses, routes and routing rules dumped now.
    fn with_addresses_and_routes(&mut self, links: &Links) -> io::Result<HostNetwork> {
        let get_routes = |family| {
            move || {
                let mut get = RouteMessage::default();
                get.header.address_family = family;
                RouteNetlinkMessage::GetRoute(get)
            }
        };
        let get_rules = |family| {
            move || {
                let mut get = RuleMessage::default();
                get.header.family = family;
                RouteNetlinkMessage::GetRule(get)
            }
        };
        let (mut addresses, mut routes, mut rules) = (Vec::new(), Vec::new(), Vec::new());
        let mut answers =
            self.dump(|| RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            answers.extend(self.dump(get_routes(family))?);
            answers.extend(self.dump(get_rules(family))?);
        }
        for answer in answers {
            match answer {
                RouteNetlinkMessage::NewAddress(m) => addresses.push(m),
                RouteNetlinkMessage::NewRoute(m) => routes.push(m),
                RouteNetlinkMessage::NewRule(m) => rules.push(m),
                _ => {}
            }
        }
        Ok(HostNetwork::assemble(links, &addresses, &routes, &rules))
    }

    /// Sends `request` (with `flags` beside REQUEST and ACK) and waits for
    /// the kernel's acknowledgement.
    pub(crate) fn execute(&mut self, request: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut message = NetlinkMessage::from(request);
        message.header.flags = NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK | flags;
        message.header.sequence_number = self.sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        loop {
            let len = receive(&self.socket, &mut self.buf)?;
            for frame in frames(&self.buf[..len]) {
                if frame.sequence_number != self.sequence {
                    continue;
                }
                if let Ok(NetlinkPayload::Error(e)) = frame.parse() {
                    return match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    };
                }
            }
        }
    }

    /// The answers to a dump `request`, dumped again while the kernel flags
    /// the dump as interrupted by a change (then kept as they are).
    pub(crate) fn dump(
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
            libc::RTNLGRP_IPV4_RULE,
            libc::RTNLGRP_IPV6_RULE,
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
mod tests;
