use std::{
    collections::HashMap,
    process::Command,
    time::{Duration, Instant},
};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
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
    let host = HostNetwork::assemble(&links, &addresses, &routes, &[]);
    let iface =
        |name: &str, index, master: Option<&str>, ipv4: &[&str], ipv6: &[&str]| HostInterface {
            name: name.into(),
            index,
            master: master.map(Into::into),
            peer_in_other_netns: false,
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
            // No rule, one plain route.
            destination_routing: DestinationRouting {
                ipv4: true,
                ipv6: true,
            },
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
        peer_in_other_netns: false,
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
                peer_in_other_netns: false,
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
            // A fresh namespace's rules, and no multipath route.
            destination_routing: DestinationRouting {
                ipv4: true,
                ipv6: true,
            },
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

/// A process in a network namespace of its own, killed on drop.
struct OtherNetns(std::process::Child);

impl OtherNetns {
    fn start() -> Self {
        let child = Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .spawn()
            .expect("unshare");
        let other = OtherNetns(child);
        let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let theirs = format!("/proc/{}/ns/net", other.0.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(&theirs).ok().as_ref() == Some(&ours) {
            assert!(
                std::time::Instant::now() < deadline,
                "unshare did not unshare"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        other
    }
}

impl Drop for OtherNetns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_veth_whose_peer_is_in_another_namespace_is_marked() {
    in_fresh_netns(|| {
        let other = OtherNetns::start();
        ip("link add pv0 type veth peer name pv1");
        ip("link add pv2 type veth peer name pv3");
        ip("link add pbr0 type bridge");
        ip(&format!("link set pv1 netns {}", other.0.id()));
        let host = HostNetwork::read().unwrap();
        let marked: Vec<&str> = host
            .interfaces
            .iter()
            .filter(|i| i.peer_in_other_netns)
            .map(|i| i.name.as_str())
            .collect();
        // pv2 and pv3 are each other's peers here; a bridge has none.
        assert_eq!(marked, ["pv0"]);

        // Once its peer leaves too, pv2 is marked.
        ip(&format!("link set pv3 netns {}", other.0.id()));
        let host = HostNetwork::read().unwrap();
        assert!(
            host.interfaces
                .iter()
                .any(|i| i.name == "pv2" && i.peer_in_other_netns)
        );
    });
}

#[test]
fn routing_by_source_ports_or_several_paths_is_not_by_destination() {
    in_fresh_netns(|| {
        for command in [
            "link set lo up",
            "link add hv0 type veth peer name hv1",
            "addr add 198.18.0.1/24 dev hv0",
            "addr add 198.18.1.1/24 dev hv1",
            "link set hv0 up",
            "link set hv1 up",
        ] {
            ip(command);
        }
        let routing = || HostNetwork::read().unwrap().destination_routing;
        let both = DestinationRouting {
            ipv4: true,
            ipv6: true,
        };
        assert_eq!(routing(), both);
        // A mark rule: the datapath's queries carry none, the answer stays shared.
        ip("rule add fwmark 0x4000 lookup 100");
        assert_eq!(routing(), both);
        ip("rule add from 198.18.5.0/24 lookup 100");
        assert_eq!(
            routing(),
            DestinationRouting {
                ipv4: false,
                ipv6: true
            }
        );
        ip("rule del from 198.18.5.0/24 lookup 100");
        ip("-6 rule add ipproto tcp lookup 100");
        assert_eq!(
            routing(),
            DestinationRouting {
                ipv4: true,
                ipv6: false
            }
        );
        ip("-6 rule del ipproto tcp lookup 100");
        assert_eq!(routing(), both);
        ip("route add 198.18.7.0/24 nexthop via 198.18.0.2 dev hv0 nexthop via 198.18.1.2 dev hv1");
        assert_eq!(
            routing(),
            DestinationRouting {
                ipv4: false,
                ipv6: true
            }
        );
    });
}

fn execute(rtnl: &mut Rtnl, request: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    rtnl.execute(request, flags)
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
