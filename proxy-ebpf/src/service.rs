//! Service load balancing for traffic from pods: DNAT of requests, reverse NAT of replies.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{Counter, CtDirection, CtKey, CtValue, ServiceKey};

use crate::{
    conntrack, lb,
    maps::SERVICES,
    nat::{self, Side},
    packet::{self, Packet},
    stats::count,
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> Result<i32, Counter> {
    let Some(pkt) = packet::parse(ctx)? else {
        return Ok(TC_ACT_OK);
    };
    count(Counter::Packets);
    let now = conntrack::now_ns();

    let reply_key = tuple(&pkt, CtDirection::Reply);
    if let Some(ct) = conntrack::lookup(&reply_key, now) {
        nat::rewrite(ctx, &pkt, Side::Source, ct.nat_addr_be, ct.nat_port_be)?;
        count(Counter::ReplyNat);
        return Ok(TC_ACT_OK);
    }

    let forward_key = tuple(&pkt, CtDirection::Forward);
    if let Some(ct) = conntrack::lookup(&forward_key, now) {
        // The agent removes a backend's entry once no service uses it; such
        // flows are balanced again rather than sent into the void.
        match lb::backend(ct.backend_id) {
            Some(b) if b.addr_be == ct.nat_addr_be && b.port_be == ct.nat_port_be => {
                nat::rewrite(ctx, &pkt, Side::Destination, b.addr_be, b.port_be)?;
                count(Counter::Established);
                return Ok(TC_ACT_OK);
            }
            _ => count(Counter::Rebalanced),
        }
    }

    let key = ServiceKey::frontend(pkt.daddr_be, pkt.dport_be, pkt.proto);
    // SAFETY: map values are plain data and copied out immediately.
    let Some(frontend) = (unsafe { SERVICES.get(&key) }).copied() else {
        return Ok(TC_ACT_OK);
    };
    let (backend_id, backend) = lb::select(&key, &frontend)?;

    let forward = CtValue {
        nat_addr_be: backend.addr_be,
        nat_port_be: backend.port_be,
        service_id: frontend.service_id,
        backend_id,
        flags: 0,
        last_seen_ns: now,
        created_ns: now,
    };
    let reply_key = CtKey::new(
        backend.addr_be,
        pkt.saddr_be,
        backend.port_be,
        pkt.sport_be,
        pkt.proto,
        CtDirection::Reply,
    );
    let reply = CtValue {
        nat_addr_be: pkt.daddr_be,
        nat_port_be: pkt.dport_be,
        ..forward
    };
    // Reply state first: a reply can never arrive before the request is forwarded.
    conntrack::insert(&reply_key, &reply)?;
    conntrack::insert(&forward_key, &forward)?;
    nat::rewrite(
        ctx,
        &pkt,
        Side::Destination,
        backend.addr_be,
        backend.port_be,
    )?;
    count(Counter::NewFlow);
    Ok(TC_ACT_OK)
}

#[inline(always)]
fn tuple(pkt: &Packet, direction: CtDirection) -> CtKey {
    CtKey::new(
        pkt.saddr_be,
        pkt.daddr_be,
        pkt.sport_be,
        pkt.dport_be,
        pkt.proto,
        direction,
    )
}
