//! The per-packet floor of the datapath benchmark (issue 14): the least any
//! service datapath must do for a packet to a service, so that the ratio of
//! each of our paths to it holds across machines. One hash lookup of the
//! destination (a `ServiceKey`, as ours), the destination address and port
//! rewritten with both checksums updated incrementally, the MAC addresses
//! swapped and `XDP_TX`. No conntrack, no backend choice, no FIB lookup, no
//! counters; anything that is not IPv4 TCP with a 20-byte header, or whose
//! destination is not in the map, passes.
//!
//! Not part of the product: the benchmark loads it from its own object.
#![no_std]
#![no_main]

#[path = "../csum.rs"]
#[allow(dead_code)]
mod csum;

use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_TX},
    macros::{map, xdp},
    maps::HashMap,
    programs::XdpContext,
};
use proxy_common::{Backend, ServiceKey, proto};

const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const TCP_HLEN: usize = 20;

/// Destination (slot 0, primary scope) -> the address and port it becomes.
#[map]
static FLOOR: HashMap<ServiceKey, Backend> = HashMap::with_max_entries(262_144, 0);

#[xdp]
pub fn bench_floor(ctx: XdpContext) -> u32 {
    floor(&ctx).unwrap_or(XDP_PASS)
}

#[inline(always)]
fn floor(ctx: &XdpContext) -> Option<u32> {
    let data = ctx.data();
    if data + ETH_HLEN + IPV4_HLEN + TCP_HLEN > ctx.data_end() {
        return None;
    }
    // SAFETY: the whole of Ethernet + IPv4 + TCP headers was bounds-checked above.
    unsafe {
        let eth = data as *mut u8;
        if *(eth.add(12) as *const u16) != 0x0800u16.to_be() {
            return None;
        }
        let ip = eth.add(ETH_HLEN);
        if *ip != 0x45 || *ip.add(9) != proto::TCP {
            return None;
        }
        let tcp = ip.add(IPV4_HLEN);
        let daddr = ip.add(16) as *mut u32;
        let dport = tcp.add(2) as *mut u16;
        let key = ServiceKey {
            addr_be: daddr.read_unaligned(),
            port_be: dport.read_unaligned(),
            slot: 0,
            proto: proto::TCP,
            scope: 0,
            _pad: [0; 2],
        };
        let to = FLOOR.get(&key)?;
        let ip_check = ip.add(10) as *mut u16;
        let tcp_check = tcp.add(16) as *mut u16;
        let (old_addr, old_port) = (key.addr_be, key.port_be);
        ip_check.write_unaligned(csum::replace4(
            ip_check.read_unaligned(),
            old_addr,
            to.addr_be,
        ));
        let check = csum::replace4(tcp_check.read_unaligned(), old_addr, to.addr_be);
        tcp_check.write_unaligned(csum::replace2(check, old_port, to.port_be));
        daddr.write_unaligned(to.addr_be);
        dport.write_unaligned(to.port_be);
        let macs = eth as *mut [u8; 6];
        let (dst, src) = (macs.read_unaligned(), macs.add(1).read_unaligned());
        macs.write_unaligned(src);
        macs.add(1).write_unaligned(dst);
    }
    Some(XDP_TX)
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
