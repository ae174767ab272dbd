//! The next-hop cache by destination (`HOPS`, `HOPS6`): where the FIB sent
//! the last forwarded packet to an address that arrived on an interface. A
//! flow's own conntrack entry caches its hop once the flow exists
//! (`conntrack::HopCache`); this cache serves a flow's first packets, so
//! that a new flow to a known destination does not ask the FIB.
//!
//! An answer is shared between flows only while it cannot depend on what
//! else they carry: while the agent says the family's routing is by
//! destination and input interface alone (`ROUTES_BY_DESTINATION*`: no
//! rule by source, ports or protocol, no source-specific or multipath route).
//!
//! Per CPU and direct-mapped: a destination has one slot, which another
//! destination hashing there takes over. Looking it up touches one cache
//! line and needs no lock, and no other CPU ever writes it half-way under a
//! reader (a shared table would have to: LRU hash maps cost more on a miss
//! than the FIB lookup they save when destinations are many).

use proxy_common::{Family, conntrack::NextHop};

use crate::ip::Ip;

/// Slots per CPU and family (a power of two). Few on purpose: 256 slots
/// (10 KiB for IPv4) stay in the CPU's cache, so a miss costs little more
/// than the FIB lookup it falls back to. With 4,096 (160 KiB), a new flow to
/// one of 3,000 destinations took 8–21% longer than with 256, its slot as
/// cold as the entries around it (docs/datapath.md, "What a new flow costs").
pub const SLOT_BITS: u32 = 8;
pub const SLOTS: u32 = 1 << SLOT_BITS;

/// How long a slot's answer is used before the FIB is asked again: route and
/// neighbour changes reach new flows within this, as they reach a flow's
/// own cache at its once-a-second refresh (which asks the FIB, not a slot).
const REFRESH_NS: u64 = proxy_common::conntrack::REFRESH_INTERVAL_NS;

#[repr(C)]
pub struct HopSlot<F: Family> {
    pub daddr_be: F::Addr,
    pub in_ifindex: u32,
    /// When the FIB gave the answer; 0: never.
    pub checked_ns: u64,
    pub hop: NextHop,
}

/// The slot of `daddr_be` arriving on `in_ifindex`, on this CPU.
#[inline(always)]
fn slot<F: Ip>(daddr_be: &F::Addr, in_ifindex: u32) -> Option<&'static mut HopSlot<F>> {
    let mut hash = in_ifindex;
    for word in F::addr_words(daddr_be) {
        hash = (hash ^ word).wrapping_mul(0x9e37_79b1);
    }
    let at = F::hops().get_ptr_mut(hash >> (32 - SLOT_BITS))?;
    // SAFETY: per-CPU memory, and a program run is never preempted by another on its CPU.
    Some(unsafe { &mut *at })
}

/// The cached next hop of a packet of `len` bytes (IP total length) to
/// `daddr_be` that arrived on `in_ifindex`, if it is fresh at `now`.
#[inline(always)]
pub fn get<F: Ip>(daddr_be: &F::Addr, in_ifindex: u32, len: u16, now: u64) -> Option<NextHop> {
    let slot = slot::<F>(daddr_be, in_ifindex)?;
    (slot.checked_ns != 0
        && slot.daddr_be == *daddr_be
        && slot.in_ifindex == in_ifindex
        && slot.hop.fits_len >= len
        && now.saturating_sub(slot.checked_ns) <= REFRESH_NS)
        .then_some(slot.hop)
}

/// Records the FIB's answer `hop` for `daddr_be`, asked at `now`.
#[inline(always)]
pub fn set<F: Ip>(daddr_be: &F::Addr, hop: &NextHop, now: u64) {
    let Some(slot) = slot::<F>(daddr_be, hop.in_ifindex) else {
        return;
    };
    crate::mem::copy(&mut slot.daddr_be, daddr_be);
    slot.in_ifindex = hop.in_ifindex;
    slot.checked_ns = now;
    crate::mem::copy(&mut slot.hop, hop);
}
