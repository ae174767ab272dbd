//! Per-CPU counters: every datapath outcome, drops by reason included.

pub const COUNTER_MAX: u32 = 32;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $variant:ident = $n:literal => $name:literal,)*) => {
        #[repr(u32)]
        #[derive(Copy, Clone, Debug, PartialEq, Eq)]
        pub enum Counter {
            $($(#[doc = $doc])* $variant = $n,)*
        }

        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];

            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }
        }
    };
}

counters! {
    /// Packets a service program inspected.
    Packets = 0 => "packets",
    /// New flows balanced to a backend.
    NewFlow = 1 => "new_flow",
    /// Packets of known flows translated.
    Established = 2 => "established",
    /// Replies reverse-translated.
    ReplyNat = 3 => "reply_nat",
    /// Dropped: the service's traffic policy is Local and this node has no endpoint.
    DropNoLocalEndpoints = 4 => "drop_no_local_endpoints",
    /// Dropped: a backend slot or backend id is missing (agent mid-update).
    DropBackendMissing = 5 => "drop_backend_missing",
    /// Dropped: truncated or malformed headers.
    DropMalformed = 6 => "drop_malformed",
    /// Dropped: a checksum or store helper failed.
    DropRewriteFailed = 7 => "drop_rewrite_failed",
    /// Dropped: the conntrack map refused an insert.
    DropConntrackFull = 8 => "drop_conntrack_full",
    /// Connections balanced again because their backend disappeared: a SYN
    /// (or SCTP INIT) reusing the tuple of a connection to it.
    Rebalanced = 9 => "rebalanced",
    /// Rejected (TCP RST / ICMP port unreachable): the service has no endpoints.
    RejectNoEndpoints = 10 => "reject_no_endpoints",
    /// Rejected: a cluster IP's port that is no service port.
    RejectUnknownPort = 11 => "reject_unknown_port",
    /// Dropped: the source is outside loadBalancerSourceRanges.
    DropSourceRange = 12 => "drop_source_range",
    /// New flows that were masqueraded.
    Masqueraded = 13 => "masqueraded",
    /// Dropped: no free masquerade source port.
    DropSnatExhausted = 14 => "drop_snat_exhausted",
    /// Dropped: a reject could not be built (unsupported header layout).
    DropRejectFailed = 15 => "drop_reject_failed",
    /// Packets sent on through bpf_fib_lookup + redirect.
    FibRedirect = 16 => "fib_redirect",
    /// Packets left to the kernel's routing after translation.
    FibPass = 17 => "fib_pass",
    /// XDP: packets transmitted back out of the arrival interface.
    XdpTx = 18 => "xdp_tx",
    /// XDP: packets handed to the TC programs / kernel.
    XdpPass = 19 => "xdp_pass",
    /// New TCP connections on the tuple of a finished one (FIN or RST seen), balanced anew.
    Reopened = 20 => "reopened",
    /// Conntrack entries rebuilt from the other half of a live flow after the
    /// full table evicted them.
    ConntrackRebuilt = 21 => "conntrack_rebuilt",
    /// Socket hooks: a connect or UDP send to a service pointed at a backend.
    SockTranslated = 22 => "sock_translated",
    /// Socket hooks: a connect or UDP send refused (ECONNREFUSED): no usable
    /// endpoint, or a cluster IP's port that is no service port.
    SockRefused = 23 => "sock_refused",
    /// Socket hooks: getpeername or UDP recvmsg shown the service address.
    SockReverse = 24 => "sock_reverse",
    /// Socket hooks: a service connection left to the per-packet programs
    /// (a pod's connection to a frontend guarded by source ranges).
    SockDeclined = 25 => "sock_declined",
    /// Replies of this node's own sockets (hostNetwork endpoints) translated
    /// back on their way out.
    HostReply = 26 => "host_reply",
    /// Monitor events lost: the ring buffer was full (the monitor reads too slowly).
    MonitorLost = 27 => "monitor_lost",
    /// IPv6 packets passed untouched because their extension headers are
    /// more, or other, than the programs walk, or put L4 further in than
    /// the rewrite reaches (1 KiB).
    PassUnparsed = 28 => "pass_unparsed",
    /// To an address inside a service CIDR that no service holds: dropped,
    /// as upstream's nftables mode drops traffic to unallocated cluster IPs.
    DropUnallocated = 29 => "drop_unallocated_cluster_ip",
    /// A new connection sent to the backend its client is pinned to
    /// (`sessionAffinity: ClientIP`).
    AffinityHit = 30 => "affinity_hit",
    /// Translated packets sent on by their flow entry's cached next hop
    /// (`conntrack::NextHop`) instead of a FIB lookup.
    NextHopCached = 31 => "next_hop_cached",
}

const _: () = assert!((Counter::ALL.len() as u32) <= COUNTER_MAX);
