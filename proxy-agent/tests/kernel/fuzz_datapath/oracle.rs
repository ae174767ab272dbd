//! The oracle: judges each outcome against the services and the flows it
//! saw being created, never against the datapath's code.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proxy_agent::{
    cli::packet::{ETH_HLEN, checksums_valid, tcp_flags},
    modes::ebpf::{
        node::{SNAT_PORT_MAX, SNAT_PORT_MIN},
        test_run::{Hook, Outcome},
    },
};
use proxy_common::{
    action::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_DROP, XDP_PASS, XDP_TX},
    proto,
};

use super::{
    family::{EXT_MAC, Fam, FragKey, POD_MAC},
    fixture::Fixture,
    generate::Class,
    shape::{Parsed, Shape},
    world::{Kind, Model, Tuple, World},
};

/// Violations of each invariant kept in full for the report (all are counted).
const KEPT_PER_INVARIANT: u64 = 3;
/// Masqueraded flows to one backend past which a failed SNAT port claim
/// (8 random tries) is plausible: 10% of the 4,536 ports.
const SNAT_PRESSURE: usize = 454;

/// Frames BPF_PROG_TEST_RUN itself refuses (EINVAL): shorter than an
/// Ethernet header, and for TC an IPv4 / IPv6 frame shorter than its
/// network header.
fn kernel_refuses(hook: Hook, pkt: &[u8]) -> bool {
    if pkt.len() < ETH_HLEN {
        return true;
    }
    hook != Hook::Xdp
        && match [pkt[12], pkt[13]] {
            [0x08, 0x00] => pkt.len() < ETH_HLEN + 20,
            [0x86, 0xdd] => pkt.len() < ETH_HLEN + 40,
            _ => false,
        }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Judged {
    Forwarded,
    Reply,
    Rejected,
    Dropped,
    Passed,
    Refused,
}

#[derive(Default)]
pub struct Stats {
    pub packets: u64,
    pub verdicts: BTreeMap<String, u64>,
    pub results: BTreeMap<Judged, u64>,
    classes: BTreeMap<Class, u64>,
    pub followups: u64,
    pub followup_results: BTreeMap<Judged, u64>,
    /// New masqueraded flows given a closed flow's reply tuple.
    pub taken_over: u64,
    /// Later fragments translated as the flow of their first fragment.
    pub fragments_followed: u64,
    /// Packets translated whose IPv4 options or IPv6 extension headers
    /// stood between the fixed header and L4.
    pub translated_past_options: u64,
    pub tcp_flag_combinations: BTreeSet<u8>,
    /// Translated although the kernel's IP input checks would drop it, by reason.
    pub translated_invalid_header: BTreeMap<&'static str, u64>,
}

pub struct Violation {
    pub index: u64,
    pub hook: Hook,
    pub class: Class,
    pub what: String,
    pub input: Vec<u8>,
    pub verdict: Option<i32>,
    pub output: Vec<u8>,
}

pub struct Oracle<'a, F: Fam> {
    world: &'a World<F>,
    pub model: Model<F::Addr>,
    /// The ports of datagrams whose first fragment (more to follow) the
    /// datapath parsed: their later fragments may follow their flow
    /// (`FRAGMENTS`, `FRAGMENTS6`).
    fragments: HashMap<FragKey<F::Addr>, (u16, u16)>,
    pub stats: Stats,
    pub violations: Vec<Violation>,
    pub violation_count: u64,
    pub by_invariant: BTreeMap<String, u64>,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn verdict_name(hook: Hook, v: i32) -> String {
    match (hook, v) {
        (Hook::Xdp, XDP_DROP) => "DROP".into(),
        (Hook::Xdp, XDP_PASS) => "PASS".into(),
        (Hook::Xdp, XDP_TX) => "TX".into(),
        (Hook::Xdp, v) => format!("xdp:{v}"),
        (_, TC_ACT_OK) => "OK".into(),
        (_, TC_ACT_SHOT) => "SHOT".into(),
        (_, TC_ACT_REDIRECT) => "REDIRECT".into(),
        (_, v) => format!("tc:{v}"),
    }
}

fn is_drop(hook: Hook, v: i32) -> bool {
    v == if hook == Hook::Xdp {
        XDP_DROP
    } else {
        TC_ACT_SHOT
    }
}

fn is_pass(hook: Hook, v: i32) -> bool {
    v == if hook == Hook::Xdp {
        XDP_PASS
    } else {
        TC_ACT_OK
    }
}

fn valid_action(hook: Hook, v: i32) -> bool {
    match hook {
        Hook::Xdp => matches!(v, XDP_DROP | XDP_PASS | XDP_TX),
        _ => matches!(v, TC_ACT_OK | TC_ACT_SHOT | TC_ACT_REDIRECT),
    }
}

/// The bytes a translation may change: MACs, TTL / hop limit, IPv4's
/// header checksum, the addresses, and (given L4 at `l4`) the ports and
/// the L4 checksum at `csum`.
fn may_change<F: Fam>(i: usize, l4: Option<(usize, usize)>) -> bool {
    let ip = ETH_HLEN;
    let addrs = ip + F::ADDRS_AT..ip + F::ADDRS_AT + 2 * F::ALEN;
    i < 12
        || i == ip + F::TTL_AT
        || F::HDR_CSUM_AT.is_some_and(|at| i == ip + at || i == ip + at + 1)
        || addrs.contains(&i)
        || l4.is_some_and(|(l4, csum)| (l4..l4 + 4).contains(&i) || (csum..csum + 2).contains(&i))
}

/// A translated frame's TTL / hop limit and MACs: decremented and the next
/// hop's when sent on (XDP_TX, a TC redirect), untouched when left to the
/// stack.
fn check_sent_on<F: Fam>(hook: Hook, input: &[u8], out: &Outcome) -> Result<(), String> {
    let o = &out.packet;
    let sent = matches!(
        (hook, out.verdict),
        (Hook::Xdp, XDP_TX) | (Hook::FromPod | Hook::FromNetdev, TC_ACT_REDIRECT)
    );
    let ttl_at = ETH_HLEN + F::TTL_AT;
    let (ttl_in, ttl_out) = (input[ttl_at], o[ttl_at]);
    if sent {
        if ttl_in <= 1 || ttl_out != ttl_in - 1 {
            return Err(format!("[rewrite] sent on with TTL {ttl_in} -> {ttl_out}"));
        }
        let macs_kept = o[0..12] == input[0..12];
        let smac_ok = o[6..12] == EXT_MAC || (hook != Hook::Xdp && o[6..12] == POD_MAC);
        let dmac_ok = F::NET
            .neighbours()
            .iter()
            .any(|(_, mac, _)| o[0..6] == *mac);
        let next_hop = smac_ok && dmac_ok;
        // bpf_redirect_neigh (TC) fills the MACs in later.
        if !(next_hop || (macs_kept && hook != Hook::Xdp)) {
            return Err("[rewrite] sent on with MACs of no next hop".into());
        }
    } else if ttl_out != ttl_in || o[0..12] != input[0..12] {
        return Err("[rewrite] TTL or MACs changed on a packet left to the stack".into());
    }
    Ok(())
}

impl<'a, F: Fam> Oracle<'a, F> {
    pub fn new(world: &'a World<F>) -> Self {
        Oracle {
            world,
            model: Model::default(),
            fragments: HashMap::new(),
            stats: Stats::default(),
            violations: Vec::new(),
            violation_count: 0,
            by_invariant: BTreeMap::new(),
        }
    }

    /// Runs one packet through `hook` (and, after XDP_PASS, through
    /// `tc_from_netdev` as the kernel would) and judges the outcome.
    pub fn run(&mut self, fx: &Fixture, hook: Hook, index: u64, class: Class, input: &[u8]) {
        self.stats.packets += 1;
        *self.stats.classes.entry(class).or_default() += 1;
        let shape = Shape::of::<F>(input);
        if let Shape::Handleable(p) = shape
            && p.t.proto == proto::TCP
        {
            self.stats.tcp_flag_combinations.insert(p.tcp_flags);
        }
        let outcome = fx.run(hook, input);
        let verdict = outcome.as_ref().ok().map(|o| o.verdict);
        let key = match verdict {
            Some(v) => verdict_name(hook, v),
            None => "refused".into(),
        };
        *self.stats.verdicts.entry(key).or_default() += 1;
        let judged = match &outcome {
            Err(_) if kernel_refuses(hook, input) => Ok(Judged::Refused),
            Err(e) => Err(format!("[action] the test run failed: {e:#}")),
            Ok(out) => self.judge(hook, shape, input, out),
        };
        match judged {
            Ok(r) => {
                *self.stats.results.entry(r).or_default() += 1;
                let passed_up = hook == Hook::Xdp
                    && r == Judged::Passed
                    && matches!(shape, Shape::Handleable(_) | Shape::LaterFragment);
                if passed_up {
                    self.stats.followups += 1;
                    let after = fx.run(Hook::FromNetdev, input);
                    let judged = match &after {
                        Err(e) => Err(format!("[action] the test run failed: {e:#}")),
                        Ok(out) => self.judge(Hook::FromNetdev, shape, input, out),
                    };
                    match judged {
                        Ok(r) => *self.stats.followup_results.entry(r).or_default() += 1,
                        Err(what) => {
                            let what = format!("after XDP_PASS: {what}");
                            self.violation(index, Hook::FromNetdev, class, what, input, after.ok());
                        }
                    }
                }
            }
            Err(what) => {
                self.violation(index, hook, class, what, input, outcome.ok());
            }
        }
    }

    /// A later fragment of a datagram whose first fragment was seen, of a
    /// live flow, may leave as its flow does: its addresses translated (an
    /// IPv4 header checksum as valid as before), TTL / hop limit and MACs
    /// as any packet sent on, every other byte untouched. `None`: no such
    /// flow; the untouched rule judges it.
    fn later_fragment(
        &mut self,
        hook: Hook,
        input: &[u8],
        out: &Outcome,
    ) -> Option<Result<Judged, String>> {
        let key = F::later_fragment(input)?;
        let &(sport, dport) = self.fragments.get(&key)?;
        let (src, dst, _, proto) = key;
        let t = Tuple {
            src,
            sport,
            dst,
            dport,
            proto,
        };
        let (to, judged) = match (self.model.forwards.get(&t), self.model.replies.get(&t)) {
            (Some(to), _) => (*to, Judged::Forwarded),
            (_, Some(to)) => (*to, Judged::Reply),
            _ => return None,
        };
        let o = &out.packet;
        let (Some(valid_in), Some(valid_out)) =
            (F::header_checksum_ok(input), F::header_checksum_ok(o))
        else {
            return Some(Err(format!("[fragment] later fragment of {t} reshaped")));
        };
        if o.len() != input.len() {
            return Some(Err(format!("[fragment] later fragment of {t} reshaped")));
        }
        let kept = (0..o.len()).all(|i| o[i] == input[i] || may_change::<F>(i, None));
        let at = ETH_HLEN + F::ADDRS_AT;
        let addressed = o[at..at + F::ALEN] == F::octets(to.src)[..]
            && o[at + F::ALEN..at + 2 * F::ALEN] == F::octets(to.dst)[..];
        if hook == Hook::Xdp && out.verdict == XDP_PASS {
            return Some(Err(format!(
                "[fragment] later fragment of {t} modified and passed up the stack"
            )));
        }
        if let Err(what) = check_sent_on::<F>(hook, input, out) {
            return Some(Err(format!("[fragment] later fragment of {t}: {what}")));
        }
        if kept && addressed && valid_in == valid_out {
            self.stats.fragments_followed += 1;
            Some(Ok(judged))
        } else {
            Some(Err(format!(
                "[fragment] later fragment of {t} not translated as its flow ({to})"
            )))
        }
    }

    fn violation(
        &mut self,
        index: u64,
        hook: Hook,
        class: Class,
        what: String,
        input: &[u8],
        out: Option<Outcome>,
    ) {
        self.violation_count += 1;
        let invariant = what
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or("?", |(tag, _)| tag)
            .to_string();
        let seen = self.by_invariant.entry(invariant).or_default();
        *seen += 1;
        if *seen <= KEPT_PER_INVARIANT {
            self.violations.push(Violation {
                index,
                hook,
                class,
                what,
                input: input.to_vec(),
                verdict: out.as_ref().map(|o| o.verdict),
                output: out.map(|o| o.packet).unwrap_or_default(),
            });
        }
    }

    fn judge(
        &mut self,
        hook: Hook,
        shape: Shape<F::Addr>,
        input: &[u8],
        out: &Outcome,
    ) -> Result<Judged, String> {
        let v = out.verdict;
        if !valid_action(hook, v) {
            return Err(format!("[action] invalid action {v}"));
        }
        let unchanged = out.packet == input;
        if let Shape::Handleable(p) = shape
            && !p.header_unfit::<F>()
            && let Some(id) = F::first_fragment(input, &p)
        {
            let key = (p.t.src, p.t.dst, id, p.t.proto);
            self.fragments.insert(key, (p.t.sport, p.t.dport));
        }
        if shape == Shape::LaterFragment
            && !unchanged
            && let Some(judged) = self.later_fragment(hook, input, out)
        {
            return judged;
        }
        let Shape::Handleable(p) = shape else {
            if is_drop(hook, v) && shape.malformed() {
                return Ok(Judged::Dropped);
            }
            if !unchanged {
                return Err(format!("[untouched] {shape:?} frame modified"));
            }
            if !is_pass(hook, v) {
                return Err(format!("[untouched] {shape:?} frame not passed on"));
            }
            return Ok(Judged::Passed);
        };
        // The datapath notes a FIN or RST when it finds the packet's flow,
        // before it may still drop the packet (a header it cannot rewrite).
        if let Some(to) = self.model.forwards.get(&p.t).copied() {
            self.model.note_closing(to.reversed(), p.tcp_flags, true);
        }
        if self.model.replies.contains_key(&p.t) {
            self.model.note_closing(p.t, p.tcp_flags, false);
        }
        if is_drop(hook, v) && p.header_unfit::<F>() {
            return Ok(Judged::Dropped);
        }
        let t = p.t;
        let fe = self.world.frontend(&t);
        let unused_port = fe.is_none() && self.world.cluster_ips.contains(&t.dst);
        let reply = self.model.replies.get(&t).copied();

        if is_drop(hook, v) {
            if reply.is_some() {
                return Err(format!("[reply] dropped the reply {t} of a live flow"));
            }
            // A SYN of a live flow is dropped only when it would open a new
            // one in its place (the old one finished) and that failed: the
            // old flow is gone.
            let opens = p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
            if t.proto == proto::TCP && opens {
                self.model.forget(&t);
            }
            return match fe {
                Some((spec, kind)) => self.drop_allowed(hook, &p, input, spec, kind),
                None if unused_port => self.reject_may_fail(hook, &p, input),
                None => Err(format!(
                    "[untouched] dropped {t}, for no service and no flow"
                )),
            }
            .map(|()| Judged::Dropped);
        }
        if unchanged {
            if !is_pass(hook, v) {
                return Err("[untouched] an untouched packet was sent on".into());
            }
            if hook != Hook::Xdp {
                if reply.is_some() {
                    return Err(format!(
                        "[reply] the reply {t} of a live flow passed untranslated"
                    ));
                }
                if fe.is_some() || unused_port {
                    return Err(format!(
                        "[forward] {t} is service traffic but passed untranslated"
                    ));
                }
            }
            return Ok(Judged::Passed);
        }
        if hook == Hook::Xdp && v == XDP_PASS {
            return Err("[rewrite] XDP passed a modified frame up the stack".into());
        }
        if let Some(r) = self.reject(hook, &p, input, out, fe, unused_port, reply.is_some())? {
            return Ok(r);
        }
        self.check_rewrite(hook, &p, input, out)?;
        if p.l3_len != F::HLEN {
            self.stats.translated_past_options += 1;
        }
        if let Some(reason) = F::kernel_drops(input, &p) {
            *self
                .stats
                .translated_invalid_header
                .entry(reason)
                .or_default() += 1;
        }
        let o = p.tuple_at::<F>(&out.packet);
        if let Some(want) = reply {
            if o != want {
                return Err(format!(
                    "[reply] the reply {t} left as {o}, its flow says {want}"
                ));
            }
            // The oracle's own view, whatever the model says.
            let Some((spec, _)) = self.world.frontend(&want.reversed()) else {
                return Err(format!(
                    "[reply] the reply {t} left from {o}, which is no frontend"
                ));
            };
            if !self.world.specs[spec]
                .endpoints
                .iter()
                .any(|(a, pt, _)| (*a, *pt) == (t.src, t.sport))
            {
                return Err(format!(
                    "[reply] {t} reverse-translated, but not from an endpoint of {}",
                    self.world.specs[spec].name
                ));
            }
            self.model.note_closing(t, p.tcp_flags, false);
            return Ok(Judged::Reply);
        }
        let Some((spec, kind)) = fe else {
            return Err(format!(
                "[forward] {t} rewritten to {o}, but it is neither for a service nor a reply of a live flow"
            ));
        };
        self.check_forward(&p, spec, kind, o)?;
        Ok(Judged::Forwarded)
    }

    /// Drops of a well-formed packet to a frontend: only the reasons the
    /// service's definition gives (or a reject that cannot be built).
    fn drop_allowed(
        &self,
        hook: Hook,
        p: &Parsed<F::Addr>,
        input: &[u8],
        spec: usize,
        kind: Kind,
    ) -> Result<(), String> {
        let t = p.t;
        let s = &self.world.specs[spec];
        if s.endpoints.is_empty() {
            return self.reject_may_fail(hook, p, input);
        }
        if self.world.range_denies(spec, kind, t.src) {
            return Ok(());
        }
        let backends = self.world.backends(spec, kind, t.src);
        if backends.is_empty() {
            return Ok(());
        }
        // A port claim may fail where masqueraded flows crowd the ports:
        // for a masqueraded flow, or one from the masquerade address itself
        // that needs a port of its own.
        let crowded = |&(a, port): &(F::Addr, u16)| {
            let claims = self.world.masquerades(spec, kind, t.src, a)
                || (t.src == F::NET.node && self.model.clash(&t, (a, port)).is_some());
            let masqueraded = self.model.masqueraded.get(&(a, port, t.proto));
            claims && masqueraded.copied().unwrap_or(0) >= SNAT_PRESSURE
        };
        if backends.iter().any(crowded) {
            return Ok(());
        }
        let why = backends
            .iter()
            .map(|&(a, port)| {
                let masqueraded = self.model.masqueraded.get(&(a, port, t.proto));
                format!(
                    "{a}:{port}: {} masqueraded flows, reply tuple taken by {:?}",
                    masqueraded.copied().unwrap_or(0),
                    self.model.clash(&t, (a, port)).map(|m| m.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(format!(
            "[drop] dropped {t}, though service {} has endpoints for it ({why})",
            s.name
        ))
    }

    /// A reject the datapath may give up on (then it drops): not for a
    /// reset, nor with IPv4 options or IPv6 extension headers, nor without
    /// a whole TCP header.
    fn reject_may_fail(&self, hook: Hook, p: &Parsed<F::Addr>, input: &[u8]) -> Result<(), String> {
        if hook == Hook::Xdp {
            return Err(format!(
                "[drop] XDP dropped {}, which TC should reject",
                p.t
            ));
        }
        let tcp = p.t.proto == proto::TCP;
        if p.l3_len != F::HLEN
            || (tcp && (p.tcp_flags & tcp_flags::RST != 0 || input.len() < p.l4_off + 20))
        {
            return Ok(());
        }
        Err(format!(
            "[drop] dropped {}, which should have been rejected",
            p.t
        ))
    }

    /// `Some` when `out` is a reject the datapath built; checks it is allowed and well made.
    #[allow(clippy::too_many_arguments)]
    fn reject(
        &self,
        hook: Hook,
        p: &Parsed<F::Addr>,
        input: &[u8],
        out: &Outcome,
        fe: Option<(usize, Kind)>,
        unused_port: bool,
        live_reply: bool,
    ) -> Result<Option<Judged>, String> {
        let o = &out.packet;
        if o.len() < ETH_HLEN + F::HLEN + 8 || o[12..14] != F::ETHERTYPE {
            return Ok(None);
        }
        let ip = &o[ETH_HLEN..];
        let (src, dst) = (
            F::addr_at(&ip[F::ADDRS_AT..]),
            F::addr_at(&ip[F::ADDRS_AT + F::ALEN..]),
        );
        let t = p.t;
        if (src, dst) != (t.dst, t.src) {
            return Ok(None);
        }
        let l4 = &ip[F::header_len(ip).min(ip.len())..];
        let rst = ip[F::PROTO_AT] == proto::TCP
            && l4.len() >= 14
            && l4[13] & tcp_flags::RST != 0
            && u16::from_be_bytes([l4[0], l4[1]]) == t.dport
            && u16::from_be_bytes([l4[2], l4[3]]) == t.sport;
        let icmp = ip[F::PROTO_AT] == F::ICMP;
        if !rst && !icmp {
            return Ok(None);
        }
        // It is a reject: was one due?
        if hook == Hook::Xdp {
            return Err("[reject] XDP built a reject".into());
        }
        if out.verdict != TC_ACT_REDIRECT {
            return Err("[reject] a reject not sent back out".into());
        }
        let for_empty = fe.is_some_and(|(s, _)| self.world.specs[s].endpoints.is_empty());
        if !(for_empty || unused_port) || live_reply {
            return Err(format!(
                "[reject] rejected {t}, which has endpoints or a flow"
            ));
        }
        if t.proto == proto::TCP && p.tcp_flags & tcp_flags::RST != 0 {
            return Err(format!("[reject] answered the reset {t}"));
        }
        if p.l3_len != F::HLEN {
            return Err("[reject] rejected a packet with IP options or extension headers".into());
        }
        // Well made: MACs swapped, a plain IP header, valid checksums.
        if o[0..6] != input[6..12] || o[6..12] != input[0..6] {
            return Err("[reject] reject: MACs not swapped".into());
        }
        if !F::plain_header(ip) {
            return Err("[reject] reject: bad IP header".into());
        }
        let tot = F::tot_len(ip);
        if t.proto == proto::TCP {
            if o.len() != ETH_HLEN + F::HLEN + 20
                || tot != F::HLEN + 20
                || !rst
                || !checksums_valid(o)
            {
                return Err("[reject] reject: malformed TCP reset".into());
            }
            let req = &input[p.l4_off..];
            let seq = u32::from_be_bytes([req[4], req[5], req[6], req[7]]);
            let ack = u32::from_be_bytes([req[8], req[9], req[10], req[11]]);
            let doff = (req[12] >> 4) as usize * 4;
            let payload = p.tot_len.saturating_sub(F::HLEN + doff) as u32;
            let (want_seq, want_ack, want_flags) = if p.tcp_flags & tcp_flags::ACK != 0 {
                (ack, 0, tcp_flags::RST)
            } else {
                let consumed = payload
                    + u32::from(p.tcp_flags & tcp_flags::SYN != 0)
                    + u32::from(p.tcp_flags & tcp_flags::FIN != 0);
                (
                    0,
                    seq.wrapping_add(consumed),
                    tcp_flags::RST | tcp_flags::ACK,
                )
            };
            let got_seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
            let got_ack = u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]);
            if (got_seq, got_ack, l4[13]) != (want_seq, want_ack, want_flags) {
                return Err(format!(
                    "[reject] reject: RST seq/ack/flags {got_seq}/{got_ack}/{:#x}, want {want_seq}/{want_ack}/{want_flags:#x}",
                    l4[13]
                ));
            }
        } else {
            let quoted = F::HLEN + 8;
            let icmp = &ip[F::HLEN..];
            if o.len() != ETH_HLEN + F::HLEN + 8 + quoted
                || tot != o.len() - ETH_HLEN
                || icmp[0..2] != F::PORT_UNREACHABLE
                || !checksums_valid(o)
                || icmp[8..] != input[ETH_HLEN..ETH_HLEN + quoted]
            {
                return Err("[reject] reject: malformed ICMP port unreachable".into());
            }
        }
        Ok(Some(Judged::Rejected))
    }

    /// A translated frame: same length, only addresses, ports, checksums,
    /// TTL / hop limit and (when sent on) MACs changed, checksums as valid
    /// as before.
    fn check_rewrite(
        &self,
        hook: Hook,
        p: &Parsed<F::Addr>,
        input: &[u8],
        out: &Outcome,
    ) -> Result<(), String> {
        let o = &out.packet;
        if o.len() != input.len() {
            return Err(format!(
                "[rewrite] length changed from {} to {}",
                input.len(),
                o.len()
            ));
        }
        let l4 = Some((p.l4_off, p.csum_off));
        if let Some(i) = (0..o.len()).find(|&i| o[i] != input[i] && !may_change::<F>(i, l4)) {
            return Err(format!("[rewrite] byte {i} changed"));
        }
        check_sent_on::<F>(hook, input, out)?;
        if p.ip_valid::<F>(input) != p.ip_valid::<F>(o) {
            return Err("[rewrite] IPv4 header checksum validity changed".into());
        }
        if p.l4_sane(input) {
            if p.l4_valid::<F>(input) != p.l4_valid::<F>(o) {
                return Err("[rewrite] L4 checksum validity changed".into());
            }
            if p.ip_valid::<F>(input) && p.l4_valid::<F>(input) && !checksums_valid(o) {
                return Err("[rewrite] checksums no longer verify".into());
            }
        }
        if p.t.proto == proto::UDP {
            let none = |pkt: &[u8]| pkt[p.csum_off..p.csum_off + 2] == [0, 0];
            match (none(input), none(o)) {
                (true, false) => {
                    return Err("[rewrite] a UDP packet without checksum got one".into());
                }
                (false, true) => return Err("[rewrite] a UDP checksum was zeroed".into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// A new or established flow to frontend `kind` of `spec`, leaving as `o`.
    fn check_forward(
        &mut self,
        p: &Parsed<F::Addr>,
        spec: usize,
        kind: Kind,
        o: Tuple<F::Addr>,
    ) -> Result<(), String> {
        let t = p.t;
        let name = self.world.specs[spec].name;
        if self.world.range_denies(spec, kind, t.src) {
            return Err(format!(
                "[forward] forwarded {t} from outside the source ranges of {name}"
            ));
        }
        let backends = self.world.backends(spec, kind, t.src);
        if !backends.contains(&(o.dst, o.dport)) {
            return Err(format!(
                "[forward] {t} sent to {}:{}, not one of {name}'s endpoints {backends:?}",
                o.dst, o.dport
            ));
        }
        let syn = p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
        match self.model.forwards.get(&t) {
            // Established: judged when it was created.
            Some(prev) if *prev == o => {
                if syn && p.tcp_flags & (tcp_flags::FIN | tcp_flags::RST) == 0 {
                    // Reopens a finished flow, or leaves an open one open.
                    self.model.closing.remove(&o.reversed());
                }
                return Ok(());
            }
            Some(prev) => {
                if !(t.proto == proto::TCP && syn) {
                    return Err(format!(
                        "[forward] the live flow {t} moved from {prev} to {o}"
                    ));
                }
                // A new connection on the tuple: the old flow went first.
                self.model.forget(&t);
            }
            None => {}
        }
        let masq = self.world.masquerades(spec, kind, t.src, o.dst);
        // Without masquerade the client keeps its address, and its port
        // unless another live flow's replies already come back on the
        // flow's reply tuple (then, as the kernel's NAT, a port of its own).
        let clash = self.model.clash(&t, (o.dst, o.dport)).is_some();
        let snat_port = (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&o.sport);
        let src_ok = if masq {
            o.src == F::NET.node && snat_port
        } else if o.sport == t.sport {
            o.src == t.src
        } else {
            o.src == t.src && clash && snat_port
        };
        if !src_ok {
            return Err(format!(
                "[forward] {t} left as {o}: masquerade expected {masq}, reply tuple taken {clash}"
            ));
        }
        // A new flow: its reply tuple must not be another live flow's.
        let key = o.reversed();
        let back = t.reversed();
        let was_closed = self.model.may_be_closed(&key);
        let closing_bits = self.model.closing.get(&key).copied().unwrap_or(0);
        self.model.closing.remove(&key);
        if let Some(old) = self.model.replies.get(&key).copied()
            && old != back
            && self.model.forwards.get(&old.reversed()) == Some(&key.reversed())
        {
            if !(was_closed && (masq || clash)) {
                self.model.add_forward(t, o);
                self.model.replies.insert(key, back);
                return Err(format!(
                    "[collision] the new flow {t} -> {o} took the reply tuple of the live flow {} -> {} (seen closing: {:#x})",
                    old.reversed(),
                    key.reversed(),
                    closing_bits
                ));
            }
            // A masquerade port claim that found no free tuple took over a
            // closed flow's: its forward half goes with it.
            self.model.forget(&old.reversed());
            self.model.add_forward(t, o);
            self.model.replies.insert(key, back);
            self.stats.taken_over += 1;
            self.model.note_closing(key, p.tcp_flags, true);
            return Ok(());
        }
        self.model.add_forward(t, o);
        self.model.note_closing(key, p.tcp_flags, true);
        if self.model.replies.insert(key, back).is_none() {
            self.model.reply_keys.push(key);
        }
        if masq {
            *self
                .model
                .masqueraded
                .entry((o.dst, o.dport, o.proto))
                .or_default() += 1;
        }
        Ok(())
    }
}
