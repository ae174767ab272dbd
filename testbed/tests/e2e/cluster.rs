//! The two-node cluster: who reaches whom, what the lan carries, and that
//! nothing is left behind. Needs root (it creates network namespaces).

use std::{
    io, mem,
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    process::Command,
    time::{Duration, Instant},
};

use proxy_common::action::XDP_TX;
use testbed::{
    clients::{ConnectOutcome, UdpOutcome, tcp_connect_outcome, udp_outcome},
    cluster::{Cluster, NodeId},
    ethtool::{self, Offload},
    netns,
    servers::IdentityServer,
    xdp_pass,
};

const PORT: u16 = 8080;
const TIMEOUT: Duration = Duration::from_secs(2);

fn our_namespaces(cluster_id: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&format!("{cluster_id}-")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_client_reaches_both_nodes_from_any_of_its_addresses() {
    let cluster = Cluster::new().unwrap();
    let extra = Ipv4Addr::new(198, 18, 0, 101);
    cluster.client_add_address(&format!("{extra}/24")).unwrap();
    let client = cluster.client();
    for n in NodeId::ALL {
        let node = cluster.node(n);
        let server = IdentityServer::start(&node.ns, &format!("node-{n}"), PORT).unwrap();
        let dst = SocketAddrV4::new(node.ip, PORT);
        for src in [None, Some(extra)] {
            let outcome = tcp_connect_outcome(&client.ns, src, dst, TIMEOUT);
            assert_eq!(
                outcome.identity(),
                Some(server.identity.as_str()),
                "{outcome:?}"
            );
            match udp_outcome(&client.ns, src, dst, TIMEOUT) {
                UdpOutcome::Reply { identity, from } => {
                    assert_eq!((identity.as_str(), from), (server.identity.as_str(), dst));
                }
                other => panic!("UDP to node {n} from {src:?}: {other:?}"),
            }
        }
        assert_eq!(server.tcp_sources(), [client.ip, extra]);
        assert_eq!(server.udp_sources(), [client.ip, extra]);
        server.clear_seen();
        assert!(server.tcp_sources().is_empty());
    }
}

#[test]
fn a_closed_port_is_refused_at_once_not_timed_out() {
    let cluster = Cluster::new().unwrap();
    let dst = SocketAddrV4::new(cluster.node(NodeId::B).ip, PORT);
    let client = &cluster.client().ns;
    match tcp_connect_outcome(client, None, dst, TIMEOUT) {
        ConnectOutcome::Refused { elapsed } => assert!(elapsed < Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    let outcome = udp_outcome(client, None, dst, TIMEOUT);
    assert!(matches!(outcome, UdpOutcome::Refused), "{outcome:?}");
}

#[test]
fn pods_on_different_nodes_reach_each_other_without_nat() {
    let mut cluster = Cluster::new().unwrap();
    let a = cluster.add_pod(NodeId::A, "a1").unwrap();
    let b = cluster.add_pod(NodeId::B, "b1").unwrap();
    assert_eq!(a.ip, Ipv4Addr::new(198, 18, 1, 10));
    assert_eq!(b.ip, Ipv4Addr::new(198, 18, 2, 10));
    assert!(cluster.node(NodeId::A).pod_cidr.contains(a.ip));
    assert_eq!(cluster.node_of("b1"), NodeId::B);
    assert!(a.host_veth.starts_with("veth"));

    let server_b = IdentityServer::start(&b.ns, "b1", PORT).unwrap();
    let server_a = IdentityServer::start(&a.ns, "a1", PORT).unwrap();
    let to_b = SocketAddrV4::new(b.ip, PORT);
    let outcome = tcp_connect_outcome(&a.ns, None, to_b, TIMEOUT);
    assert_eq!(outcome.identity(), Some("b1"), "{outcome:?}");
    let outcome = udp_outcome(&b.ns, None, SocketAddrV4::new(a.ip, PORT), TIMEOUT);
    assert_eq!(outcome.identity(), Some("a1"), "{outcome:?}");
    assert_eq!(server_b.tcp_sources(), [a.ip]);
    assert_eq!(server_a.udp_sources(), [b.ip]);
}

#[test]
fn the_client_has_no_route_to_pods() {
    let mut cluster = Cluster::new().unwrap();
    let pod = cluster.add_pod(NodeId::A, "a1").unwrap();
    let _server = IdentityServer::start(&pod.ns, "a1", PORT).unwrap();
    let dst = SocketAddrV4::new(pod.ip, PORT);
    match tcp_connect_outcome(&cluster.client().ns, None, dst, TIMEOUT) {
        ConnectOutcome::Other(e) => assert_eq!(e.kind(), io::ErrorKind::NetworkUnreachable),
        other => panic!("{other:?}"),
    }
    // Once routed via a node, as an upstream router would, the pod answers.
    let cidr = cluster.node(NodeId::A).pod_cidr.to_string();
    cluster.client_add_route(&cidr, NodeId::A).unwrap();
    let outcome = tcp_connect_outcome(&cluster.client().ns, None, dst, TIMEOUT);
    assert_eq!(outcome.identity(), Some("a1"), "{outcome:?}");
}

#[test]
fn lan_veths_have_tx_checksum_offload_off() {
    let mut cluster = Cluster::new().unwrap();
    let lan = cluster.lan_interfaces();
    assert_eq!(lan.len(), 6);
    for (ns, iface) in &lan {
        for offload in [Offload::TxChecksum, Offload::Tso, Offload::Gso] {
            assert!(
                !ethtool::offload(ns, iface, offload).unwrap(),
                "{offload:?} on {ns}/{iface}"
            );
        }
    }
    // Pod veths keep the veth default, which shows the read-back is real.
    let pod = cluster.add_pod(NodeId::A, "a1").unwrap();
    let node_ns = &cluster.node(NodeId::A).ns;
    assert!(ethtool::offload(node_ns, &pod.host_veth, Offload::TxChecksum).unwrap());
}

#[test]
fn packets_on_the_lan_carry_full_checksums() {
    let mut cluster = Cluster::new().unwrap();
    let a = cluster.add_pod(NodeId::A, "a1").unwrap();
    let b = cluster.add_pod(NodeId::B, "b1").unwrap();
    let node_b = cluster.node(NodeId::B).clone();
    let client = cluster.client().clone();
    let _on_node = IdentityServer::start(&node_b.ns, "node-b", PORT).unwrap();
    let _on_pod = IdentityServer::start(&b.ns, "b1", PORT).unwrap();
    let exchange = |ns: &str, dst: Ipv4Addr| {
        let dst = SocketAddrV4::new(dst, PORT);
        assert!(
            tcp_connect_outcome(ns, None, dst, TIMEOUT)
                .identity()
                .is_some()
        );
        assert!(udp_outcome(ns, None, dst, TIMEOUT).identity().is_some());
    };

    let packets = capture(&node_b.ns, &node_b.eth0, || {
        exchange(&client.ns, node_b.ip);
        exchange(&a.ns, b.ip);
    });
    for sender in [client.ip, a.ip] {
        let sent: Vec<_> = packets.iter().filter(|p| source(p) == sender).collect();
        assert!(sent.len() >= 4, "{sender}: {} packets", sent.len());
        for p in sent {
            assert!(checksums_ok(p), "{sender}: bad checksum in {p:02x?}");
        }
    }

    // Control: with offload back on along the path, the same capture sees
    // the partial checksums a veth passes on.
    ethtool::set_offload(&client.ns, &client.eth0, Offload::TxChecksum, true).unwrap();
    ethtool::set_offload(&cluster.lan_ns, "port-b", Offload::TxChecksum, true).unwrap();
    let packets = capture(&node_b.ns, &node_b.eth0, || exchange(&client.ns, node_b.ip));
    assert!(
        packets
            .iter()
            .any(|p| source(p) == client.ip && !checksums_ok(p))
    );
}

#[test]
fn drop_and_remove_pod_leave_no_namespace_behind() {
    let mut cluster = Cluster::new().unwrap();
    cluster.add_pod(NodeId::A, "a1").unwrap();
    cluster.add_pod(NodeId::B, "b1").unwrap();
    let id = cluster.id.clone();
    assert_eq!(our_namespaces(&id).len(), 6);
    let pod_ns = cluster.pod("a1").ns.clone();
    cluster.remove_pod("a1");
    assert!(!netns::exists(&pod_ns));
    assert!(cluster.node(NodeId::A).pods.is_empty());
    assert_eq!(our_namespaces(&id).len(), 5);
    drop(cluster);
    assert_eq!(our_namespaces(&id), Vec::<String>::new());
}

#[test]
fn a_panic_leaves_no_namespace_behind() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let mut cluster = Cluster::new().unwrap();
        cluster.add_pod(NodeId::B, "b1").unwrap();
        tx.send(cluster.id.clone()).unwrap();
        panic!("test body failed");
    })
    .join();
    assert!(result.is_err());
    let id = rx.recv().unwrap();
    assert_eq!(our_namespaces(&id), Vec::<String>::new());
}

