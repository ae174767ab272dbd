//! Flow state: which backend a flow uses and how to reverse-translate replies.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
};
use proxy_common::{
    Counter, CtDirection, CtKeyOf, CtValueOf, DatapathConfig, V6,
    conntrack::NextHop,
    conntrack::{REFRESH_INTERVAL_NS, flags, idle_timeout},
};

use crate::ip::Ip;

/// CLOCK_MONOTONIC at the last tick: every timer here counts seconds, and
/// the coarse clock costs a fraction of reading the clock source. It moves
/// only at a tick, so each CPU keeps its last reading (in its scratch
/// memory) with the tick it was taken at, and asks the kernel again only
/// once the tick count (jiffies, which the verifier turns into one load)
/// has moved: the helper call and the timekeeper's cache lines cost an
/// established packet an eighth of its time here (BPF_PROG_TEST_RUN, one
/// run per call). A reading taken as a tick lands may be a tick old until
/// the next.
#[inline(always)]
pub fn now_ns<F: Ip>() -> u64 {
    // SAFETY: helper without preconditions.
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(scratch) = F::scratch() else {
        return coarse_ns();
    };
    let cache = &mut scratch.clock;
    if cache.jiffies != jiffies || cache.ns == 0 {
        cache.ns = coarse_ns();
        cache.jiffies = jiffies;
    }
    cache.ns
}

/// [`now_ns`] for IPv6, a function of its own (a BPF-to-BPF call).
#[inline(never)]
pub fn now_ns6() -> u64 {
    now_ns::<V6>()
}

#[inline(always)]
pub fn coarse_ns() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// One CPU's last coarse-clock reading, and the tick it was taken at.
#[repr(C)]
pub struct TickClock {
    jiffies: u64,
    ns: u64,
}

/// The time of one packet, read from the kernel's clock only when first
/// asked: a packet that touches no flow (most pass-through traffic) never
/// pays for the helper call.
pub struct Clock(core::cell::Cell<u64>);

impl Clock {
    /// A clock not read yet.
    #[inline(always)]
    pub fn lazy() -> Self {
        Clock(core::cell::Cell::new(0))
    }

    /// A clock already read at `now`.
    #[inline(always)]
    pub fn at(now: u64) -> Self {
        Clock(core::cell::Cell::new(now))
    }

    #[inline(always)]
    pub fn now<F: Ip>(&self) -> u64 {
        if self.0.get() == 0 {
            self.0.set(F::now_ns());
        }
        self.0.get()
    }
}

/// A live entry, in place in the map (this packet's flags recorded).
pub struct Hit<F: Ip> {
    pub value: &'static CtValueOf<F>,
    /// Which half of its flow the entry is.
    pub direction: CtDirection,
    /// Flags this packet set that the entry did not have.
    pub new_flags: u16,
    /// The idle timer was refreshed (at most once a second per entry).
    pub refreshed: bool,
    /// The entry's next-hop cache.
    pub hop: HopCache,
}

/// A live entry's next-hop cache ([`NextHop`]), for the packet that found
/// it. Two CPUs may write it at once only when the FIB is asked again (once
/// a second); a packet reading that moment's half-written hop is the worst case.
#[derive(Clone, Copy)]
pub struct HopCache {
    at: *mut NextHop,
    /// The entry's refresh is due: ask the FIB again.
    stale: bool,
}

impl HopCache {
    /// The cached hop for a packet of `len` bytes (IP total length) that
    /// arrived on `ifindex`.
    #[inline(always)]
    pub fn get(&self, ifindex: u32, len: u16) -> Option<&'static NextHop> {
        if self.stale {
            return None;
        }
        // SAFETY: points into a map value, valid for this program run.
        let hop = unsafe { &*self.at };
        (hop.fits_len != 0 && hop.in_ifindex == ifindex && len <= hop.fits_len).then_some(hop)
    }

    /// The entry's once-a-second refresh is due: its packet asks the FIB.
    #[inline(always)]
    pub fn refresh_due(&self) -> bool {
        self.stale
    }

    /// Records the FIB's answer `found` for a packet of `len` bytes from
    /// `in_ifindex` (its `in_ifindex` and `fits_len` are this packet's).
    #[inline(always)]
    pub fn set(&self, in_ifindex: u32, len: u16, found: &NextHop) {
        // SAFETY: points into a map value, valid for this program run.
        let hop = unsafe { &mut *self.at };
        let same = hop.fits_len != 0
            && hop.in_ifindex == in_ifindex
            && hop.out_ifindex == found.out_ifindex
            && hop.dmac == found.dmac
            && hop.smac == found.smac
            && hop.flags == found.flags;
        if same && hop.fits_len >= len {
            return;
        }
        hop.in_ifindex = in_ifindex;
        hop.out_ifindex = found.out_ifindex;
        hop.dmac = found.dmac;
        hop.smac = found.smac;
        hop.flags = found.flags;
        hop.fits_len = len;
    }
}

/// The live entry for `key`, refreshing its idle timer and recording the
/// flags `set_flags` gives for the half it is; `None` from `set_flags`
/// (a half the caller does not serve) and expired entries count as absent.
#[inline(always)]
pub fn lookup<F: Ip>(
    config: &DatapathConfig,
    key: &CtKeyOf<F>,
    clock: &Clock,
    set_flags: impl Fn(CtDirection) -> Option<u16>,
) -> Option<Hit<F>> {
    let entry = F::conntrack().get_ptr_mut(key)?;
    // SAFETY: the pointer from the map lookup stays valid for this program run.
    let entry = unsafe { &mut *entry };
    let direction = entry.direction();
    let set_flags = set_flags(direction)?;
    let now = clock.now::<F>();
    let idle = now.saturating_sub(entry.last_seen_ns);
    if idle > idle_timeout(config, key.proto, entry.flags) {
        return None;
    }
    let refreshed = idle > REFRESH_INTERVAL_NS;
    if refreshed {
        entry.last_seen_ns = now;
    }
    let new_flags = set_flags & !entry.flags;
    if new_flags != 0 {
        entry.flags |= new_flags;
    }
    let hop = HopCache {
        at: &mut entry.next_hop,
        stale: refreshed,
    };
    Some(Hit {
        value: entry,
        direction,
        new_flags,
        refreshed,
        hop,
    })
}

