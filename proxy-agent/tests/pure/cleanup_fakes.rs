//! The parts of --cleanup that cannot run on these kernels (IPVS, dummy interfaces, ipset,
//! attached BPF programs), checked through the exact requests and commands they send.

use proxy_agent::cleanup::{FakeGenl, FakeRunner, Removed, Report};
use proxy_agent::modes::ebpf::cleanup as bpf;
use proxy_agent::modes::ipvs::cleanup::{self as ipvs, IpvsOutcome, reply};
use proxy_agent::modes::{iptables::cleanup as iptables, nftables::cleanup as nftables};

fn ne16(v: u16) -> [u8; 2] {
    v.to_ne_bytes()
}
fn ne32(v: u32) -> [u8; 4] {
    v.to_ne_bytes()
}

#[test]
fn ipvs_netlink_requests_are_exact() {
    // CTRL_CMD_GETFAMILY "IPVS": nlmsghdr{len 28, type GENL_ID_CTRL, REQUEST|ACK, seq 1, pid 0},
    // genlmsghdr{cmd 3, version 1}, attr{len 9, CTRL_ATTR_FAMILY_NAME} "IPVS\0" + 3 pad bytes.
    let mut want = Vec::new();
    want.extend(ne32(32));
    want.extend(ne16(0x10));
    want.extend(ne16(0x5));
    want.extend(ne32(1));
    want.extend(ne32(0));
    want.extend([3, 1, 0, 0]);
    want.extend(ne16(9));
    want.extend(ne16(2));
    want.extend(b"IPVS\0\0\0\0");
    assert_eq!(ipvs::get_family_request(1), want);

    // IPVS_CMD_FLUSH (17), version 1, on family 0x23, REQUEST|ACK, no attributes.
    let mut want = Vec::new();
    want.extend(ne32(20));
    want.extend(ne16(0x23));
    want.extend(ne16(0x5));
    want.extend(ne32(3));
    want.extend(ne32(0));
    want.extend([17, 1, 0, 0]);
    assert_eq!(ipvs::flush_request(0x23, 3), want);

    // IPVS_CMD_GET_SERVICE (4) as a dump: REQUEST|DUMP = 0x301.
    let req = ipvs::list_services_request(0x23, 2);
    assert_eq!(&req[4..8], [ne16(0x23), ne16(0x301)].concat().as_slice());
    assert_eq!(req[16], 4);
}

#[test]
fn ipvs_flush_sequence_with_services() {
    let mut g = FakeGenl::default();
    g.replies
        .push_back(vec![reply::family(0x23), reply::ack(0)]);
    g.replies.push_back(vec![
        reply::service(0x23),
        reply::service(0x23),
        reply::done(),
    ]);
    g.replies.push_back(vec![reply::ack(0)]);
    assert_eq!(ipvs::flush(&mut g).unwrap(), IpvsOutcome::Flushed(2));
    assert_eq!(
        g.requests,
        [
            ipvs::get_family_request(1),
            ipvs::list_services_request(0x23, 2),
            ipvs::flush_request(0x23, 3)
        ]
    );
}

#[test]
fn ipvs_with_nothing_there_sends_no_flush() {
    let mut g = FakeGenl::default();
    g.replies
        .push_back(vec![reply::family(0x23), reply::ack(0)]);
    g.replies.push_back(vec![reply::done()]);
    assert_eq!(ipvs::flush(&mut g).unwrap(), IpvsOutcome::Flushed(0));
    assert_eq!(g.requests.len(), 2);
}

#[test]
fn ipvs_absent_or_failing() {
    let mut g = FakeGenl::default();
    g.replies.push_back(vec![reply::ack(libc::ENOENT)]);
    assert_eq!(ipvs::flush(&mut g).unwrap(), IpvsOutcome::NotAvailable);
    assert_eq!(g.requests.len(), 1);
    let mut g = FakeGenl::default();
    g.replies
        .push_back(vec![reply::family(0x23), reply::ack(0)]);
    g.replies
        .push_back(vec![reply::service(0x23), reply::done()]);
    g.replies.push_back(vec![reply::ack(libc::EPERM)]);
    let e = ipvs::flush(&mut g).unwrap_err();
    assert!(e.to_string().contains("flushing IPVS"), "{e}");
}

#[test]
fn real_netlink_reports_ipvs_absent_on_this_kernel() {
    // Read-only family lookup; these kernels are built without IPVS.
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        return; // a kernel with IPVS: the lookup would find it; nothing to assert here
    }
    let mut t = proxy_agent::cleanup::NetlinkTransport;
    assert_eq!(ipvs::flush(&mut t).unwrap(), IpvsOutcome::NotAvailable);
}