#[test]
fn sigint_leaves_no_namespace_behind() {
    crate::signal_removes_every_namespace(&["cluster"], 6, libc::SIGINT);
}

/// Every IPv4 packet `iface` of `ns` received while `traffic` ran, from the
/// IP header on: the bytes an XDP program there would see.
fn capture(ns: &str, iface: &str, traffic: impl FnOnce()) -> Vec<Vec<u8>> {
    let iface = iface.to_owned();
    let sock = netns::run_in(ns, move || packet_socket(&iface, libc::ETH_P_IP as u16))
        .unwrap()
        .unwrap();
    traffic();
    let mut packets = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            break;
        };
        packets.push(buf[..n].to_vec());
    }
    packets
}

/// A SOCK_DGRAM packet socket bound to `iface` for EtherType `ethertype`.
fn packet_socket(iface: &str, ethertype: u16) -> io::Result<OwnedFd> {
    let proto = ethertype.to_be();
    // SAFETY: plain syscalls; the fd is owned at once.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto));
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let sock = OwnedFd::from_raw_fd(fd);
        let name = std::ffi::CString::new(iface).unwrap();
        let mut addr: libc::sockaddr_ll = mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        let rc = libc::bind(
            fd,
            (&raw const addr).cast(),
            mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sock)
    }
}

