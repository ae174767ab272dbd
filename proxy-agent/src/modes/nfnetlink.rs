//! One nfnetlink request and its answers, shared by the kernel conntrack
//! table's cleanup (`conntrack`) and the iptables mode's nfacct objects.

use std::io;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// The bytes of a request carrying `inner` for `family`, with `flags`.
pub fn message(flags: u16, family: NetfilterProtoFamily, inner: NetfilterMessageInner) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            inner,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    buf
}

/// Sends `request` (from [`message`]) on a socket of its own and hands each
/// answer to `each`, until the kernel says done (a dump) or acknowledges;
/// its error as an `io::Error`.
pub fn exchange(request: &[u8], mut each: impl FnMut(NetfilterMessageInner)) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(request, 0)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let size = socket.recv(&mut &mut buf[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let answer = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[offset..size])
                .map_err(|e| io::Error::other(format!("an nfnetlink answer: {e}")))?;
            let len = answer.header.length as usize;
            match answer.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(()),
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    };
                }
                NetlinkPayload::InnerMessage(m) => each(m.inner),
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}
