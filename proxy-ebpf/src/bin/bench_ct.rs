//! An experiment of the per-packet benchmark (`benches/ct_table.rs`, not
//! part of the product): what a new flow's two conntrack inserts cost in
//! the kernel's preallocated hash map (today's `CONNTRACK`) against
//! open-addressed tables in a plain array, whose lookups the verifier
//! inlines and whose entries sit in their own slot instead of behind a
//! bucket's list head: slots of two cache lines holding today's value
//! (`slots`), and of one line (`lines`: the proposed table,
//! `proxy_common::ct_table`, through `ct_slots`).
//!
//! The programs do the same work for a TCP packet: look up its tuple; on a
//! hit, DNAT to the entry's backend; on a miss, insert the reply entry
//! (backend -> client) and the forward entry (client -> frontend) for a
//! fixed backend, then DNAT. Checksums are left alone and the verdict is
//! XDP_TX: the table is what is compared. Each table has an IPv4 and an
//! IPv6 program (`…6`, the IPv6 tables and slots).
#![no_std]
#![no_main]
// For `ct_slots` (BPF's core has no atomic compare-and-swap method; the
// intrinsic lowers to the BPF_CMPXCHG instruction).
#![feature(core_intrinsics)]
#![allow(internal_features)]

#[path = "../ct_slots.rs"]
#[allow(dead_code)]
mod ct_slots;

use aya_ebpf::{
    bindings::{
        BPF_F_MMAPABLE, BPF_NOEXIST,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    macros::{map, xdp},
    maps::{Array, HashMap},
    programs::XdpContext,
};
use ct_slots::{Probe, Slot};
use proxy_common::{
    CtKey, CtKey6, CtKeyOf, CtValue, CtValue6, CtValueOf, V4, V6,
    conntrack::flags,
    ct_table::{
        CtSlot, CtSlot6, CtSlotOf, CtSlotValueOf, CtWideSlot, CtWideSlot6, CtWideSlotOf, SlotFamily,
    },
    proto,
};

const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_HLEN: usize = 20;

/// Entries of the hash maps; the slot tables have twice as many slots.
const ENTRIES: u32 = 262_144;
const SLOTS: u32 = 2 * ENTRIES;
const BACKEND_PORT_BE: u16 = 8080u16.to_be();

#[map]
static CT_HTAB: HashMap<CtKey, CtValue> = HashMap::with_max_entries(ENTRIES, 0);
#[map]
static CT_HTAB6: HashMap<CtKey6, CtValue6> = HashMap::with_max_entries(ENTRIES, 0);

/// Today's value in slots of two cache lines (three for IPv6):
/// `proxy_common::ct_table`'s wide slots. `BPF_F_MMAPABLE`: the kernel
/// then starts the values on a page boundary, so every slot starts on a
/// cache line.
#[map]
static CT_SLOTS: Array<CtWideSlot> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);
#[map]
static CT_SLOTS6: Array<CtWideSlot6> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);

/// The proposed table: `proxy_common::ct_table`'s slots of one line (two
/// for IPv6).
#[map]
static CT_LINES: Array<CtSlot> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);
#[map]
static CT_LINES6: Array<CtSlot6> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);

/// A family's three tables and the backend every flow goes to.
trait Tables: SlotFamily {
    const BACKEND: Self::Addr;
    fn htab() -> &'static HashMap<CtKeyOf<Self>, CtValueOf<Self>>;
    fn slots() -> &'static Array<CtWideSlotOf<Self>>;
    fn lines() -> &'static Array<CtSlotOf<Self>>;
}

impl Tables for V4 {
    const BACKEND: u32 = u32::from_be_bytes([198, 18, 1, 1]).to_be();
    fn htab() -> &'static HashMap<CtKey, CtValue> {
        &CT_HTAB
    }
    fn slots() -> &'static Array<CtWideSlot> {
        &CT_SLOTS
    }
    fn lines() -> &'static Array<CtSlot> {
        &CT_LINES
    }
}