#[test]
fn dummy_interface_and_ipsets() {
    let mut run = FakeRunner::default();
    run.on("ip", &["-d", "-o", "link", "show", "kube-ipvs0"], "5: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN \\    link/ether 8a:5e brd ff:ff:ff:ff:ff:ff promiscuity 0 \\    dummy addrgenmode eui64\n")
        .on("ipset", &["list", "-n"], "KUBE-CLUSTER-IP\nKUBE-LOOP-BACK\nsomeone-else\n");
    let mut g = FakeGenl::default();
    g.replies.push_back(vec![reply::ack(libc::ENOENT)]);
    let mut report = Report::default();
    ipvs::cleanup(&mut g, &mut run, &mut report);
    assert_eq!(
        run.lines(),
        [
            "ip -d -o link show kube-ipvs0",
            "ip link delete kube-ipvs0",
            "ipset list -n",
            "ipset destroy KUBE-CLUSTER-IP",
            "ipset destroy KUBE-LOOP-BACK",
        ]
    );
    assert_eq!(
        report.removed,
        [
            Removed::Link {
                name: "kube-ipvs0".into()
            },
            Removed::IpSet {
                name: "KUBE-CLUSTER-IP".into()
            },
            Removed::IpSet {
                name: "KUBE-LOOP-BACK".into()
            },
        ]
    );
    // tools missing: nothing fails
    let mut run = FakeRunner::default();
    run.missing("ipset");
    let mut g = FakeGenl::default();
    g.replies.push_back(vec![reply::ack(libc::ENOENT)]);
    let mut report = Report::default();
    ipvs::cleanup(&mut g, &mut run, &mut report);
    assert!(
        report.errors.is_empty() && report.removed.is_empty(),
        "{report:?}"
    );
}

#[test]
fn iptables_plan_and_restore_payload() {
    let dump = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-MARK-DROP - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A OUTPUT -j KUBE-MARK-DROP\n-A KUBE-SERVICES -j KUBE-SVC-X\nCOMMIT\n";
    let p = iptables::plan("nat", dump);
    assert_eq!(p.chains, ["KUBE-SERVICES", "KUBE-SVC-X"]);
    assert_eq!(
        p.jump_rules,
        ["-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"]
    );
    assert_eq!(
        p.restore_payload(),
        "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n-F KUBE-SERVICES\n-F KUBE-SVC-X\n-X KUBE-SERVICES\n-X KUBE-SVC-X\nCOMMIT\n"
    );
    assert!(
        iptables::plan("filter", dump).is_empty(),
        "only the named table counts"
    );
}

#[test]
fn nftables_plan() {
    let listing = "table ip filter\ntable ip kube-proxy\ntable ip6 kube-proxy\ntable inet kube-ebpf-proxy\ntable bridge kube-proxy\ntable inet kube-proxy-other\n";
    assert_eq!(
        nftables::plan(listing),
        [
            ("ip".to_string(), "kube-proxy".to_string()),
            ("ip6".into(), "kube-proxy".into()),
            ("inet".into(), "kube-ebpf-proxy".into())
        ]
    );
}

#[test]
fn attached_programs_are_detached_by_name() {
    let links = r#"[{"ifindex":1,"ifname":"lo"},
        {"ifindex":2,"ifname":"eth0","xdp":{"mode":1,"prog":{"id":7,"name":"xdp_lb","tag":"aa","jited":1}}},
        {"ifindex":3,"ifname":"eth1","xdp":{"mode":2,"prog":{"id":8,"name":"someone_else"}}},
        {"ifindex":4,"ifname":"veth1","xdp":{"mode":4,"attached":[{"mode":2,"prog":{"id":9,"name":"xdp_lb"}}]}}]"#;
    assert_eq!(
        bpf::plan_xdp(links),
        [
            ("eth0".to_string(), "xdpdrv"),
            ("veth1".into(), "xdpgeneric")
        ]
    );
    let filters = r#"[{"protocol":"all","pref":49152,"kind":"bpf","chain":0},
        {"protocol":"all","pref":49152,"kind":"bpf","chain":0,"options":{"handle":"0x1","bpf_name":"tc_from_pod","direct-action":true}},
        {"protocol":"all","pref":49153,"kind":"bpf","chain":0,"options":{"handle":"0x1","bpf_name":"cil_from_container"}}]"#;
    assert_eq!(bpf::plan_tc(filters), [49152]);

    let mut run = FakeRunner::default();
    run.on("ip", &["-d", "-j", "link", "show"], links).on(
        "tc",
        &["-j", "filter", "show", "dev", "veth1", "ingress"],
        filters,
    );
    let mut report = Report::default();
    bpf::detach(&mut run, &mut report);
    let lines = run.lines();
    assert!(
        lines.contains(&"ip link set dev eth0 xdpdrv off".to_string()),
        "{lines:#?}"
    );
    assert!(lines.contains(&"ip link set dev veth1 xdpgeneric off".to_string()));
    assert!(
        !lines.iter().any(|l| l.contains("dev eth1 xdp")),
        "not ours: {lines:#?}"
    );
    assert!(lines.contains(&"tc filter del dev veth1 ingress pref 49152".to_string()));
    assert_eq!(report.removed.len(), 3, "{:?}", report.removed);
}
