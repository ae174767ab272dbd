//! The ipvs mode's proxier on a kernel without IPVS or dummy interfaces:
//! the ipsets and the companion iptables rules are written for real (ipset
//! and iptables in a private network namespace), IPVS is the stand-in that
//! decodes the proxier's netlink requests as the kernel would (`fake`), and
//! `kube-ipvs0` an in-memory list of addresses. Needs root.

use std::{
    collections::BTreeSet,
    io,
    net::IpAddr,
    process::Command,
    sync::{Arc, Mutex},
};

use proxy_agent::{
    model::{DesiredService, DesiredState, Endpoint, Protocol, ServicePortName},
    modes::{
        detect_local::DetectLocal,
        iptables::IptablesBackend,
        ipvs::{
            cleanup::GenlTransport,
            dummy::DummyDevice,
            fake::FakeIpvs,
            messages::{
                self, IPVS_CMD_DEL_DEST, IPVS_CMD_NEW_DEST, IPVS_CMD_NEW_SERVICE, IPVS_CMD_SET_DEST,
            },
            proxier::IpvsProxier,
            virtual_servers::{Frontend, RealServer, VirtualServer},
        },
        nftables::proxier::NftSettings,
    },
    sync::{Proxier, SyncChanges},
};

#[derive(Clone, Default)]
struct SharedIpvs(Arc<Mutex<FakeIpvs>>);

impl GenlTransport for SharedIpvs {
    fn request(&mut self, msg: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.0.lock().unwrap().request(msg)
    }
}

#[derive(Clone, Default)]
struct Addresses(Arc<Mutex<BTreeSet<IpAddr>>>);

