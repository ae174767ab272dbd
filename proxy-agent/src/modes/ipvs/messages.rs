//! The generic netlink requests that program IPVS, byte for byte as
//! upstream's ipvs proxier sends them through its libipvs (moby/ipvs):
//! `IPVS_CMD_NEW_SERVICE` with the service's nested attributes, and
//! `IPVS_CMD_NEW_DEST` with the service and the destination (masquerading,
//! the weight). Layouts from `include/uapi/linux/ip_vs.h`. There is no
//! maintained Rust crate for IPVS's netlink family; the framing is the one
//! [`genl_message`] already writes for the cleanup.

use std::net::IpAddr;

use super::{
    cleanup::{IPVS_GENL_VERSION, NLM_F_ACK, NLM_F_REQUEST, genl_message},
    virtual_servers::{RealServer, VirtualServer},
};
use crate::model::Protocol;

pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub const IPVS_CMD_NEW_DEST: u8 = 5;
pub const IPVS_CMD_DEL_DEST: u8 = 7;

const IPVS_CMD_ATTR_SERVICE: u16 = 1;
const IPVS_CMD_ATTR_DEST: u16 = 2;

const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_SVC_ATTR_FLAGS: u16 = 7;
const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;

const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`.
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_SCHED2` (`IP_VS_SVC_F_SCHED_MH_PORT`): upstream sets it
/// for the `mh` scheduler (its `FlagSourceHash`), hashing the source port too.
pub const IP_VS_SVC_F_SCHED_MH_PORT: u32 = 0x10;
/// `IP_VS_CONN_F_MASQ`: upstream's real servers are NATed.
const IP_VS_CONN_F_MASQ: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// One netlink attribute, padded to 4 bytes; nested ones are built from these.
fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + payload.len() + 3);
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize((out.len() + 3) & !3, 0);
    out
}

