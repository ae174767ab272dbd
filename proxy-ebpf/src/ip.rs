//! What the programs need from an address family beyond the map ABI's
//! [`Family`]: its maps, where its addresses sit in the header, how they
//! enter checksums and the FIB. Everything else is written once, generic
//! over `F: Ip`; the compiler emits one instance per family.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, bpf_sock, bpf_sock_addr},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
};
use proxy_common::{
    AffinityKeyOf, AffinityValue, BackendId, BackendOf, Counter, CtKeyOf, CtValueOf,
    DatapathConfig, Family, MonitorEventOf, PrefixOf, ServiceKeyOf, ServiceValue, SockKeyOf,
    SockValueOf, SourceRangeOf, V4, V6,
    config::flags as config_flags,
    maglev::{AddrWords, MaglevChunk},
    proto,
    slots::SlotPair,
};

use crate::{
    conntrack::TickClock,
    flow::Rewrite,
    frame::Frame,
    hops::HopSlot,
    maps,
    packet::{self, ETH_HLEN, Packet},
};

/// Working memory for the conntrack entries a packet writes, kept in a
/// per-CPU array rather than on the 512-byte stack, which the IPv6 path
/// would overflow (LLVM's BPF backend reuses few stack slots).
#[repr(C)]
pub struct Scratch<F: Family> {
    /// The one field read across runs: this CPU's clock cache
    /// ([`crate::conntrack::now_ns`]), first, in the cache line a
    /// packet's conntrack key is built in.
    pub clock: TickClock,
    /// A service map key being looked up.
    pub service: ServiceKeyOf<F>,
    pub key: CtKeyOf<F>,
    pub value: CtValueOf<F>,
    /// The other half of a closed flow whose masquerade port a new flow
    /// takes over (`conntrack::take_over`).
    pub other_key: CtKeyOf<F>,
    /// The FIB query and answer of a forwarded packet.
    pub fib: bpf_fib_lookup,
    /// A reject's reply frame, built here before it replaces the packet.
    pub reply: [u8; REPLY_MAX],
    /// A monitor event, built here and copied to each listening ring.
    pub event: MonitorEventOf<F>,
    /// Where L4 starts behind IPv6 extension headers (see `packet::parse6`).
    pub l4_off: u32,
    /// An IPv6 datagram's `FRAGMENTS6` key (see `packet::parse6`).
    pub fragment6: proxy_common::fragment::FragKey6,
    /// A session-affinity entry being looked up or written.
    pub affinity_key: AffinityKeyOf<F>,
    pub affinity: AffinityValue,
    /// The hash of the new flow's client tuple a Maglev table is looked up
    /// by (`lb::select`).
    pub maglev_hash: u32,
    /// An IPv6 rewrite handed to `nat::nat_rewrite6` (a global function,
    /// whose arguments are the context and scalars).
    pub rewrite: RewriteJob<F>,
}

/// The tuple a packet is rewritten to, and where its L4 header and
/// checksum are.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RewriteJob<F: Family> {
    pub to: Rewrite<F>,
    pub l4_off: u32,
    pub csum_off: u32,
    /// Extra `bpf_l4_csum_replace` flags (`BPF_F_MARK_MANGLED_0` for UDP).
    pub csum_flags: u32,
    /// A later fragment: the addresses alone (no L4 header).
    pub addresses_only: u32,
}

/// The largest reply a reject builds (an ICMPv6 error with its quote).
pub const REPLY_MAX: usize = 112;

pub trait Ip: Family + AddrWords {
    /// Bytes of the fixed IP header.
    const HDR_LEN: usize;
    const SADDR_OFF: usize;
    const DADDR_OFF: usize;
    /// Offset of the TTL / hop limit.
    const HOP_OFF: usize;
    /// Offset of the header checksum; `None`: the family has none (IPv6).
    const HDR_CSUM_OFF: Option<usize>;
    /// The protocol number of this family's ICMP, and its port-unreachable (type, code).
    const ICMP_PROTO: u8;
    const PORT_UNREACHABLE: (u8, u8);
    /// The `DatapathConfig` flag that turns this family's CIDR-based
    /// local-traffic detector on.
    const DETECT_LOCAL_BY_CIDR: u32;
    /// The `DatapathConfig` flag that lets new flows of this family use the
    /// next hop cached for their destination (`crate::hops`).
    const ROUTES_BY_DESTINATION: u32;

    /// The packet of a frame of this family (see [`crate::packet::parse`]).
    fn parse<C: Frame>(ctx: &C) -> Result<Option<Packet<Self>>, Counter>;