impl Tables for V6 {
    /// 2001:db8:1::1
    const BACKEND: [u32; 4] = [
        0x2001_0db8u32.to_be(),
        0x0001_0000u32.to_be(),
        0,
        1u32.to_be(),
    ];
    fn htab() -> &'static HashMap<CtKey6, CtValue6> {
        &CT_HTAB6
    }
    fn slots() -> &'static Array<CtWideSlot6> {
        &CT_SLOTS6
    }
    fn lines() -> &'static Array<CtSlot6> {
        &CT_LINES6
    }
}

#[xdp]
pub fn bench_ct_htab(ctx: XdpContext) -> u32 {
    run4(&ctx, Table::Htab)
}

#[xdp]
pub fn bench_ct_slots(ctx: XdpContext) -> u32 {
    run4(&ctx, Table::Slots)
}

#[xdp]
pub fn bench_ct_lines(ctx: XdpContext) -> u32 {
    run4(&ctx, Table::Lines)
}

#[xdp]
pub fn bench_ct_htab6(ctx: XdpContext) -> u32 {
    run6(&ctx, Table::Htab)
}

#[xdp]
pub fn bench_ct_slots6(ctx: XdpContext) -> u32 {
    run6(&ctx, Table::Slots)
}

#[xdp]
pub fn bench_ct_lines6(ctx: XdpContext) -> u32 {
    run6(&ctx, Table::Lines)
}

#[derive(Clone, Copy)]
enum Table {
    Htab,
    Slots,
    Lines,
}

#[inline(always)]
fn flow<F: Tables>(table: Table, key: &CtKeyOf<F>) -> Option<(F::Addr, u16)> {
    match table {
        Table::Htab => htab_flow::<F>(key),
        Table::Slots => slots_flow(F::slots(), key),
        Table::Lines => slots_flow(F::lines(), key),
    }
}

#[inline(always)]
fn run4(ctx: &XdpContext, table: Table) -> u32 {
    let data = ctx.data();
    if data + ETH_HLEN + IPV4_HLEN + TCP_HLEN > ctx.data_end() {
        return XDP_PASS;
    }
    // SAFETY: the whole of Ethernet + IPv4 + TCP headers was bounds-checked above.
    unsafe {
        let ip = (data as *mut u8).add(ETH_HLEN);
        if *ip != 0x45 || *ip.add(9) != proto::TCP {
            return XDP_PASS;
        }
        let tcp = ip.add(IPV4_HLEN);
        let daddr = ip.add(16) as *mut u32;
        let dport = tcp.add(2) as *mut u16;
        let key = CtKey::new(
            (ip.add(12) as *const u32).read_unaligned(),
            daddr.read_unaligned(),
            (tcp as *const u16).read_unaligned(),
            dport.read_unaligned(),
            proto::TCP,
        );
        let Some((addr_be, port_be)) = flow::<V4>(table, &key) else {
            return XDP_DROP;
        };
        daddr.write_unaligned(addr_be);
        dport.write_unaligned(port_be);
    }
    XDP_TX
}

#[inline(always)]
fn run6(ctx: &XdpContext, table: Table) -> u32 {
    let data = ctx.data();
    if data + ETH_HLEN + IPV6_HLEN + TCP_HLEN > ctx.data_end() {
        return XDP_PASS;
    }
    // SAFETY: the whole of Ethernet + IPv6 + TCP headers was bounds-checked above.
    unsafe {
        let ip = (data as *mut u8).add(ETH_HLEN);
        if *ip >> 4 != 6 || *ip.add(6) != proto::TCP {
            return XDP_PASS;
        }
        let tcp = ip.add(IPV6_HLEN);
        let daddr = ip.add(24) as *mut [u32; 4];
        let dport = tcp.add(2) as *mut u16;
        let key = CtKey6::new(
            (ip.add(8) as *const [u32; 4]).read_unaligned(),
            daddr.read_unaligned(),
            (tcp as *const u16).read_unaligned(),
            dport.read_unaligned(),
            proto::TCP,
        );
        let Some((addr_be, port_be)) = flow::<V6>(table, &key) else {
            return XDP_DROP;
        };
        daddr.write_unaligned(addr_be);
        dport.write_unaligned(port_be);
    }
    XDP_TX
}

