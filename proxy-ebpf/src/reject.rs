//! TC: answers a packet with a TCP RST or an ICMP port unreachable, built in
//! place and sent back out of the interface it arrived on, as upstream's
//! REJECT rules do for services without endpoints.

use aya_ebpf::{
    bindings::BPF_F_RECOMPUTE_CSUM,
    helpers::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use proxy_common::{Counter, action::TC_ACT_SHOT, proto};

use crate::{
    csum,
    frame::Frame,
    packet::{ETH_HLEN, Packet, tcp_flags},
};

const IP_HLEN: usize = 20;
const TCP_HLEN: usize = 20;
const ICMP_HLEN: usize = 8;
const RST_LEN: usize = ETH_HLEN + IP_HLEN + TCP_HLEN;
/// The ICMP error quotes the original IP header and 8 bytes of its payload.
const ICMP_LEN: usize = ETH_HLEN + IP_HLEN + ICMP_HLEN + IP_HLEN + 8;
const TTL: u8 = 64;

#[inline(always)]
pub fn send(ctx: &TcContext, pkt: &Packet) -> Result<i32, Counter> {
    if pkt.ihl as usize != IP_HLEN {
        return Err(Counter::DropRejectFailed);
    }
    if pkt.proto == proto::TCP {
        if pkt.tcp_flags & tcp_flags::RST != 0 {
            // Never answer a reset.
            return Ok(TC_ACT_SHOT);
        }
        tcp_reset(ctx, pkt)?;
    } else {
        port_unreachable(ctx, pkt)?;
    }
    // SAFETY: helper without preconditions; egress of the arrival interface.
    Ok(unsafe { bpf_redirect(ctx.ifindex(), 0) } as i32)
}

/// Swapped MACs and an IPv4 header from the original destination back to its source.
#[inline(always)]
fn headers(
    ctx: &TcContext,
    buf: &mut [u8],
    pkt: &Packet,
    ip_proto: u8,
    tot_len: u16,
    tos: u8,
) -> Result<(), Counter> {
    let macs: [u8; 12] = ctx.load(0).map_err(|_| Counter::DropRejectFailed)?;
    buf[0..6].copy_from_slice(&macs[6..12]);
    buf[6..12].copy_from_slice(&macs[0..6]);
    buf[12] = 0x08;
    buf[13] = 0x00;
    let ip = &mut buf[ETH_HLEN..ETH_HLEN + IP_HLEN];
    ip[0] = 0x45;
    ip[1] = tos;
    ip[2..4].copy_from_slice(&tot_len.to_be_bytes());
    ip[4..6].copy_from_slice(&[0, 0]);
    ip[6..8].copy_from_slice(&[0x40, 0]); // don't fragment
    ip[8] = TTL;
    ip[9] = ip_proto;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&pkt.daddr_be.to_ne_bytes());
    ip[16..20].copy_from_slice(&pkt.saddr_be.to_ne_bytes());
    let check = !csum::fold(csum::add_bytes(0, ip));
    ip[10..12].copy_from_slice(&check.to_ne_bytes());
    Ok(())
}

#[inline(always)]
fn resize_and_store<const N: usize>(ctx: &TcContext, buf: &[u8; N]) -> Result<(), Counter> {
    // SAFETY: the context is the program's own skb.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb as *mut _, N as u32, 0) } != 0 {
        return Err(Counter::DropRejectFailed);
    }
    ctx.store(0, buf, BPF_F_RECOMPUTE_CSUM as u64)
        .map_err(|_| Counter::DropRejectFailed)
}

/// RFC 793 reset: acknowledge what was sent if it carried no ACK, else
/// take the sequence number the peer expects.
#[inline(always)]
fn tcp_reset(ctx: &TcContext, pkt: &Packet) -> Result<(), Counter> {
    let tcp: [u8; TCP_HLEN] = ctx
        .load(pkt.l4_off)
        .map_err(|_| Counter::DropRejectFailed)?;
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
    let data_off = ((tcp[12] >> 4) as u32) * 4;
    let payload = (pkt.tot_len as u32)
        .saturating_sub(IP_HLEN as u32)
        .saturating_sub(data_off);
    let (rst_seq, rst_ack, flags) = if pkt.tcp_flags & tcp_flags::ACK != 0 {
        (ack, 0, tcp_flags::RST)
    } else {
        let consumed = payload
            + (pkt.tcp_flags & tcp_flags::SYN != 0) as u32
            + (pkt.tcp_flags & tcp_flags::FIN != 0) as u32;
        (
            0,
            seq.wrapping_add(consumed),
            tcp_flags::RST | tcp_flags::ACK,
        )
    };

    let mut buf = [0u8; RST_LEN];
    headers(
        ctx,
        &mut buf,
        pkt,
        proto::TCP,
        (IP_HLEN + TCP_HLEN) as u16,
        0,
    )?;
    let t = &mut buf[ETH_HLEN + IP_HLEN..];
    t[0..2].copy_from_slice(&pkt.dport_be.to_ne_bytes());
    t[2..4].copy_from_slice(&pkt.sport_be.to_ne_bytes());
    t[4..8].copy_from_slice(&rst_seq.to_be_bytes());
    t[8..12].copy_from_slice(&rst_ack.to_be_bytes());
    t[12] = (TCP_HLEN as u8 / 4) << 4;
    t[13] = flags;
    let mut sum = csum::add_u32(0, pkt.daddr_be);
    sum = csum::add_u32(sum, pkt.saddr_be);
    sum += (proto::TCP as u16).to_be() as u32 + (TCP_HLEN as u16).to_be() as u32;
    let check = !csum::fold(csum::add_bytes(sum, t));
    t[16..18].copy_from_slice(&check.to_ne_bytes());
    resize_and_store(ctx, &buf)
}

#[inline(always)]
fn port_unreachable(ctx: &TcContext, pkt: &Packet) -> Result<(), Counter> {
    let quoted: [u8; IP_HLEN + 8] = ctx.load(ETH_HLEN).map_err(|_| Counter::DropRejectFailed)?;
    let mut buf = [0u8; ICMP_LEN];
    // Linux sends ICMP errors with precedence "internetwork control".
    headers(
        ctx,
        &mut buf,
        pkt,
        proto::ICMP,
        (ICMP_LEN - ETH_HLEN) as u16,
        0xc0,
    )?;
    let icmp = &mut buf[ETH_HLEN + IP_HLEN..];
    icmp[0] = 3; // destination unreachable
    icmp[1] = 3; // port unreachable
    icmp[ICMP_HLEN..].copy_from_slice(&quoted);
    let check = !csum::fold(csum::add_bytes(0, icmp));
    icmp[2..4].copy_from_slice(&check.to_ne_bytes());
    resize_and_store(ctx, &buf)
}