    fn services() -> &'static HashMap<ServiceKeyOf<Self>, ServiceValue>;
    fn backends() -> &'static HashMap<BackendId, BackendOf<Self>>;
    fn conntrack() -> &'static HashMap<CtKeyOf<Self>, CtValueOf<Self>>;
    fn local_pod_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8>;
    fn service_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8>;
    fn source_ranges() -> &'static LpmTrie<SourceRangeOf<Self>, u8>;
    fn sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockValueOf<Self>>;
    fn affinity() -> &'static LruHashMap<AffinityKeyOf<Self>, AffinityValue>;
    fn maglev() -> &'static Array<MaglevChunk>;
    fn slots() -> &'static Array<SlotPair>;
    /// The XDP filter's words (`proxy_common::filter`).
    fn filter() -> &'static Array<u64>;
    fn hops() -> &'static PerCpuArray<HopSlot<Self>>;
    /// This CPU's scratch space (see [`Scratch`]).
    fn scratch() -> Option<&'static mut Scratch<Self>>;
    /// [`crate::conntrack::now_ns`], inlined where the family's frames leave room.
    fn now_ns() -> u64;

    /// The address masqueraded traffic leaves with (unspecified: none).
    fn masquerade_addr(config: &DatapathConfig) -> Self::Addr;
    fn fib_addrs(params: &mut bpf_fib_lookup, src: Self::Addr, dst: Self::Addr);
    fn sock_addr(sa: &bpf_sock_addr) -> Self::Addr;
    fn set_sock_addr(sa: &mut bpf_sock_addr, addr: Self::Addr);
    /// The address a socket is connected to (unspecified: none).
    fn sock_peer(sk: &bpf_sock) -> Self::Addr;

    /// The unspecified address (0.0.0.0 / ::), which no key holds.
    #[inline(always)]
    fn unspecified() -> Self::Addr {
        Self::Addr::default()
    }

    /// One's-complement sum of the pseudo-header of an L4 segment (RFC 793 /
    /// RFC 8200 §8.1): both addresses, the protocol and the L4 length.
    #[inline(always)]
    fn pseudo_sum(src: &Self::Addr, dst: &Self::Addr, proto: u8, l4_len: u16) -> u32 {
        let (src, dst) = (Self::addr_words(src), Self::addr_words(dst));
        let mut sum = 0;
        for i in 0..src.len() {
            sum = crate::csum::add_u32(sum, src[i]);
            sum = crate::csum::add_u32(sum, dst[i]);
        }
        sum + (proto as u16).to_be() as u32 + l4_len.to_be() as u32
    }
}

impl Ip for V4 {
    #[inline(always)]
    fn now_ns() -> u64 {
        crate::conntrack::now_ns::<V4>()
    }
    const HDR_LEN: usize = 20;
    const SADDR_OFF: usize = ETH_HLEN + 12;
    const DADDR_OFF: usize = ETH_HLEN + 16;
    const HOP_OFF: usize = ETH_HLEN + 8;
    const HDR_CSUM_OFF: Option<usize> = Some(ETH_HLEN + 10);
    const ICMP_PROTO: u8 = proto::ICMP;
    const PORT_UNREACHABLE: (u8, u8) = (3, 3);
    const DETECT_LOCAL_BY_CIDR: u32 = config_flags::DETECT_LOCAL_BY_CIDR;
    const ROUTES_BY_DESTINATION: u32 = config_flags::ROUTES_BY_DESTINATION;

    #[inline(always)]
    fn parse<C: Frame>(ctx: &C) -> Result<Option<Packet<Self>>, Counter> {
        packet::parse4(ctx)
    }
    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<Self>, ServiceValue> {
        &maps::SERVICES
    }
    #[inline(always)]
    fn backends() -> &'static HashMap<BackendId, BackendOf<Self>> {
        &maps::BACKENDS
    }
    #[inline(always)]
    fn conntrack() -> &'static HashMap<CtKeyOf<Self>, CtValueOf<Self>> {
        &maps::CONNTRACK
    }
    #[inline(always)]
    fn local_pod_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8> {
        &maps::LOCAL_POD_CIDRS
    }
    #[inline(always)]
    fn service_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8> {
        &maps::SERVICE_CIDRS
    }
    #[inline(always)]
    fn source_ranges() -> &'static LpmTrie<SourceRangeOf<Self>, u8> {
        &maps::SOURCE_RANGES
    }
    #[inline(always)]
    fn sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockValueOf<Self>> {
        &maps::SOCKETS
    }
    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKeyOf<Self>, AffinityValue> {
        &maps::AFFINITY
    }
    #[inline(always)]
    fn maglev() -> &'static Array<MaglevChunk> {
        &maps::MAGLEV
    }
    fn slots() -> &'static Array<SlotPair> {
        &maps::SLOTS
    }
    #[inline(always)]
    fn filter() -> &'static Array<u64> {
        &maps::FILTER
    }
    #[inline(always)]
    fn hops() -> &'static PerCpuArray<HopSlot<Self>> {
        &maps::HOPS
    }
    #[inline(always)]
    fn scratch() -> Option<&'static mut Scratch<Self>> {
        // SAFETY: per-CPU memory, and a program run is never preempted by another on its CPU.
        maps::SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
    }
    #[inline(always)]
    fn masquerade_addr(config: &DatapathConfig) -> u32 {
        config.masquerade_addr_be
    }
    #[inline(always)]
    fn fib_addrs(params: &mut bpf_fib_lookup, src: u32, dst: u32) {
        params.__bindgen_anon_3.ipv4_src = src;
        params.__bindgen_anon_4.ipv4_dst = dst;
    }
    #[inline(always)]
    fn sock_addr(sa: &bpf_sock_addr) -> u32 {
        sa.user_ip4
    }
    #[inline(always)]
    fn set_sock_addr(sa: &mut bpf_sock_addr, addr: u32) {
        sa.user_ip4 = addr;
    }
    #[inline(always)]
    fn sock_peer(sk: &bpf_sock) -> u32 {
        // SAFETY: reading a field of the kernel's context.
        unsafe { core::ptr::read_volatile(&sk.dst_ip4) }
    }
}

