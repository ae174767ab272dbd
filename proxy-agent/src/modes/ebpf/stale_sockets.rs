//! Connected UDP sockets the socket hooks pointed at a backend that has
//! since left the service: without kernel conntrack there is no entry to
//! flush, and a connected socket's sends never meet the hooks again, so a
//! client such as a DNS resolver would keep talking to a dead backend.
//!
//! After a sync, [`forget_and_terminate`] drops the per-socket choices of
//! those backends (so unconnected sends choose again) and destroys, with
//! sock_diag's SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY), the connected UDP
//! sockets the hooks translated for them: the application's next receive
//! or send fails with ECONNABORTED and it opens a new socket, as it would
//! after an ICMP error. It sees sockets of the agent's own network namespace,
//! the node's; pods' sockets are in theirs (see `hostNamespaceOnly`).
//! Both families, each from its own map and its own sock_diag dump.

use std::{
    io,
    net::{IpAddr, SocketAddr},
};

use aya::Pod;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    message::SockDiagDestroy,
};
use netlink_sys::{Socket, protocols::NETLINK_SOCK_DIAG};
use proxy_common::{SockDirection, SockKeyOf, SockValueOf, V4, V6, proto};

use super::{
    KernelMaps,
    maps::{FamilyMapsOf, matching_entries},
};
use crate::model::IpFamily;

/// A UDP service frontend whose sockets to any endpoint address but `keep`
/// go: the same rule as its flows' (`flow_flush::GoneFlows`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GoneUdp {
    pub service: SocketAddr,
    /// Sorted.
    pub keep: Vec<IpAddr>,
}

impl GoneUdp {
    fn covers(&self, service: SocketAddr, backend: IpAddr) -> bool {
        self.service == service && self.keep.binary_search(&backend).is_err()
    }
}

/// What [`forget_and_terminate`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Terminated {
    /// Per-socket backend choices dropped.
    pub forgotten: usize,
    /// Connected sockets destroyed.
    pub destroyed: usize,
}

/// Both families: each family's sockets are in its own map (`SOCKETS`,
/// `SOCKETS6`) and its own sock_diag dump.
pub fn forget_and_terminate(gone: &[GoneUdp], maps: &mut KernelMaps) -> io::Result<Terminated> {
    let mut done = Terminated {
        forgotten: forget::<V4>(gone, maps)? + forget::<V6>(gone, maps)?,
        destroyed: 0,
    };
    let mut diag = Diag::open()?;
    done.destroyed += terminate::<V4>(gone, &mut diag, maps)?;
    done.destroyed += terminate::<V6>(gone, &mut diag, maps)?;
    Ok(done)
}

/// Drops the kept choices (unconnected sends) of the gone backends. The
/// map holds an entry for every socket the hooks translated (up to 262,144),
/// so it is read in batches, not two calls per entry.
fn forget<F: FamilyMapsOf>(gone: &[GoneUdp], maps: &mut KernelMaps) -> io::Result<usize>
where
    SockKeyOf<F>: Pod,
    SockValueOf<F>: Pod,
{
    let sockets = F::sockets(maps);
    let doomed = matching_entries(F::SOCKETS, sockets, &|k, v| {
        let forward = k.direction == (SockDirection::Forward as u8);
        forward && was_gone::<F>(gone, k, v)
    })
    .map_err(io::Error::other)?;
    Ok(doomed
        .iter()
        .filter(|key| sockets.remove(key).is_ok())
        .count())
}

/// Destroys the connected sockets the hooks pointed at a gone backend.
fn terminate<F: FamilyMapsOf>(
    gone: &[GoneUdp],
    diag: &mut Diag,
    maps: &mut KernelMaps,
) -> io::Result<usize>
where
    SockKeyOf<F>: Pod,
    SockValueOf<F>: Pod,
{
    let sockets = F::sockets(maps);
    let mut destroyed = 0;
    for id in diag.udp_sockets(F::FAMILY)? {
        let Some(addr) = F::ip(&id.destination_address) else {
            continue;
        };
        let port = id.destination_port;
        let key = SockKeyOf::<F>::new(
            cookie(&id.cookie),
            F::to_be(addr),
            port.to_be(),
            proto::UDP,
            SockDirection::Reverse,
        );
        // Only sockets the hooks pointed there, for a service it left.
        let Ok(service) = sockets.get(&key, 0) else {
            continue;
        };
        let service = socket_addr::<F>(service.addr_be, service.port_be);
        if gone.iter().any(|g| g.covers(service, addr.into())) {
            diag.destroy(F::FAMILY, id)?;
            let _ = sockets.remove(&key);
            destroyed += 1;
        }
    }
    Ok(destroyed)
}

