//! The node and the programs: a namespace of the test's thread, the real
//! object, its maps programmed by the agent's own programmers.

use std::net::IpAddr;

use aya::Ebpf;
use proxy_agent::{
    model::DesiredState,
    modes::ebpf::{
        self, KernelMaps, MapSizes, NodeProgrammer, Programmer,
        test_run::{self, Hook, Outcome},
    },
};

use super::{
    family::{EXT_MAC, Fam, POD_MAC},
    world::Spec,
};
use crate::tester::{ifindex, ip, mac_str};

pub const HOUR_NS: u64 = 3_600_000_000_000;

/// Moves this test's thread into a fresh network namespace (gone with the
/// thread): ext0 on the lan, pod0 towards this node's pods, addressed in
/// `F`'s family. Returns their ifindexes.
fn private_node_namespace<F: Fam>() -> (u32, u32) {
    // SAFETY: unshare affects only this thread; child processes inherit it.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip("link set lo up");
    // /proc/sys/net follows the reading thread's namespace; without
    // forwarding the FIB helper answers "forwarding disabled".
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1").unwrap();
    let net = &F::NET;
    // IPv6: no duplicate address detection, so the address is usable at once.
    let node: IpAddr = net.node.into();
    let nodad = if node.is_ipv6() { " nodad" } else { "" };
    for (dev, peer, mac, addr) in [
        ("ext0", "lan0", EXT_MAC, net.node),
        ("pod0", "pods0", POD_MAC, net.pod_gw),
    ] {
        ip(&format!(
            "link add {dev} address {} type veth peer name {peer}",
            mac_str(mac)
        ));
        ip(&format!("link set {peer} up"));
        ip(&format!("link set {dev} up"));
        ip(&format!("addr add {addr}/{} dev {dev}{nodad}", net.prefix));
    }
    for (addr, mac, pod_side) in net.neighbours() {
        let dev = if pod_side { "pod0" } else { "ext0" };
        ip(&format!(
            "neigh add {addr} lladdr {} dev {dev} nud permanent",
            mac_str(mac)
        ));
    }
    ip(&format!(
        "route add {} via {} dev ext0",
        net.remote_pods, net.peer_node
    ));
    (ifindex("ext0"), ifindex("pod0"))
}

pub struct Fixture {
    ebpf: Ebpf,
    _maps: KernelMaps,
    ext: u32,
    pod: u32,
}

impl Fixture {
    pub fn new<F: Fam>(conntrack: u32, specs: &[Spec<F::Addr>]) -> Self {
        let (ext, pod) = private_node_namespace::<F>();
        let sizes = MapSizes {
            services: 4096,
            backends: 4096,
            conntrack,
            ..MapSizes::default()
        };
        let mut ebpf = ebpf::load_with(sizes).expect("load the eBPF object (are we root?)");
        let (mut maps, _stats) = KernelMaps::take(&mut ebpf).unwrap();
        let facts = F::facts(ext, pod);
        NodeProgrammer::new().apply(&facts, &mut maps).unwrap();
        let state = DesiredState {
            services: specs
                .iter()
                .map(|s| {
                    let d = s.desired();
                    (d.name.clone(), d)
                })
                .collect(),
            ..DesiredState::default()
        };
        let mut programmer = Programmer::new();
        programmer
            .set_node_addresses(&facts.addresses, &facts.addresses6, &state, &mut maps)
            .unwrap();
        programmer.sync(&state, &mut maps).unwrap();
        Fixture {
            ebpf,
            _maps: maps,
            ext,
            pod,
        }
    }

    pub fn run(&self, hook: Hook, pkt: &[u8]) -> anyhow::Result<Outcome> {
        let ifindex = if hook == Hook::FromPod {
            self.pod
        } else {
            self.ext
        };
        test_run::run(&self.ebpf, hook, pkt, ifindex, 1)
    }
}