impl Ip for V6 {
    // A call: inlined, the clock's registers spill into the IPv6 frame,
    // which then leaves no room for the calls below it.
    #[inline(always)]
    fn now_ns() -> u64 {
        crate::conntrack::now_ns6()
    }
    const HDR_LEN: usize = 40;
    const SADDR_OFF: usize = ETH_HLEN + 8;
    const DADDR_OFF: usize = ETH_HLEN + 24;
    const HOP_OFF: usize = ETH_HLEN + 7;
    const HDR_CSUM_OFF: Option<usize> = None;
    const ICMP_PROTO: u8 = proto::ICMPV6;
    const PORT_UNREACHABLE: (u8, u8) = (1, 4);
    const DETECT_LOCAL_BY_CIDR: u32 = config_flags::DETECT_LOCAL_BY_CIDR6;
    const ROUTES_BY_DESTINATION: u32 = config_flags::ROUTES_BY_DESTINATION6;

    #[inline(always)]
    fn parse<C: Frame>(ctx: &C) -> Result<Option<Packet<Self>>, Counter> {
        packet::parse6(ctx)
    }
    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<Self>, ServiceValue> {
        &maps::SERVICES6
    }
    #[inline(always)]
    fn backends() -> &'static HashMap<BackendId, BackendOf<Self>> {
        &maps::BACKENDS6
    }
    #[inline(always)]
    fn conntrack() -> &'static HashMap<CtKeyOf<Self>, CtValueOf<Self>> {
        &maps::CONNTRACK6
    }
    #[inline(always)]
    fn local_pod_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8> {
        &maps::LOCAL_POD_CIDRS6
    }
    #[inline(always)]
    fn service_cidrs() -> &'static LpmTrie<PrefixOf<Self>, u8> {
        &maps::SERVICE_CIDRS6
    }
    #[inline(always)]
    fn source_ranges() -> &'static LpmTrie<SourceRangeOf<Self>, u8> {
        &maps::SOURCE_RANGES6
    }
    #[inline(always)]
    fn sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockValueOf<Self>> {
        &maps::SOCKETS6
    }
    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKeyOf<Self>, AffinityValue> {
        &maps::AFFINITY6
    }
    #[inline(always)]
    fn maglev() -> &'static Array<MaglevChunk> {
        &maps::MAGLEV6
    }
    fn slots() -> &'static Array<SlotPair> {
        &maps::SLOTS6
    }
    #[inline(always)]
    fn filter() -> &'static Array<u64> {
        &maps::FILTER6
    }
    #[inline(always)]
    fn hops() -> &'static PerCpuArray<HopSlot<Self>> {
        &maps::HOPS6
    }
    #[inline(always)]
    fn scratch() -> Option<&'static mut Scratch<Self>> {
        // SAFETY: per-CPU memory, and a program run is never preempted by another on its CPU.
        maps::SCRATCH6.get_ptr_mut(0).map(|p| unsafe { &mut *p })
    }
    #[inline(always)]
    fn masquerade_addr(_config: &DatapathConfig) -> [u32; 4] {
        maps::CONFIG6
            .get(0)
            .map(|c| c.masquerade_addr_be)
            .unwrap_or_default()
    }
    #[inline(always)]
    fn fib_addrs(params: &mut bpf_fib_lookup, src: [u32; 4], dst: [u32; 4]) {
        params.__bindgen_anon_3.ipv6_src = src;
        params.__bindgen_anon_4.ipv6_dst = dst;
    }
    #[inline(always)]
    fn sock_addr(sa: &bpf_sock_addr) -> [u32; 4] {
        // One 32-bit access per word: the verifier checks context access widths.
        let mut addr = [0u32; 4];
        for (i, word) in addr.iter_mut().enumerate() {
            // SAFETY: reading a field of the kernel's context.
            *word = unsafe { core::ptr::read_volatile(&sa.user_ip6[i]) };
        }
        addr
    }
    #[inline(always)]
    fn set_sock_addr(sa: &mut bpf_sock_addr, addr: [u32; 4]) {
        for (i, word) in addr.iter().enumerate() {
            // SAFETY: writing a field of the kernel's context.
            unsafe { core::ptr::write_volatile(&mut sa.user_ip6[i], *word) };
        }
    }
    #[inline(always)]
    fn sock_peer(sk: &bpf_sock) -> [u32; 4] {
        let mut addr = [0u32; 4];
        for (i, word) in addr.iter_mut().enumerate() {
            // SAFETY: reading a field of the kernel's context, a word at a time.
            *word = unsafe { core::ptr::read_volatile(&sk.dst_ip6[i]) };
        }
        addr
    }
}