fn source(ip_packet: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(ip_packet[12], ip_packet[13], ip_packet[14], ip_packet[15])
}

/// The IPv4 header checksum and, for TCP and UDP, the full L4 checksum.
fn checksums_ok(p: &[u8]) -> bool {
    let header_len = usize::from(p[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if fold(sum(&p[..header_len])) != 0xffff {
        return false;
    }
    let proto = p[9];
    if proto != 6 && proto != 17 {
        return true;
    }
    let l4 = &p[header_len..total_len];
    let pseudo = sum(&p[12..20]) + u32::from(proto) + l4.len() as u32;
    fold(pseudo + sum(l4)) == 0xffff
}

fn sum(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// `ip -d -j link show` of `iface` in `ns`.
fn link_json(ns: &str, iface: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "-j", "link", "show", iface])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bridge_ports_carry_a_native_xdp_program_and_node_eth0s_none() {
    let cluster = Cluster::new().unwrap();
    for port in ["port-a", "port-b", "port-client"] {
        let json = link_json(&cluster.lan_ns, port);
        // "mode":1 is XDP_ATTACHED_DRV (native), with the program's details.
        let compact: String = json.split_whitespace().collect();
        assert!(
            compact.contains(r#""xdp":{"mode":1,"prog":{"#),
            "{port}: {json}"
        );
        assert!(compact.contains(r#""name":"xdp_pass""#), "{port}: {json}");
    }
    // The nodes' side is left to the product.
    for n in NodeId::ALL {
        let json = link_json(&cluster.node(n).ns, &cluster.node(n).eth0);
        assert!(!json.contains(r#""xdp""#), "node {n}: {json}");
    }
    // The links close and the namespaces go on drop.
    let lan_ns = cluster.lan_ns.clone();
    let id = cluster.id.clone();
    drop(cluster);
    assert!(!netns::exists(&lan_ns));
    assert_eq!(our_namespaces(&id), Vec::<String>::new());
}

/// IEEE 802 local experimental EtherType: nothing else on the lan uses it.
const PROBE_ETHERTYPE: u16 = 0x88b5;

/// The regression test for the veth quirk [`xdp_pass`] works around: a
/// broadcast from the client reaches node B directly and, bounced by an
/// XDP_TX program on node A's `eth0`, a second time, at once rather than
/// when unrelated traffic happens to kick port-a's NAPI.
#[test]
fn xdp_tx_on_a_node_eth0_leaves_at_once() {
    let cluster = Cluster::new().unwrap();
    let a = cluster.node(NodeId::A);
    let b = cluster.node(NodeId::B).clone();
    let _bounce = xdp_pass::attach_returning(&a.ns, &a.eth0, XDP_TX).unwrap();
    let iface = b.eth0.clone();
    let listener = netns::run_in(&b.ns, move || packet_socket(&iface, PROBE_ETHERTYPE))
        .unwrap()
        .unwrap();
    let client = cluster.client().clone();
    let sent = Instant::now();
    netns::run_in(&client.ns, move || send_broadcast(&client.eth0, b"probe"))
        .unwrap()
        .unwrap();

    let deadline = sent + Duration::from_millis(500);
    let mut copies = 0;
    let mut buf = [0u8; 2048];
    while copies < 2 && Instant::now() < deadline {
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                listener.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match usize::try_from(n) {
            Ok(n) if buf[..n].starts_with(b"probe") => copies += 1,
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert_eq!(copies, 2, "after {:?}", sent.elapsed());
}

/// Sends `payload` as a broadcast frame of EtherType [`PROBE_ETHERTYPE`] out of `iface`.
fn send_broadcast(iface: &str, payload: &[u8]) -> io::Result<()> {
    let sock = packet_socket(iface, PROBE_ETHERTYPE)?;
    let name = std::ffi::CString::new(iface).unwrap();
    // SAFETY: plain syscalls on an owned fd with a zeroed, filled-in sockaddr_ll.
    unsafe {
        let mut addr: libc::sockaddr_ll = mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = PROBE_ETHERTYPE.to_be();
        addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        addr.sll_halen = 6;
        addr.sll_addr[..6].fill(0xff);
        let n = libc::sendto(
            sock.as_raw_fd(),
            payload.as_ptr().cast(),
            payload.len(),
            0,
            (&raw const addr).cast(),
            mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
