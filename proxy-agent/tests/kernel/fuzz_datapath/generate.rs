//! Packet generation: what each frame of a run is, in either family.

use proxy_agent::{
    cli::packet::{self, ETH_HLEN, tcp_flags},
    modes::ebpf::node::{SNAT_PORT_MAX, SNAT_PORT_MIN},
};
use proxy_common::proto;

use super::{
    family::{EXT_MAC, Fam, POD_MAC},
    rng::Rng,
    world::{Model, Tuple, World},
};

pub const MAX_FRAME: usize = 1600;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    RandomBytes,
    ToFrontend,
    NotService,
    Reply,
    NearReply,
    IcmpError,
    /// VLAN-tagged, the other family, ARP, other ethertypes.
    OtherFrame,
}

fn client_addr<F: Fam>(rng: &mut Rng) -> F::Addr {
    if rng.chance(88) {
        *rng.pick(&F::NET.clients())
    } else {
        F::random_addr(rng)
    }
}

fn client_port(rng: &mut Rng) -> u16 {
    match rng.below(100) {
        0..75 => 40000 + rng.below(48) as u16,
        75..85 => rng.range(SNAT_PORT_MIN as u64, SNAT_PORT_MAX as u64) as u16,
        85..95 => rng.next() as u16,
        _ => *rng.pick(&[0, 1, 53, 80, 443, 8080, 30080, 61000, 65535]),
    }
}

fn tcp_flags_for(rng: &mut Rng) -> u8 {
    use tcp_flags::*;
    const PSH: u8 = 0x08;
    match rng.below(100) {
        0..28 => SYN,
        28..50 => ACK,
        50..58 => PSH | ACK,
        58..64 => SYN | ACK,
        64..70 => FIN | ACK,
        70..74 => RST,
        74..77 => RST | ACK,
        // Every combination in turn, the reserved bits included.
        _ => rng.sweep(),
    }
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0..4 => 0,
        4..8 => rng.range(1, 64),
        _ => rng.range(65, 1400),
    };
    rng.bytes(len as usize)
}

/// A well-formed Ethernet + IP + TCP/UDP frame for `t`.
fn l4_frame<F: Fam>(rng: &mut Rng, t: Tuple<F::Addr>) -> Vec<u8> {
    let mut pkt = t.frame().build(&payload(rng));
    let dmac = *rng.pick(&[EXT_MAC, POD_MAC]);
    pkt[0..6].copy_from_slice(&dmac);
    pkt[6..12].copy_from_slice(&rng.pick(&F::NET.neighbours()).1);
    F::dress(rng, &mut pkt);
    if t.proto == proto::TCP {
        let tcp = ETH_HLEN + F::HLEN;
        rng.fill(&mut pkt[tcp + 4..tcp + 12]);
        pkt[tcp + 13] = tcp_flags_for(rng);
        rng.fill(&mut pkt[tcp + 14..tcp + 16]);
    }
    packet::fix_checksums(&mut pkt);
    pkt
}

/// An ICMP error from `src` to `dst` quoting a frame for `quoted`, as sent
/// by the peer node on the lan.
fn icmp_frame<F: Fam>(
    rng: &mut Rng,
    src: F::Addr,
    dst: F::Addr,
    quoted: Tuple<F::Addr>,
) -> Vec<u8> {
    let inner = l4_frame::<F>(rng, quoted);
    let mut pkt = F::icmp_error(rng, src, dst, &inner[ETH_HLEN..]);
    pkt[0..6].copy_from_slice(&EXT_MAC);
    pkt[6..12].copy_from_slice(&F::NET.neighbours()[0].1);
    pkt
}