fn socket_addr<F: FamilyMapsOf>(addr_be: F::Addr, port_be: u16) -> SocketAddr {
    SocketAddr::new(F::from_be(addr_be).into(), u16::from_be(port_be))
}

/// Whether a socket's kept choice (`key`: the service, `value`: the backend) is gone.
fn was_gone<F: FamilyMapsOf>(gone: &[GoneUdp], key: &SockKeyOf<F>, value: &SockValueOf<F>) -> bool {
    key.proto == proto::UDP
        && gone.iter().any(|g| {
            g.covers(
                socket_addr::<F>(key.addr_be, key.port_be),
                F::from_be(value.addr_be).into(),
            )
        })
}

/// sock_diag's cookie: two native-endian 32-bit halves, low first.
fn cookie(bytes: &[u8; 8]) -> u64 {
    let low = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let high = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    u64::from(high) << 32 | u64::from(low)
}

/// A NETLINK_SOCK_DIAG socket of this thread's network namespace.
struct Diag {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl Diag {
    fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(Diag {
            socket,
            sequence: 0,
            buf: vec![0; 64 << 10],
        })
    }

    fn request(family: IpFamily, id: SocketId) -> SockDiagMessage {
        SockDiagMessage::InetRequest(InetRequest {
            family: match family {
                IpFamily::V4 => AF_INET,
                IpFamily::V6 => AF_INET6,
            },
            protocol: IPPROTO_UDP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: id,
        })
    }

    /// Every UDP socket's id of `family` (connected ones carry their peer).
    fn udp_sockets(&mut self, family: IpFamily) -> io::Result<Vec<SocketId>> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let any = match family {
            IpFamily::V4 => SocketId::new_v4(),
            IpFamily::V6 => SocketId::new_v6(),
        };
        let sequence = self.send(header, Self::request(family, any))?;
        let mut ids = Vec::new();
        loop {
            let len = self.socket.recv(&mut &mut self.buf[..], 0)?;
            let mut offset = 0;
            while offset < len {
                let message =
                    NetlinkMessage::<SockDiagMessage>::deserialize(&self.buf[offset..len])
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let size = message.header.length as usize;
                if message.header.sequence_number == sequence {
                    match message.payload {
                        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                            ids.push(r.header.socket_id)
                        }
                        NetlinkPayload::Done(_) => return Ok(ids),
                        NetlinkPayload::Error(e) => return Err(e.to_io()),
                        _ => {}
                    }
                }
                if size == 0 {
                    break;
                }
                offset += size;
            }
        }
    }

    fn destroy(&mut self, family: IpFamily, id: SocketId) -> io::Result<()> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut message = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(SockDiagDestroy::new(Self::request(family, id))),
        );
        self.sequence = self.sequence.wrapping_add(1);
        message.header.sequence_number = self.sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        let len = self.socket.recv(&mut &mut self.buf[..], 0)?;
        let ack = NetlinkMessage::<SockDiagMessage>::deserialize(&self.buf[..len])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        match ack.payload {
            // The socket closed meanwhile: nothing left to do.
            NetlinkPayload::Error(e)
                if e.code.is_some() && e.to_io().raw_os_error() != Some(libc::ENOENT) =>
            {
                Err(e.to_io())
            }
            _ => Ok(()),
        }
    }

    fn send(&mut self, header: NetlinkHeader, request: SockDiagMessage) -> io::Result<u32> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
        message.header.sequence_number = self.sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        Ok(self.sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_read_as_the_kernel_writes_them() {
        let c: u64 = 0x0000_0012_3456_789a;
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&(c as u32).to_ne_bytes());
        bytes[4..].copy_from_slice(&((c >> 32) as u32).to_ne_bytes());
        assert_eq!(cookie(&bytes), c);
    }
}