impl DummyDevice for Addresses {
    fn ensure(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn addresses(&mut self) -> io::Result<BTreeSet<IpAddr>> {
        Ok(self.0.lock().unwrap().clone())
    }
    fn bind(&mut self, ip: IpAddr) -> io::Result<()> {
        self.0.lock().unwrap().insert(ip);
        Ok(())
    }
    fn unbind(&mut self, ip: IpAddr) -> io::Result<()> {
        self.0.lock().unwrap().remove(&ip);
        Ok(())
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn state(endpoints: &[&str]) -> DesiredState {
    let spn = ServicePortName {
        namespace: "ns1".into(),
        name: "web".into(),
        port_name: "p80".into(),
        protocol: Protocol::Tcp,
    };
    let web = DesiredService {
        node_port: Some(30080),
        ..DesiredService::cluster_ip(
            spn,
            vec!["198.19.0.10".parse().unwrap()],
            80,
            endpoints
                .iter()
                .map(|e| Endpoint::new(e.parse().unwrap(), 8080))
                .collect(),
        )
    };
    let mut s = DesiredState::default();
    s.services.insert(web.name.clone(), web);
    s.node.node_port_addresses = vec!["198.18.100.1".parse().unwrap()];
    s
}

/// Byte for byte, but for the sequence number.
fn same_but_sequence(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a[..8] == b[..8] && a[12..] == b[12..]
}

fn cmds(ipvs: &SharedIpvs) -> Vec<u8> {
    let mut fake = ipvs.0.lock().unwrap();
    let out = fake
        .requests
        .iter()
        .map(|m| m[16])
        .filter(|c| *c != 4 && *c != 8)
        .collect();
    fake.requests.clear();
    out
}

#[test]
fn ipvs_proxier_programs_ipsets_iptables_and_virtual_servers() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; ipset and iptables run as its children.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let ipvs = SharedIpvs(Arc::new(Mutex::new(FakeIpvs::new(0x25))));
        let dummy = Addresses::default();
        let settings = NftSettings {
            masquerade_mark: 1 << 14,
            masquerade_all: false,
            detect_local: DetectLocal::ClusterCidr(vec!["198.18.0.0/16".parse().unwrap()]),
            node_ports_everywhere: true,
            localhost_node_ports: true,
        };
        let mut proxier = IpvsProxier::new(
            settings,
            "",
            Box::new(ipvs.clone()),
            0x25,
            Box::new(dummy.clone()),
            IptablesBackend::Nft,
        );
        let full = SyncChanges {
            full: true,
            ..Default::default()
        };
        proxier.sync(&state(&["198.18.2.10", "198.18.2.11"]), &full).expect("the first sync");

        // IPVS: the cluster IP and the NodePort, each with both endpoints,
        // sent as upstream's libipvs sends them.
        let vip = VirtualServer {
            address: "198.19.0.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            frontend: Frontend::ClusterIp,
            scheduler: "rr".into(),
            persistence_s: None,
            reals: Vec::new(),
        };
        let requests = ipvs.0.lock().unwrap().requests.clone();
        assert!(requests.iter().any(|r| same_but_sequence(r, &messages::service_request(0x25, 0, IPVS_CMD_NEW_SERVICE, &vip))));
        let real = RealServer {
            address: "198.18.2.11:8080".parse().unwrap(),
            weight: 1,
        };
        assert!(requests.iter().any(|r| same_but_sequence(r, &messages::dest_request(0x25, 0, IPVS_CMD_NEW_DEST, &vip, &real))));
        assert_eq!(cmds(&ipvs), vec![1, 5, 5, 1, 5, 5], "two services, two destinations each");
        {
            let fake = ipvs.0.lock().unwrap();
            let keys: Vec<_> = fake.services.keys().map(|(a, p, _)| format!("{a}:{p}")).collect();
            assert_eq!(keys, ["198.18.100.1:30080", "198.19.0.10:80"]);
        }
        assert_eq!(*dummy.0.lock().unwrap(), ["198.19.0.10".parse().unwrap()].into());

        // The ipsets and the rules that match them, in the kernel.
        let sets = run("ipset", &["save"]);
        for want in [
            "add KUBE-CLUSTER-IP 198.19.0.10,tcp:80",
            "add KUBE-NODE-PORT-TCP 30080",
            "add KUBE-IPVS-IPS 198.19.0.10",
            "create KUBE-6-CLUSTER-IP hash:ip,port family inet6",
        ] {
            assert!(sets.contains(want), "{want:?} missing from\n{sets}");
        }
        let nat = run("iptables-nft-save", &["-t", "nat"]);
        for want in [
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-A KUBE-SERVICES ! -s 198.18.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
            "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
        ] {
            assert!(nat.contains(want), "{want:?} missing from\n{nat}");
        }
        let filter = run("iptables-nft-save", &["-t", "filter"]);
        assert!(filter.contains("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT"), "{filter}");

        // An endpoint leaves while it has connections: it drains at weight
        // 0, then goes once they are gone.
        ipvs.0.lock().unwrap().set_connections(
            "198.19.0.10".parse().unwrap(),
            80,
            Protocol::Tcp,
            "198.18.2.11:8080".parse().unwrap(),
            2,
        );
        let fewer = state(&["198.18.2.10"]);
        proxier.sync(&fewer, &full).expect("a sync without .11");
        // The cluster IP's drains; the NodePort's had no connections.
        assert_eq!(cmds(&ipvs), vec![IPVS_CMD_SET_DEST, IPVS_CMD_DEL_DEST]);
        ipvs.0.lock().unwrap().set_connections(
            "198.19.0.10".parse().unwrap(),
            80,
            Protocol::Tcp,
            "198.18.2.11:8080".parse().unwrap(),
            0,
        );
        proxier.sync(&fewer, &full).expect("a sync once drained");
        assert_eq!(cmds(&ipvs), vec![IPVS_CMD_DEL_DEST]);

        // The service goes: its virtual servers, set entries and address too.
        let mut none = fewer.clone();
        none.services.clear();
        proxier.sync(&none, &full).expect("a sync without services");
        assert_eq!(cmds(&ipvs), vec![3, 3]);
        assert!(ipvs.0.lock().unwrap().services.is_empty());
        assert!(dummy.0.lock().unwrap().is_empty());
        let sets = run("ipset", &["save"]);
        assert!(!sets.contains("add KUBE-CLUSTER-IP"), "{sets}");
    })
    .join()
    .unwrap();
}

/// On a kernel without IPVS the agent stops at once with upstream's reason.
#[test]
fn without_ipvs_the_agent_exits_with_upstreams_error() {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this thread; the agent runs as its child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/demo");
        // `timeout`: on a kernel with IPVS the agent would run on (and this fail).
        let out = Command::new("timeout")
            .arg("30")
            .arg(env!("CARGO_BIN_EXE_proxy-agent"))
            .args([
                "--proxy-mode",
                "ipvs",
                "--hostname-override",
                "node-a",
                "--manifests",
                demo,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("can't use the IPVS proxier: Ipvs not supported by the kernel"),
            "{err}"
        );
    })
    .join()
    .unwrap();
}
