//! An experiment of the per-packet benchmark (`benches/ct_table.rs`, not
//! part of the product): what a new flow's two conntrack inserts cost in
//! the kernel's preallocated hash map (today's `CONNTRACK`) against
//! open-addressed tables in a plain array, whose lookups the verifier
//! inlines and whose entries sit in their own slot instead of behind a
//! bucket's list head: slots of two cache lines holding today's value
//! (`slots`), and of one line holding a value cut to fit (`lines`: no
//! cached next hop, no creation time).
//!
//! The programs do the same work for an IPv4 TCP packet: look up its
//! tuple; on a hit, DNAT to the entry's backend; on a miss, insert the
//! reply entry (backend -> client) and the forward entry (client ->
//! frontend) for a fixed backend, then DNAT. Checksums are left alone and
//! the verdict is XDP_TX: the table is what is compared.
#![no_std]
#![no_main]
// BPF's core has no atomic compare-and-swap method; the intrinsic lowers to
// the BPF_CMPXCHG instruction.
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{AtomicOrdering, atomic_cxchg};

use aya_ebpf::{
    bindings::{
        BPF_F_MMAPABLE, BPF_NOEXIST,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    macros::{map, xdp},
    maps::{Array, HashMap},
    programs::XdpContext,
};
use proxy_common::{CtKey, CtValue, conntrack::flags, proto};

const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const TCP_HLEN: usize = 20;

/// Entries of the hash map; the slot table has twice as many slots.
const ENTRIES: u32 = 262_144;
const SLOTS_MASK: u32 = 2 * ENTRIES - 1;
/// Slots a lookup probes (the home slot and those after it) before it
/// gives up: linear probing at the bench's 40% load needs up to about 20.
const PROBES: u32 = 32;

const BACKEND_BE: u32 = u32::from_be_bytes([198, 18, 1, 1]).to_be();
const BACKEND_PORT_BE: u16 = 8080u16.to_be();

#[map]
static CT_HTAB: HashMap<CtKey, CtValue> = HashMap::with_max_entries(ENTRIES, 0);

const EMPTY: u64 = 0;
const BUSY: u64 = 1;
const LIVE: u64 = 2;

/// One slot: its state (claimed with a compare-and-swap), the key and the
/// value.
#[repr(C)]
pub struct Slot<V> {
    state: u64,
    key: CtKey,
    value: V,
}

/// Today's value (64 bytes) in slots of two cache lines.
#[repr(C, align(64))]
pub struct WideSlot(Slot<CtValue>);

/// What a slot of one cache line leaves room for: the translation, the
/// flags, the backend and the idle clock, without the cached next hop and
/// the creation time.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CompactValue {
    nat_addr_be: u32,
    nat_port_be: u16,
    flags: u16,
    backend_id: u32,
    snat_addr_be: u32,
    snat_port_be: u16,
    _pad: u16,
    service_id: u32,
    last_seen_ns: u64,
    _spare: u64,
}

#[repr(C, align(64))]
pub struct LineSlot(Slot<CompactValue>);

const _: () = assert!(core::mem::size_of::<WideSlot>() == 128);
const _: () = assert!(core::mem::size_of::<LineSlot>() == 64);

// BPF_F_MMAPABLE: the kernel then starts the values on a page boundary, so
// every slot starts on a cache line.
#[map]
static CT_SLOTS: Array<WideSlot> = Array::with_max_entries(2 * ENTRIES, BPF_F_MMAPABLE);

#[map]
static CT_LINES: Array<LineSlot> = Array::with_max_entries(2 * ENTRIES, BPF_F_MMAPABLE);

#[xdp]
pub fn bench_ct_htab(ctx: XdpContext) -> u32 {
    run(&ctx, Table::Htab)
}

#[xdp]
pub fn bench_ct_slots(ctx: XdpContext) -> u32 {
    run(&ctx, Table::Slots)
}

#[xdp]
pub fn bench_ct_lines(ctx: XdpContext) -> u32 {
    run(&ctx, Table::Lines)
}

#[derive(Clone, Copy)]
enum Table {
    Htab,
    Slots,
    Lines,
}

#[inline(always)]
fn run(ctx: &XdpContext, table: Table) -> u32 {
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
        let saddr = (ip.add(12) as *const u32).read_unaligned();
        let daddr = ip.add(16) as *mut u32;
        let sport = (tcp as *const u16).read_unaligned();
        let dport = tcp.add(2) as *mut u16;
        let key = CtKey::new(
            saddr,
            daddr.read_unaligned(),
            sport,
            dport.read_unaligned(),
            proto::TCP,
        );
        let to = match table {
            Table::Htab => htab_flow(&key),
            Table::Slots => slots_flow(&CT_SLOTS, &key),
            Table::Lines => slots_flow(&CT_LINES, &key),
        };
        let Some((addr_be, port_be)) = to else {
            return XDP_DROP;
        };
        daddr.write_unaligned(addr_be);
        dport.write_unaligned(port_be);
    }
    XDP_TX
}

#[inline(always)]
fn value_for(key: &CtKey, reply: bool) -> CtValue {
    let mut value = CtValue::default();
    if reply {
        value.nat_addr_be = key.daddr_be;
        value.nat_port_be = key.dport_be;
        value.flags = flags::REPLY;
    } else {
        value.nat_addr_be = BACKEND_BE;
        value.nat_port_be = BACKEND_PORT_BE;
    }
    value.last_seen_ns = 1;
    value.created_ns = 1;
    value
}