fn af(ip: &IpAddr) -> u16 {
    match ip {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// 4 bytes for IPv4, 16 for IPv6 (libipvs' rawIPData).
fn raw_ip(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn protocol_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The nested `IPVS_CMD_ATTR_SERVICE` of a virtual server.
fn service_attr(vs: &VirtualServer) -> Vec<u8> {
    let mut flags = if vs.persistence_s.is_some() {
        IP_VS_SVC_F_PERSISTENT
    } else {
        0
    };
    if vs.scheduler == "mh" {
        flags |= IP_VS_SVC_F_SCHED_MH_PORT;
    }
    // struct ip_vs_flags { flags, mask }
    let mut flags_mask = flags.to_ne_bytes().to_vec();
    flags_mask.extend_from_slice(&u32::MAX.to_ne_bytes());
    let netmask: u32 = match vs.address {
        IpAddr::V4(_) => 0xffff_ffff,
        IpAddr::V6(_) => 128,
    };
    let mut sched = vs.scheduler.as_bytes().to_vec();
    sched.push(0);
    let mut body = Vec::new();
    body.extend(nla(IPVS_SVC_ATTR_AF, &af(&vs.address).to_ne_bytes()));
    body.extend(nla(
        IPVS_SVC_ATTR_PROTOCOL,
        &protocol_number(vs.protocol).to_ne_bytes(),
    ));
    body.extend(nla(IPVS_SVC_ATTR_ADDR, &raw_ip(&vs.address)));
    body.extend(nla(IPVS_SVC_ATTR_PORT, &vs.port.to_be_bytes()));
    body.extend(nla(IPVS_SVC_ATTR_SCHED_NAME, &sched));
    body.extend(nla(IPVS_SVC_ATTR_FLAGS, &flags_mask));
    body.extend(nla(
        IPVS_SVC_ATTR_TIMEOUT,
        &vs.persistence_s.unwrap_or(0).to_ne_bytes(),
    ));
    body.extend(nla(IPVS_SVC_ATTR_NETMASK, &netmask.to_ne_bytes()));
    body
}

fn dest_attr(r: &RealServer) -> Vec<u8> {
    let ip = r.address.ip();
    let mut body = Vec::new();
    body.extend(nla(IPVS_DEST_ATTR_ADDR, &raw_ip(&ip)));
    body.extend(nla(IPVS_DEST_ATTR_PORT, &r.address.port().to_be_bytes()));
    body.extend(nla(
        IPVS_DEST_ATTR_FWD_METHOD,
        &IP_VS_CONN_F_MASQ.to_ne_bytes(),
    ));
    body.extend(nla(IPVS_DEST_ATTR_WEIGHT, &r.weight.to_ne_bytes()));
    body.extend(nla(IPVS_DEST_ATTR_ADDR_FAMILY, &af(&ip).to_ne_bytes()));
    body.extend(nla(IPVS_DEST_ATTR_U_THRESH, &0u32.to_ne_bytes()));
    body.extend(nla(IPVS_DEST_ATTR_L_THRESH, &0u32.to_ne_bytes()));
    body
}

fn request(family: u16, seq: u32, cmd: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    genl_message(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        cmd,
        IPVS_GENL_VERSION,
        attrs,
    )
}

/// `IPVS_CMD_NEW_SERVICE` (or `_DEL_SERVICE`) for `vs`; `family` is the
/// IPVS generic netlink family id the kernel gave.
pub fn service_request(family: u16, seq: u32, cmd: u8, vs: &VirtualServer) -> Vec<u8> {
    request(
        family,
        seq,
        cmd,
        &[(IPVS_CMD_ATTR_SERVICE, &service_attr(vs))],
    )
}

/// `IPVS_CMD_NEW_DEST` (or `_DEL_DEST`) adding `real` to `vs`.
pub fn dest_request(
    family: u16,
    seq: u32,
    cmd: u8,
    vs: &VirtualServer,
    real: &RealServer,
) -> Vec<u8> {
    request(
        family,
        seq,
        cmd,
        &[
            (IPVS_CMD_ATTR_SERVICE, &service_attr(vs)),
            (IPVS_CMD_ATTR_DEST, &dest_attr(real)),
        ],
    )
}

/// Every request that programs `servers` from nothing, in order.
pub fn program(family: u16, servers: &[VirtualServer]) -> Vec<Vec<u8>> {
    let mut seq = 0;
    let mut out = Vec::new();
    for vs in servers {
        seq += 1;
        out.push(service_request(family, seq, IPVS_CMD_NEW_SERVICE, vs));
        for r in &vs.reals {
            seq += 1;
            out.push(dest_request(family, seq, IPVS_CMD_NEW_DEST, vs, r));
        }
    }
    out
}

pub const IPVS_CMD_SET_SERVICE: u8 = 2;
pub const IPVS_CMD_SET_DEST: u8 = 6;
pub const IPVS_CMD_GET_DEST: u8 = 8;
const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
const NLM_F_DUMP: u16 = 0x300;

/// The request for one reconcile operation.
pub fn op_request(family: u16, seq: u32, op: &super::reconcile::Op) -> Vec<u8> {
    use super::reconcile::Op::*;
    match op {
        AddService(vs) => service_request(family, seq, IPVS_CMD_NEW_SERVICE, vs),
        UpdateService(vs) => service_request(family, seq, IPVS_CMD_SET_SERVICE, vs),
        DeleteService(vs) => service_request(family, seq, IPVS_CMD_DEL_SERVICE, vs),
        AddReal(vs, r) => dest_request(family, seq, IPVS_CMD_NEW_DEST, vs, r),
        UpdateReal(vs, r) => dest_request(family, seq, IPVS_CMD_SET_DEST, vs, r),
        DeleteReal(vs, r) => dest_request(family, seq, IPVS_CMD_DEL_DEST, vs, r),
    }
}

/// `IPVS_CMD_GET_SERVICE` as a dump: every virtual server.
pub fn list_services(family: u16, seq: u32) -> Vec<u8> {
    super::cleanup::list_services_request(family, seq)
}

/// `IPVS_CMD_GET_DEST` as a dump: the real servers of `vs`.
pub fn list_dests(family: u16, seq: u32, vs: &VirtualServer) -> Vec<u8> {
    genl_message(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        IPVS_CMD_GET_DEST,
        IPVS_GENL_VERSION,
        &[(IPVS_CMD_ATTR_SERVICE, &service_attr(vs))],
    )
}

/// The attributes in `buf`: (type without the nested/byte-order flags, payload).
fn attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= buf.len() {
        let len = u16::from_ne_bytes([buf[off], buf[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([buf[off + 2], buf[off + 3]]) & 0x3fff;
        if len < 4 || off + len > buf.len() {
            break;
        }
        out.push((ty, &buf[off + 4..off + len]));
        off += (len + 3) & !3;
    }
    out
}

/// The nested attribute `ty` of a generic netlink message of `family`.
fn nested(msg: &[u8], family: u16, ty: u16) -> Option<Vec<(u16, &[u8])>> {
    let msg_type = u16::from_ne_bytes([*msg.get(4)?, *msg.get(5)?]);
    if msg_type != family || msg.len() < 20 {
        return None;
    }
    attrs(&msg[20..])
        .into_iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, body)| attrs(body))
}

fn get<'a>(a: &[(u16, &'a [u8])], ty: u16) -> Option<&'a [u8]> {
    a.iter().find(|(t, _)| *t == ty).map(|(_, v)| *v)
}

