//! XDP's first question (`proxy_common::filter`): may this packet be one
//! it finishes? Anything else goes on to TC without a hash lookup.

use proxy_common::{
    DatapathConfig,
    filter::{backend_bit, frontend_bit, word_of},
};

use crate::{flow, ip::Ip, packet::Packet};

/// To a frontend, from a backend (a reply), or to a masquerade port of the
/// masquerade address (a reply of a masqueraded flow), as far as the
/// agent's filter can tell. (The masquerade ports span most of 1024–65535:
/// the port alone would send most of a node's traffic to the lookups.)
#[inline(always)]
pub fn may_finish<F: Ip>(config: &DatapathConfig, pkt: &Packet<F>) -> bool {
    has::<F>(frontend_bit::<F>(&pkt.daddr_be, pkt.dport_be, pkt.proto))
        || has::<F>(backend_bit::<F>(&pkt.saddr_be, pkt.sport_be, pkt.proto))
        || (pkt.daddr_be == F::masquerade_addr(config)
            && flow::is_snat_port(config, u16::from_be(pkt.dport_be)))
}

#[inline(always)]
fn has<F: Ip>(bit: u32) -> bool {
    let (word, mask) = word_of(bit);
    F::filter().get(word).is_some_and(|w| w & mask != 0)
}