#[inline(always)]
fn reply_key(key: &CtKey) -> CtKey {
    CtKey::new(
        BACKEND_BE,
        key.saddr_be,
        BACKEND_PORT_BE,
        key.sport_be,
        key.proto,
    )
}

#[inline(always)]
fn htab_flow(key: &CtKey) -> Option<(u32, u16)> {
    // SAFETY: values are plain data, read at once.
    if let Some(hit) = unsafe { CT_HTAB.get(key) } {
        return Some((hit.nat_addr_be, hit.nat_port_be));
    }
    let reply = reply_key(key);
    CT_HTAB
        .insert(&reply, &value_for(key, true), BPF_NOEXIST as u64)
        .ok()?;
    CT_HTAB
        .insert(key, &value_for(key, false), BPF_NOEXIST as u64)
        .ok()?;
    Some((BACKEND_BE, BACKEND_PORT_BE))
}

trait Entry: Sized {
    type Value: Copy;
    fn slot(&mut self) -> &mut Slot<Self::Value>;
    fn value(key: &CtKey, reply: bool) -> Self::Value;
    fn nat(value: &Self::Value) -> (u32, u16);
}

impl Entry for WideSlot {
    type Value = CtValue;
    #[inline(always)]
    fn slot(&mut self) -> &mut Slot<CtValue> {
        &mut self.0
    }
    #[inline(always)]
    fn value(key: &CtKey, reply: bool) -> CtValue {
        value_for(key, reply)
    }
    #[inline(always)]
    fn nat(value: &CtValue) -> (u32, u16) {
        (value.nat_addr_be, value.nat_port_be)
    }
}

impl Entry for LineSlot {
    type Value = CompactValue;
    #[inline(always)]
    fn slot(&mut self) -> &mut Slot<CompactValue> {
        &mut self.0
    }
    #[inline(always)]
    fn value(key: &CtKey, reply: bool) -> CompactValue {
        let wide = value_for(key, reply);
        CompactValue {
            nat_addr_be: wide.nat_addr_be,
            nat_port_be: wide.nat_port_be,
            flags: wide.flags,
            last_seen_ns: wide.last_seen_ns,
            ..CompactValue::default()
        }
    }
    #[inline(always)]
    fn nat(value: &CompactValue) -> (u32, u16) {
        (value.nat_addr_be, value.nat_port_be)
    }
}

/// The key's words mixed, then murmur3's 64-bit finaliser (not jhash: a
/// cheaper hash is part of what a slot table would buy).
#[inline(always)]
fn hash(key: &CtKey) -> u32 {
    let mut h = key.saddr_be as u64 | (key.daddr_be as u64) << 32;
    let ports = (key.sport_be as u64) << 16 | key.dport_be as u64 | (key.proto as u64) << 32;
    h ^= ports.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h as u32
}

#[inline(always)]
fn same(a: &CtKey, b: &CtKey) -> bool {
    a.saddr_be == b.saddr_be
        && a.daddr_be == b.daddr_be
        && a.sport_be == b.sport_be
        && a.dport_be == b.dport_be
        && a.proto == b.proto
}

enum Probe<E> {
    Hit(*mut E),
    /// The first free slot on the key's probe path.
    Free(*mut E),
    Full,
}

#[inline(always)]
fn probe<E: Entry>(table: &Array<E>, key: &CtKey) -> Probe<E> {
    let home = hash(key);
    for i in 0..PROBES {
        let Some(entry) = table.get_ptr_mut((home.wrapping_add(i)) & SLOTS_MASK) else {
            return Probe::Full;
        };
        // SAFETY: a pointer into the array's value, valid for this run.
        let s = unsafe { (*entry).slot() };
        // SAFETY: an aligned word of the slot.
        let state = unsafe { (&raw const s.state).read_volatile() };
        if state == EMPTY {
            return Probe::Free(entry);
        }
        if state == LIVE && same(&s.key, key) {
            return Probe::Hit(entry);
        }
    }
    Probe::Full
}

#[inline(always)]
fn claim<E: Entry>(entry: *mut E, key: &CtKey, value: E::Value) -> bool {
    // SAFETY: a pointer into the array's value, valid for this run.
    unsafe {
        let slot = (*entry).slot();
        let state = &raw mut slot.state;
        let (_, claimed) =
            atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Relaxed }>(
                state, EMPTY, BUSY,
            );
        if !claimed {
            return false;
        }
        slot.key = *key;
        slot.value = value;
        // The JIT keeps stores in order (x86 keeps them so too).
        state.write_volatile(LIVE);
    }
    true
}

#[inline(always)]
fn slots_flow<E: Entry>(table: &Array<E>, key: &CtKey) -> Option<(u32, u16)> {
    match probe(table, key) {
        // SAFETY: as in `probe`.
        Probe::Hit(entry) => return Some(E::nat(unsafe { &(*entry).slot().value })),
        Probe::Free(_) => {}
        Probe::Full => return None,
    }
    // The forward slot is looked for again after the reply's claim: the
    // reply may have taken the one the lookup found (the line is warm now).
    let reply = reply_key(key);
    for (key, value) in [(&reply, E::value(key, true)), (key, E::value(key, false))] {
        match probe(table, key) {
            Probe::Free(entry) if claim(entry, key, value) => {}
            _ => return None,
        }
    }
    Some((BACKEND_BE, BACKEND_PORT_BE))
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
