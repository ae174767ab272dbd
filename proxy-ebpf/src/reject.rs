//! TC: answers a packet with a TCP RST or an ICMP port unreachable, built in
//! place and sent back out of the interface it arrived on, as upstream's
//! REJECT rules do for services without endpoints.

use aya_ebpf::{
    bindings::BPF_F_RECOMPUTE_CSUM,
    helpers::{bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    programs::TcContext,
};
use proxy_common::{Counter, action::TC_ACT_SHOT, proto};

use crate::{
    csum,
    frame::Frame,
    ip::{Ip, REPLY_MAX},
    packet::{ETH_HLEN, Packet, tcp_flags},
};

const TCP_HLEN: usize = 20;
const ICMP_HLEN: usize = 8;
/// The L4 bytes an ICMP error quotes after the original IP header.
const QUOTED_L4: usize = 8;
const TTL: u8 = 64;

const RST4_LEN: usize = ETH_HLEN + 20 + TCP_HLEN;
const RST6_LEN: usize = ETH_HLEN + 40 + TCP_HLEN;
const QUOTED4: usize = 20 + QUOTED_L4;
const QUOTED6: usize = 40 + QUOTED_L4;
const ICMP4_LEN: usize = ETH_HLEN + 20 + ICMP_HLEN + QUOTED4;
const ICMP6_LEN: usize = ETH_HLEN + 40 + ICMP_HLEN + QUOTED6;

#[inline(always)]
pub fn send<F: Ip>(ctx: &TcContext, pkt: &Packet<F>) -> Result<i32, Counter> {
    // The replies are built for a packet without IPv4 options or IPv6
    // extension headers (whose quote would not reach the ports).
    if pkt.l3_len() != F::HDR_LEN {
        return Err(Counter::DropRejectFailed);
    }
    let v4 = F::HDR_CSUM_OFF.is_some();
    if pkt.proto == proto::TCP {
        if pkt.tcp_flags & tcp_flags::RST != 0 {
            // Never answer a reset.
            return Ok(TC_ACT_SHOT);
        }
        if v4 {
            tcp_reset::<F, RST4_LEN>(ctx, pkt)?;
        } else {
            tcp_reset::<F, RST6_LEN>(ctx, pkt)?;
        }
    } else if v4 {
        port_unreachable::<F, ICMP4_LEN, QUOTED4>(ctx, pkt)?;
    } else {
        port_unreachable::<F, ICMP6_LEN, QUOTED6>(ctx, pkt)?;
    }
    // SAFETY: helper without preconditions; egress of the arrival interface.
    Ok(unsafe { bpf_redirect(ctx.ifindex(), 0) } as i32)
}

/// Copies `addr` into `buf` at `off`, in network byte order.
#[inline(always)]
fn put_addr<F: Ip>(buf: &mut [u8], off: usize, addr: &F::Addr) {
    for (i, word) in F::addr_words(addr).iter().enumerate() {
        buf[off + 4 * i..off + 4 * i + 4].copy_from_slice(&word.to_ne_bytes());
    }
}

/// Swapped MACs and an IP header from the original destination back to
/// its source, for `payload_len` bytes of `ip_proto`.
#[inline(always)]
fn headers<F: Ip>(
    ctx: &TcContext,
    buf: &mut [u8],
    pkt: &Packet<F>,
    ip_proto: u8,
    payload_len: u16,
    tos: u8,
) -> Result<(), Counter> {
    let macs: [u8; 12] = ctx.load(0).map_err(|_| Counter::DropRejectFailed)?;
    buf[0..6].copy_from_slice(&macs[6..12]);
    buf[6..12].copy_from_slice(&macs[0..6]);
    if F::HDR_CSUM_OFF.is_some() {
        buf[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut buf[ETH_HLEN..ETH_HLEN + 20];
        ip[0] = 0x45;
        ip[1] = tos;
        ip[2..4].copy_from_slice(&(payload_len + 20).to_be_bytes());
        ip[4..6].copy_from_slice(&[0, 0]);
        ip[6..8].copy_from_slice(&[0x40, 0]); // don't fragment
        ip[8] = TTL;
        ip[9] = ip_proto;
        ip[10..12].copy_from_slice(&[0, 0]);
        put_addr::<F>(ip, 12, &pkt.daddr_be);
        put_addr::<F>(ip, 16, &pkt.saddr_be);
        let check = !csum::fold(csum::add_bytes(0, ip));
        ip[10..12].copy_from_slice(&check.to_ne_bytes());
    } else {
        buf[12..14].copy_from_slice(&[0x86, 0xdd]);
        let ip = &mut buf[ETH_HLEN..ETH_HLEN + 40];
        ip[0] = 0x60 | (tos >> 4);
        ip[1] = tos << 4;
        ip[2..4].copy_from_slice(&[0, 0]);
        ip[4..6].copy_from_slice(&payload_len.to_be_bytes());
        ip[6] = ip_proto;
        ip[7] = TTL;
        put_addr::<F>(ip, 8, &pkt.daddr_be);
        put_addr::<F>(ip, 24, &pkt.saddr_be);
    }
    Ok(())
}

/// The first `N` bytes of this CPU's reply buffer, zeroed.
#[inline(always)]
fn reply_buffer<F: Ip, const N: usize>() -> Result<&'static mut [u8; N], Counter> {
    const { assert!(N <= REPLY_MAX) };
    let buf = &mut F::scratch().ok_or(Counter::DropRejectFailed)?.reply;
    // SAFETY: N fits in the buffer (checked above at compile time).
    let buf = unsafe { &mut *(buf.as_mut_ptr() as *mut [u8; N]) };
    crate::mem::zero(buf);
    Ok(buf)
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
fn tcp_reset<F: Ip, const N: usize>(ctx: &TcContext, pkt: &Packet<F>) -> Result<(), Counter> {
    let tcp: [u8; TCP_HLEN] = ctx
        .load(pkt.l4_off)
        .map_err(|_| Counter::DropRejectFailed)?;
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
    let data_off = ((tcp[12] >> 4) as u32) * 4;
    let payload = pkt
        .tot_len
        .saturating_sub(F::HDR_LEN as u32)
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

    let buf = reply_buffer::<F, N>()?;
    headers(ctx, buf, pkt, proto::TCP, TCP_HLEN as u16, 0)?;
    let t = &mut buf[ETH_HLEN + F::HDR_LEN..];
    t[0..2].copy_from_slice(&pkt.dport_be.to_ne_bytes());
    t[2..4].copy_from_slice(&pkt.sport_be.to_ne_bytes());
    t[4..8].copy_from_slice(&rst_seq.to_be_bytes());
    t[8..12].copy_from_slice(&rst_ack.to_be_bytes());
    t[12] = (TCP_HLEN as u8 / 4) << 4;
    t[13] = flags;
    let sum = F::pseudo_sum(&pkt.daddr_be, &pkt.saddr_be, proto::TCP, TCP_HLEN as u16);
    let check = !csum::fold(csum::add_bytes(sum, t));
    t[16..18].copy_from_slice(&check.to_ne_bytes());
    resize_and_store(ctx, buf)
}

/// ICMP destination / port unreachable (RFC 792), or its ICMPv6 twin
/// (RFC 4443 type 1 code 4), quoting the IP header and the first 8 bytes
/// of L4: enough for the sender to find its socket.
#[inline(always)]
fn port_unreachable<F: Ip, const N: usize, const Q: usize>(
    ctx: &TcContext,
    pkt: &Packet<F>,
) -> Result<(), Counter> {
    let buf = reply_buffer::<F, N>()?;
    let icmp_len = (ICMP_HLEN + Q) as u16;
    // Linux sends IPv4 ICMP errors with precedence "internetwork control".
    let tos = if F::HDR_CSUM_OFF.is_some() { 0xc0 } else { 0 };
    headers(ctx, buf, pkt, F::ICMP_PROTO, icmp_len, tos)?;
    let icmp = &mut buf[ETH_HLEN + F::HDR_LEN..];
    (icmp[0], icmp[1]) = F::PORT_UNREACHABLE;
    let quoted = &mut icmp[ICMP_HLEN..ICMP_HLEN + Q];
    // SAFETY: `quoted` holds exactly Q bytes; a constant length, which the
    // verifier needs (aya's load_bytes computes it).
    let loaded = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb as *const _,
            ETH_HLEN as u32,
            quoted.as_mut_ptr() as *mut _,
            Q as u32,
        )
    };
    if loaded != 0 {
        return Err(Counter::DropRejectFailed);
    }
    // ICMPv6 sums a pseudo-header (RFC 4443 §2.3); ICMP does not.
    let sum = if F::HDR_CSUM_OFF.is_some() {
        0
    } else {
        F::pseudo_sum(&pkt.daddr_be, &pkt.saddr_be, F::ICMP_PROTO, icmp_len)
    };
    let check = !csum::fold(csum::add_bytes(sum, icmp));
    icmp[2..4].copy_from_slice(&check.to_ne_bytes());
    resize_and_store(ctx, buf)
}