#[inline(always)]
fn value_for<F: Tables>(key: &CtKeyOf<F>, reply: bool) -> CtValueOf<F> {
    let mut value = CtValueOf::<F>::default();
    if reply {
        value.nat_addr_be = key.daddr_be;
        value.nat_port_be = key.dport_be;
        value.flags = flags::REPLY;
    } else {
        value.nat_addr_be = F::BACKEND;
        value.nat_port_be = BACKEND_PORT_BE;
    }
    value.last_seen_ns = 1;
    value.created_ns = 1;
    value
}

#[inline(always)]
fn reply_key<F: Tables>(key: &CtKeyOf<F>) -> CtKeyOf<F> {
    CtKeyOf::new(
        F::BACKEND,
        key.saddr_be,
        BACKEND_PORT_BE,
        key.sport_be,
        key.proto,
    )
}

#[inline(always)]
fn htab_flow<F: Tables>(key: &CtKeyOf<F>) -> Option<(F::Addr, u16)> {
    // SAFETY: values are plain data, read at once.
    if let Some(hit) = unsafe { F::htab().get(key) } {
        return Some((hit.nat_addr_be, hit.nat_port_be));
    }
    let reply = reply_key(key);
    F::htab()
        .insert(&reply, &value_for(key, true), BPF_NOEXIST as u64)
        .ok()?;
    F::htab()
        .insert(key, &value_for(key, false), BPF_NOEXIST as u64)
        .ok()?;
    Some((F::BACKEND, BACKEND_PORT_BE))
}

/// A slot the bench fills: a flow's forward or reply entry, and the
/// address and port a hit translates to.
trait BenchSlot<F: Tables>: Slot<F> {
    fn fill(&mut self, key: &CtKeyOf<F>, reply: bool);
    fn nat(&self) -> (F::Addr, u16);
}

impl<F: Tables> BenchSlot<F> for CtWideSlotOf<F> {
    #[inline(always)]
    fn fill(&mut self, key: &CtKeyOf<F>, reply: bool) {
        self.value = value_for(key, reply);
    }
    #[inline(always)]
    fn nat(&self) -> (F::Addr, u16) {
        (self.value.nat_addr_be, self.value.nat_port_be)
    }
}

impl<F: Tables> BenchSlot<F> for CtSlotOf<F> {
    #[inline(always)]
    fn fill(&mut self, key: &CtKeyOf<F>, reply: bool) {
        let wide = value_for(key, reply);
        self.value = CtSlotValueOf {
            nat_addr_be: wide.nat_addr_be,
            nat_port_be: wide.nat_port_be,
            flags: wide.flags,
            last_seen_ns: wide.last_seen_ns,
            created_s: 1,
            ..CtSlotValueOf::default()
        };
    }
    #[inline(always)]
    fn nat(&self) -> (F::Addr, u16) {
        (self.value.nat_addr_be, self.value.nat_port_be)
    }
}

#[inline(always)]
fn slots_flow<F: Tables, S: BenchSlot<F>>(
    table: &Array<S>,
    key: &CtKeyOf<F>,
) -> Option<(F::Addr, u16)> {
    match ct_slots::probe(table, SLOTS - 1, key) {
        // SAFETY: a pointer into the array's value, valid for this run.
        Probe::Hit(slot) => return Some(unsafe { &*slot }.nat()),
        Probe::Free(..) => {}
        Probe::Full => return None,
    }
    // The forward slot is looked for again after the reply's claim: the
    // reply may have taken the one the lookup found (the line is warm now).
    let reply = reply_key(key);
    for (entry, is_reply) in [(&reply, true), (key, false)] {
        match ct_slots::probe(table, SLOTS - 1, entry) {
            Probe::Free(slot, seen)
                if ct_slots::claim(slot, seen, entry, |s: &mut S| s.fill(key, is_reply)) => {}
            _ => return None,
        }
    }
    Some((F::BACKEND, BACKEND_PORT_BE))
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