fn u32_of(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

fn ip_of(af: u16, b: &[u8]) -> Option<IpAddr> {
    match af {
        AF_INET => Some(IpAddr::from(<[u8; 4]>::try_from(b.get(..4)?).ok()?)),
        AF_INET6 => Some(IpAddr::from(<[u8; 16]>::try_from(b.get(..16)?).ok()?)),
        _ => None,
    }
}

/// A virtual server from one `IPVS_CMD_GET_SERVICE` reply (fwmark
/// services, which we never create, are skipped).
pub fn parse_service(msg: &[u8], family: u16) -> Option<VirtualServer> {
    let a = nested(msg, family, IPVS_CMD_ATTR_SERVICE)?;
    let af = u16::from_ne_bytes(get(&a, IPVS_SVC_ATTR_AF)?.get(..2)?.try_into().ok()?);
    let protocol =
        match u16::from_ne_bytes(get(&a, IPVS_SVC_ATTR_PROTOCOL)?.get(..2)?.try_into().ok()?) {
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            132 => Protocol::Sctp,
            _ => return None,
        };
    let address = ip_of(af, get(&a, IPVS_SVC_ATTR_ADDR)?)?;
    let port = u16::from_be_bytes(get(&a, IPVS_SVC_ATTR_PORT)?.get(..2)?.try_into().ok()?);
    let scheduler = String::from_utf8_lossy(get(&a, IPVS_SVC_ATTR_SCHED_NAME)?)
        .trim_end_matches('\0')
        .to_owned();
    let flags = get(&a, IPVS_SVC_ATTR_FLAGS).and_then(u32_of).unwrap_or(0);
    let timeout = get(&a, IPVS_SVC_ATTR_TIMEOUT).and_then(u32_of).unwrap_or(0);
    Some(VirtualServer {
        address,
        port,
        protocol,
        frontend: super::virtual_servers::Frontend::ClusterIp,
        scheduler,
        persistence_s: (flags & IP_VS_SVC_F_PERSISTENT != 0).then_some(timeout),
        reals: Vec::new(),
    })
}

/// A real server and its connections from one `IPVS_CMD_GET_DEST` reply.
pub fn parse_dest(
    msg: &[u8],
    family: u16,
    vs: &VirtualServer,
) -> Option<super::reconcile::AppliedReal> {
    let a = nested(msg, family, IPVS_CMD_ATTR_DEST)?;
    let af = get(&a, IPVS_DEST_ATTR_ADDR_FAMILY)
        .and_then(|b| Some(u16::from_ne_bytes(b.get(..2)?.try_into().ok()?)))
        .unwrap_or(af(&vs.address));
    let ip = ip_of(af, get(&a, IPVS_DEST_ATTR_ADDR)?)?;
    let port = u16::from_be_bytes(get(&a, IPVS_DEST_ATTR_PORT)?.get(..2)?.try_into().ok()?);
    let conns = |ty| get(&a, ty).and_then(u32_of).unwrap_or(0);
    Some(super::reconcile::AppliedReal {
        real: RealServer {
            address: std::net::SocketAddr::new(ip, port),
            weight: get(&a, IPVS_DEST_ATTR_WEIGHT).and_then(u32_of).unwrap_or(0),
        },
        connections: conns(IPVS_DEST_ATTR_ACTIVE_CONNS) + conns(IPVS_DEST_ATTR_INACT_CONNS),
    })
}

/// A reply describing what `request` names, as a kernel fills it: the
/// addresses are the 16-byte `nf_inet_addr`, the nested flag is set, a
/// destination carries its connection counts. For [`super::fake`].
pub fn kernel_reply(family: u16, request: &[u8], connections: u32) -> Vec<u8> {
    let mut out_attrs = Vec::new();
    for (ty, payload) in attrs(&request[20..]) {
        let mut inner = Vec::new();
        for (ity, ip) in attrs(payload) {
            let widen = (ty == IPVS_CMD_ATTR_SERVICE && ity == IPVS_SVC_ATTR_ADDR)
                || (ty == IPVS_CMD_ATTR_DEST && ity == IPVS_DEST_ATTR_ADDR);
            let mut v = ip.to_vec();
            if widen {
                v.resize(16, 0);
            }
            inner.extend(nla(ity, &v));
        }
        if ty == IPVS_CMD_ATTR_DEST {
            inner.extend(nla(IPVS_DEST_ATTR_ACTIVE_CONNS, &connections.to_ne_bytes()));
            inner.extend(nla(IPVS_DEST_ATTR_INACT_CONNS, &0u32.to_ne_bytes()));
        }
        out_attrs.extend(nla(ty | 0x8000, &inner));
    }
    let mut msg = Vec::new();
    msg.extend_from_slice(&((20 + out_attrs.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&family.to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&request[8..16]);
    msg.extend_from_slice(&request[16..20]);
    msg.extend(out_attrs);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::ipvs::virtual_servers::Frontend;

    /// The bytes spelled out from ip_vs.h and netlink(7), independently of
    /// the builder: little-endian host order (x86-64), ports big-endian.
    #[test]
    fn new_service_and_dest_are_upstreams_bytes() {
        let vs = VirtualServer {
            address: "198.19.0.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            frontend: Frontend::ClusterIp,
            scheduler: "rr".into(),
            persistence_s: Some(10_800),
            reals: vec![RealServer {
                address: "198.18.2.10:8080".parse().unwrap(),
                weight: 1,
            }],
        };
        let svc = service_request(0x25, 7, IPVS_CMD_NEW_SERVICE, &vs);
        #[rustfmt::skip]
        let want_service: Vec<u8> = [
            // nlmsghdr: len 92, type 0x25, flags REQUEST|ACK, seq 7, pid 0
            &[92, 0, 0, 0, 0x25, 0, 5, 0, 7, 0, 0, 0, 0, 0, 0, 0][..],
            // genlmsghdr: cmd NEW_SERVICE, version 1
            &[1, 1, 0, 0],
            // IPVS_CMD_ATTR_SERVICE, 72 bytes
            &[72, 0, 1, 0],
            &[6, 0, 1, 0, 2, 0, 0, 0],              // AF_INET
            &[6, 0, 2, 0, 6, 0, 0, 0],              // TCP
            &[8, 0, 3, 0, 198, 19, 0, 10],          // address
            &[6, 0, 4, 0, 0, 80, 0, 0],             // port 80, network order
            &[7, 0, 6, 0, b'r', b'r', 0, 0],        // "rr\0"
            &[12, 0, 7, 0, 1, 0, 0, 0, 255, 255, 255, 255], // persistent, mask
            &[8, 0, 8, 0, 0x30, 0x2a, 0, 0],        // 10800 s
            &[8, 0, 9, 0, 255, 255, 255, 255],      // netmask
        ]
        .concat();
        assert_eq!(svc, want_service);

        let dest = dest_request(0x25, 8, IPVS_CMD_NEW_DEST, &vs, &vs.reals[0]);
        #[rustfmt::skip]
        let want_dest_attr: Vec<u8> = [
            &[60, 0, 2, 0][..],
            &[8, 0, 1, 0, 198, 18, 2, 10],
            &[6, 0, 2, 0, 0x1f, 0x90, 0, 0],        // 8080
            &[8, 0, 3, 0, 0, 0, 0, 0],              // masquerade
            &[8, 0, 4, 0, 1, 0, 0, 0],              // weight 1
            &[6, 0, 11, 0, 2, 0, 0, 0],             // AF_INET
            &[8, 0, 5, 0, 0, 0, 0, 0],
            &[8, 0, 6, 0, 0, 0, 0, 0],
        ]
        .concat();
        assert_eq!(dest.len(), 16 + 4 + 72 + 60);
        assert_eq!(&dest[..4], &[(16 + 4 + 72 + 60) as u8, 0, 0, 0]);
        assert_eq!(dest[16], IPVS_CMD_NEW_DEST);
        assert_eq!(&dest[20..92], &want_service[20..]);
        assert_eq!(&dest[92..], &want_dest_attr[..]);
    }

    #[test]
    fn ipv6_addresses_are_sixteen_bytes_with_a_prefix_netmask() {
        let vs = VirtualServer {
            address: "2001:db8:ffff::10".parse().unwrap(),
            port: 53,
            protocol: Protocol::Udp,
            frontend: Frontend::ClusterIp,
            scheduler: "sh".into(),
            persistence_s: None,
            reals: Vec::new(),
        };
        let attr = service_attr(&vs);
        assert_eq!(&attr[..8], &[6, 0, 1, 0, 10, 0, 0, 0]);
        assert_eq!(&attr[8..16], &[6, 0, 2, 0, 17, 0, 0, 0]);
        assert_eq!(&attr[16..20], &[20, 0, 3, 0]);
        assert_eq!(
            &attr[20..36],
            &"2001:db8:ffff::10"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert_eq!(&attr[attr.len() - 8..], &[8, 0, 9, 0, 128, 0, 0, 0]);
        // "mh" hashes the source port too (upstream's FlagSourceHash).
        let mh = service_attr(&VirtualServer {
            scheduler: "mh".into(),
            ..vs.clone()
        });
        let flags_at = mh.windows(4).position(|w| w == [12, 0, 7, 0]).unwrap() + 4;
        assert_eq!(&mh[flags_at..flags_at + 4], &[0x10, 0, 0, 0]);
        assert_eq!(program(0x25, &[vs]).len(), 1);
    }
}