/// Mutations of a TCP/UDP frame; anything may come out.
fn mutate<F: Fam>(rng: &mut Rng, pkt: Vec<u8>) -> Vec<u8> {
    let mut pkt = F::add_headers(rng, pkt);
    if rng.chance(10) {
        pkt[ETH_HLEN + F::TTL_AT] = *rng.pick(&[0, 1, 2, 255]);
    }
    if rng.chance(5) {
        // Ethernet padding beyond the IP packet's length.
        let pad = rng.range(1, 46) as usize;
        pkt.extend(std::iter::repeat_n(0, pad));
    }
    F::fix_if_sane(&mut pkt);
    if rng.chance(20) {
        F::lie(rng, &mut pkt);
    }
    if rng.chance(12) {
        F::break_checksum(rng, &mut pkt);
    }
    // Truncated, at every length class.
    if rng.chance(15) {
        let fixed = ETH_HLEN + F::HLEN;
        let l4 = F::l4_at(&pkt).clamp(fixed, pkt.len());
        let len = match rng.below(5) {
            0 => rng.below(ETH_HLEN as u64) as usize,
            1 => rng.range(ETH_HLEN as u64, (fixed - 1) as u64) as usize,
            2 => rng.range(fixed as u64, l4 as u64) as usize,
            3 => rng.range(l4 as u64, (l4 + 19) as u64) as usize,
            _ => rng.range(l4 as u64, pkt.len() as u64) as usize,
        };
        pkt.truncate(len);
    }
    pkt
}

pub struct Generator<'a, F: Fam> {
    pub world: &'a World<F>,
}

