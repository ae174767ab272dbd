//! A stand-in for the kernel's IPVS behind generic netlink, for tests on
//! kernels without IPVS (these): it parses the proxier's requests with the
//! same decoders that read a real kernel's replies, keeps the virtual and
//! real servers they create, answers dumps as the kernel does (16-byte
//! addresses, nested flags) and records every request byte for byte.

use std::{
    collections::BTreeMap,
    io,
    net::{IpAddr, SocketAddr},
};

use super::{
    cleanup::{GenlTransport, IPVS_CMD_GET_SERVICE},
    messages::{
        self, IPVS_CMD_DEL_DEST, IPVS_CMD_DEL_SERVICE, IPVS_CMD_GET_DEST, IPVS_CMD_NEW_DEST,
        IPVS_CMD_NEW_SERVICE, IPVS_CMD_SET_DEST, IPVS_CMD_SET_SERVICE,
    },
    virtual_servers::{RealServer, VirtualServer},
};
use crate::model::Protocol;

type Key = (IpAddr, u16, Protocol);

#[derive(Debug, Default)]
pub struct FakeIpvs {
    pub family: u16,
    pub requests: Vec<Vec<u8>>,
    pub services: BTreeMap<Key, VirtualServer>,
    /// Per service, its real servers' weight and connections.
    pub reals: BTreeMap<Key, BTreeMap<SocketAddr, (u32, u32)>>,
}

impl FakeIpvs {
    pub fn new(family: u16) -> Self {
        Self {
            family,
            ..Self::default()
        }
    }

    /// Pretends `real` of the service at `vip:port` has `n` connections.
    pub fn set_connections(
        &mut self,
        vip: IpAddr,
        port: u16,
        protocol: Protocol,
        real: SocketAddr,
        n: u32,
    ) {
        if let Some(r) = self
            .reals
            .get_mut(&(vip, port, protocol))
            .and_then(|m| m.get_mut(&real))
        {
            r.1 = n;
        }
    }

    fn ack(request: &[u8], errno: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&(36u32).to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes()); // NLMSG_ERROR
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&request[8..16]);
        m.extend_from_slice(&(-errno).to_ne_bytes());
        m.extend_from_slice(&request[..16]);
        m
    }

    fn done(request: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&20u32.to_ne_bytes());
        m.extend_from_slice(&3u16.to_ne_bytes()); // NLMSG_DONE
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&request[8..16]);
        m.extend_from_slice(&0u32.to_ne_bytes());
        m
    }
}

fn key(vs: &VirtualServer) -> Key {
    (vs.address, vs.port, vs.protocol)
}

impl GenlTransport for FakeIpvs {
    fn request(&mut self, msg: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.requests.push(msg.to_vec());
        let f = self.family;
        let cmd = msg[16];
        let vs = messages::parse_service(msg, f);
        let real = vs
            .as_ref()
            .and_then(|v| messages::parse_dest(msg, f, v))
            .map(|a| a.real);
        let errno = match (cmd, vs, real) {
            (IPVS_CMD_GET_SERVICE, ..) => {
                let mut out: Vec<Vec<u8>> = self
                    .services
                    .values()
                    .map(|v| {
                        messages::kernel_reply(
                            f,
                            &messages::service_request(f, 0, IPVS_CMD_GET_SERVICE, v),
                            0,
                        )
                    })
                    .collect();
                out.push(Self::done(msg));
                return Ok(out);
            }
            (IPVS_CMD_GET_DEST, Some(v), _) => {
                let mut out = Vec::new();
                for (addr, (weight, conns)) in self.reals.get(&key(&v)).into_iter().flatten() {
                    let r = RealServer {
                        address: *addr,
                        weight: *weight,
                    };
                    let req = messages::dest_request(f, 0, IPVS_CMD_GET_DEST, &v, &r);
                    out.push(messages::kernel_reply(f, &req, *conns));
                }
                out.push(Self::done(msg));
                return Ok(out);
            }
            (IPVS_CMD_NEW_SERVICE, Some(v), _) if self.services.contains_key(&key(&v)) => {
                libc::EEXIST
            }
            (IPVS_CMD_NEW_SERVICE | IPVS_CMD_SET_SERVICE, Some(v), _) => {
                self.reals.entry(key(&v)).or_default();
                self.services.insert(key(&v), v);
                0
            }
            (IPVS_CMD_DEL_SERVICE, Some(v), _) => {
                self.reals.remove(&key(&v));
                if self.services.remove(&key(&v)).is_some() {
                    0
                } else {
                    libc::ESRCH
                }
            }
            (IPVS_CMD_NEW_DEST | IPVS_CMD_SET_DEST, Some(v), Some(r)) => {
                match self.reals.get_mut(&key(&v)) {
                    Some(m) => {
                        let conns = m.get(&r.address).map_or(0, |e| e.1);
                        m.insert(r.address, (r.weight, conns));
                        0
                    }
                    None => libc::ESRCH,
                }
            }
            (IPVS_CMD_DEL_DEST, Some(v), Some(r)) => {
                match self
                    .reals
                    .get_mut(&key(&v))
                    .and_then(|m| m.remove(&r.address))
                {
                    Some(_) => 0,
                    None => libc::ENOENT,
                }
            }
            _ => libc::EINVAL,
        };
        Ok(vec![Self::ack(msg, errno)])
    }
}