/// The live entry for `key`, in place and left as it is (its idle timer untouched).
#[inline(always)]
pub fn live<F: Ip>(
    config: &DatapathConfig,
    key: &CtKeyOf<F>,
    now: u64,
) -> Option<&'static CtValueOf<F>> {
    // SAFETY: the reference from the map lookup stays valid for this program run.
    let entry = unsafe { F::conntrack().get(key) }?;
    let idle = now.saturating_sub(entry.last_seen_ns);
    (idle <= idle_timeout(config, key.proto, entry.flags)).then_some(entry)
}

/// Inserts or replaces. A full table refuses (as the kernel's conntrack
/// drops a new flow's packet when its table is full) and asks the
/// collector for a sweep.
#[inline(always)]
pub fn insert<F: Ip>(key: &CtKeyOf<F>, value: &CtValueOf<F>) -> Result<(), Counter> {
    F::conntrack().insert(key, value, 0).map_err(|e| {
        if e == -E2BIG {
            crate::collector::kick(coarse_ns());
        }
        Counter::DropConntrackFull
    })
}

/// The error of an insert into a full hash.
const E2BIG: i32 = 7;

/// Inserts only if `key` holds no entry at all (live or expired).
#[inline(always)]
pub fn insert_new<F: Ip>(key: &CtKeyOf<F>, value: &CtValueOf<F>) -> bool {
    F::conntrack()
        .insert(key, value, BPF_NOEXIST as u64)
        .is_ok()
}

/// What [`claim`] did with a tuple.
pub enum Claim {
    /// Inserted: the tuple was free, or its flow had expired.
    Claimed,
    /// Left alone: a live flow's.
    Live,
    /// The reply half of a closed TCP flow ([`closed`]), which
    /// [`take_over`] may take when no free tuple is found.
    Closed,
}

/// Inserts only if `key` is free or holds an expired flow: a masquerade
/// port must not be taken from a live flow's reply tuple. Looking does not
/// refresh the entry found: a port search must not keep its flow alive.
#[inline(always)]
pub fn claim<F: Ip>(
    config: &DatapathConfig,
    key: &CtKeyOf<F>,
    value: &CtValueOf<F>,
    now: u64,
) -> Claim {
    if insert_new(key, value) {
        return Claim::Claimed;
    }
    match live(config, key, now) {
        Some(found) if found.flags & flags::REPLY != 0 && closed(found.flags) => Claim::Closed,
        Some(_) => Claim::Live,
        None if F::conntrack().insert(key, value, 0).is_ok() => Claim::Claimed,
        None => Claim::Live,
    }
}

/// A TCP (or SCTP) flow that is over: reset, or closed by both ends (the
/// kernel's CLOSE and TIME_WAIT states). Its entries only wait for their
/// timeout, which keeps late packets of the flow on it.
#[inline(always)]
pub fn closed(entry_flags: u16) -> bool {
    entry_flags & flags::RST != 0
        || entry_flags & (flags::FIN_FORWARD | flags::FIN_REPLY)
            == flags::FIN_FORWARD | flags::FIN_REPLY
}

/// Gives the reply tuple `key`, held by a closed flow's reply half, to the
/// flow of `value`, and removes the closed flow's forward half when it is
/// still that flow's (its client may have opened the tuple anew since, with
/// a port of its own); `other` is the room for that half's key. As the
/// kernel's NAT does when its port search runs out (it evicts a clashing
/// connection in TIME_WAIT or CLOSE): without it, a backend behind a
/// masqueraded frontend could take only as many connections in a
/// TIME_WAIT's 120 s as there are ports. False when the tuple is no longer
/// a closed flow's.
#[inline(always)]
pub fn take_over<F: Ip>(
    config: &DatapathConfig,
    key: &CtKeyOf<F>,
    value: &CtValueOf<F>,
    other: &mut CtKeyOf<F>,
    now: u64,
) -> bool {
    let Some(old) = live(config, key, now) else {
        return insert(key, value).is_ok();
    };
    if old.flags & flags::REPLY == 0 || !closed(old.flags) {
        return false;
    }
    // The closed flow as its client sent it: from the client (the reply
    // half's destination, or the source it had before masquerading) to
    // the frontend.
    let (client_addr_be, client_port_be) = if old.flags & flags::SNAT != 0 {
        (old.snat_addr_be, old.snat_port_be)
    } else {
        (key.daddr_be, key.dport_be)
    };
    other.saddr_be = client_addr_be;
    other.daddr_be = old.nat_addr_be;
    other.sport_be = client_port_be;
    other.dport_be = old.nat_port_be;
    other.proto = key.proto;
    other._pad = 0;
    other._pad2 = 0;
    let same_flow = live(config, other, now).is_some_and(|forward| {
        forward.flags & flags::REPLY == 0
            && forward.nat_addr_be == key.saddr_be
            && forward.nat_port_be == key.sport_be
            && (forward.flags & flags::SNAT == 0
                || (forward.snat_addr_be == key.daddr_be && forward.snat_port_be == key.dport_be))
    });
    if same_flow {
        let _ = F::conntrack().remove(other);
    }
    insert(key, value).is_ok()
}