impl<F: Fam> Generator<'_, F> {
    pub fn next(&self, rng: &mut Rng, model: &Model<F::Addr>) -> (Class, Vec<u8>) {
        let class = match rng.below(100) {
            0..8 => Class::RandomBytes,
            8..40 => Class::ToFrontend,
            40..50 => Class::NotService,
            50..75 if !model.reply_keys.is_empty() => Class::Reply,
            50..75 => Class::ToFrontend,
            75..80 if !model.reply_keys.is_empty() => Class::NearReply,
            75..80 => Class::NotService,
            80..87 => Class::IcmpError,
            _ => Class::OtherFrame,
        };
        let pkt = match class {
            Class::RandomBytes => self.random_bytes(rng),
            Class::ToFrontend => {
                let t = self.to_frontend(rng);
                let pkt = l4_frame::<F>(rng, t);
                self.maybe_mutate(rng, pkt)
            }
            Class::NotService => {
                let t = self.not_service(rng);
                let pkt = l4_frame::<F>(rng, t);
                self.maybe_mutate(rng, pkt)
            }
            Class::Reply => {
                let t = *rng.pick(&model.reply_keys);
                let pkt = l4_frame::<F>(rng, t);
                self.maybe_mutate(rng, pkt)
            }
            Class::NearReply => {
                let mut t = *rng.pick(&model.reply_keys);
                match rng.below(5) {
                    0 => t.sport = t.sport.wrapping_add(1),
                    1 => t.dport = t.dport.wrapping_add(1),
                    2 => t.src = client_addr::<F>(rng),
                    3 => t.dst = client_addr::<F>(rng),
                    _ => t.proto = proto::TCP + proto::UDP - t.proto,
                }
                let pkt = l4_frame::<F>(rng, t);
                self.maybe_mutate(rng, pkt)
            }
            Class::IcmpError => {
                let mut pkt = self.icmp_error(rng, model);
                if rng.chance(30) {
                    let at = rng.below(pkt.len() as u64) as usize;
                    pkt.truncate(at.max(ETH_HLEN + F::HLEN + 4));
                }
                pkt
            }
            Class::OtherFrame => self.other_frame(rng),
        };
        (class, pkt)
    }

    fn maybe_mutate(&self, rng: &mut Rng, pkt: Vec<u8>) -> Vec<u8> {
        if !rng.chance(45) {
            return pkt;
        }
        let mut pkt = mutate::<F>(rng, pkt);
        if rng.chance(6) {
            for _ in 0..rng.range(1, 4) {
                if !pkt.is_empty() {
                    let at = rng.below(pkt.len() as u64) as usize;
                    pkt[at] = rng.next() as u8;
                }
            }
        }
        pkt.truncate(MAX_FRAME);
        pkt
    }

    fn random_bytes(&self, rng: &mut Rng) -> Vec<u8> {
        let len = rng.below(MAX_FRAME as u64 + 1) as usize;
        let mut pkt = rng.bytes(len);
        // Half of them get far enough to be read as this family's TCP/UDP.
        if rng.chance(50) && len >= ETH_HLEN {
            F::ip_like(rng, &mut pkt);
        }
        pkt
    }

    fn to_frontend(&self, rng: &mut Rng) -> Tuple<F::Addr> {
        let (dst, dport, proto) = *rng.pick(&self.world.frontend_list);
        let mut t = Tuple {
            src: client_addr::<F>(rng),
            sport: client_port(rng),
            dst,
            dport,
            proto,
        };
        match rng.below(10) {
            // An unused port of a cluster IP.
            0 => {
                t.dst = rng.pick(&self.world.specs).vip;
                t.dport = rng.next() as u16;
            }
            // The other protocol.
            1 => t.proto = proto::TCP + proto::UDP - t.proto,
            _ => {}
        }
        t
    }

    fn not_service(&self, rng: &mut Rng) -> Tuple<F::Addr> {
        let net = &F::NET;
        let proto = *rng.pick(&[proto::TCP, proto::UDP]);
        let (dst, dport) = match rng.below(10) {
            // Straight to an endpoint, not through the service.
            0..3 => {
                let spec = rng.pick(&self.world.specs);
                match &spec.endpoints[..] {
                    [] => (net.remote_a, 8080),
                    eps => {
                        let (a, p, _) = rng.pick(eps);
                        (*a, *p)
                    }
                }
            }
            3..7 => (F::random_addr(rng), rng.next() as u16),
            // The node, or an external / LB IP, on a port that is no frontend.
            _ => {
                let addr = *rng.pick(&[net.node, net.external_ip, net.lb_ip, net.local_lb_ip]);
                (addr, rng.next() as u16)
            }
        };
        Tuple {
            src: client_addr::<F>(rng),
            sport: client_port(rng),
            dst,
            dport,
            proto,
        }
    }

    /// An ICMP error quoting a service flow's headers, before or after translation.
    fn icmp_error(&self, rng: &mut Rng, model: &Model<F::Addr>) -> Vec<u8> {
        let net = &F::NET;
        let (client, translated) = match model.forward_keys.is_empty() {
            false => {
                let t = *rng.pick(&model.forward_keys);
                (t, model.forwards[&t])
            }
            true => {
                let t = self.to_frontend(rng);
                (
                    t,
                    Tuple {
                        src: net.node,
                        sport: 61000,
                        dst: net.remote_a,
                        dport: 8080,
                        proto: t.proto,
                    },
                )
            }
        };
        match rng.below(4) {
            // The backend answers the translated packet with an error.
            0 => icmp_frame::<F>(rng, translated.dst, translated.src, translated),
            // A router on the way to the backend does.
            1 => icmp_frame::<F>(rng, net.peer_node, translated.src, translated),
            // A router on the way back to the client, about the translated reply.
            2 => icmp_frame::<F>(rng, net.peer_node, client.dst, client.reversed()),
            // The client's side, about its request.
            _ => icmp_frame::<F>(rng, client.src, client.dst, client),
        }
    }

    fn other_frame(&self, rng: &mut Rng) -> Vec<u8> {
        match rng.below(6) {
            // A service request behind an 802.1Q tag, or two (QinQ).
            0 | 1 => {
                let t = self.to_frontend(rng);
                let mut pkt = l4_frame::<F>(rng, t);
                let tci = rng.next() as u16 & 0x0fff;
                let mut tag = vec![0x81, 0x00];
                tag.extend(tci.to_be_bytes());
                if rng.chance(50) {
                    let mut outer = vec![0x88, 0xa8];
                    outer.extend(rng.bytes(2));
                    outer.extend(tag);
                    tag = outer;
                }
                pkt.splice(12..12, tag);
                pkt
            }
            // The other family with garbage, sometimes a plausible header.
            2 | 3 => {
                let len = ETH_HLEN + rng.below(200) as usize;
                let mut pkt = rng.bytes(len);
                if rng.chance(50) {
                    F::Other::ip_like(rng, &mut pkt);
                } else {
                    pkt[12..14].copy_from_slice(&F::Other::ETHERTYPE);
                }
                pkt
            }
            // ARP.
            4 => {
                let mut pkt = rng.bytes(ETH_HLEN + 28);
                pkt[12..14].copy_from_slice(&[0x08, 0x06]);
                pkt
            }
            // Any other ethertype, with a service request behind it.
            _ => {
                let t = self.to_frontend(rng);
                let mut pkt = l4_frame::<F>(rng, t);
                let ethertype = loop {
                    let e = rng.next() as u16;
                    if e.to_be_bytes() != F::ETHERTYPE {
                        break e;
                    }
                };
                pkt[12..14].copy_from_slice(&ethertype.to_be_bytes());
                pkt
            }
        }
    }
}
