//! Extended accounting objects (nfacct), as upstream's iptables mode counts
//! two kinds of packets with them: `-m nfacct --nfacct-name <name>` in a
//! rule counts the packets it matches into the named object, which the
//! metrics read back at each scrape. Through nfnetlink (`NFNL_SUBSYS_ACCT`),
//! with `netlink-packet-netfilter`'s messages of other subsystems.

use std::io;

use netlink_packet_core::{DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, Nla};
use netlink_packet_netfilter::{NetfilterMessageInner, NetfilterProtoFamily, NetfilterSubsystem};

use crate::modes::nfnetlink;

/// Packets dropped by the rule for conntrack INVALID packets.
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// Packets accepted on NodePorts of 127.0.0.0/8.
pub const LOCALHOST_NODE_PORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

// include/uapi/linux/netfilter/nfnetlink.h and nfnetlink_acct.h
const NFNL_SUBSYS_ACCT: u8 = 7;
const NFNL_MSG_ACCT_NEW: u8 = 0;
const NFNL_MSG_ACCT_GET: u8 = 1;
const NFACCT_NAME: u16 = 1;
const NFACCT_PKTS: u16 = 2;
/// With its terminating NUL.
const NFACCT_NAME_MAX: usize = 32;

/// Creates the object `name` unless it exists.
pub fn ensure(name: &str) -> io::Result<()> {
    match request(NFNL_MSG_ACCT_NEW, NLM_F_CREATE, name) {
        Ok(_) => Ok(()),
        // The kernel's answer when the name exists (without NLM_F_REPLACE).
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The packets object `name` counted.
pub fn packets(name: &str) -> io::Result<u64> {
    let answer = request(NFNL_MSG_ACCT_GET, 0, name)?;
    answer
        .and_then(|attrs| packets_of(&attrs))
        .ok_or_else(|| io::Error::other(format!("nfacct {name}: no packet count in the answer")))
}

/// The bytes of an `NFNL_MSG_ACCT_{NEW,GET}` request for `name`.
fn message(message_type: u8, flags: u16, name: &str) -> io::Result<Vec<u8>> {
    if name.len() >= NFACCT_NAME_MAX || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("nfacct name {name:?}: at most 31 bytes, no NUL"),
        ));
    }
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    Ok(nfnetlink::message(
        NLM_F_REQUEST | NLM_F_ACK | flags,
        NetfilterProtoFamily::Unspec,
        NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_ACCT),
            message_type,
            attributes: vec![DefaultNla::new(NFACCT_NAME, value)],
        },
    ))
}

/// The packet count among an object's attributes.
fn packets_of(attrs: &[DefaultNla]) -> Option<u64> {
    let pkts = attrs.iter().find(|a| a.kind() == NFACCT_PKTS)?;
    let mut value = vec![0; pkts.value_len()];
    pkts.emit_value(&mut value);
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

/// Sends one request; the attributes of the object the kernel answered
/// with, if it did, once it acknowledged.
fn request(message_type: u8, flags: u16, name: &str) -> io::Result<Option<Vec<DefaultNla>>> {
    let mut object = None;
    nfnetlink::exchange(&message(message_type, flags, name)?, |inner| {
        if let NetfilterMessageInner::Other { attributes, .. } = inner {
            object = Some(attributes);
        }
    })?;
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::{NFNL_MSG_ACCT_GET, message, packets_of};

    #[test]
    fn a_request_is_an_nfnetlink_acct_message_with_the_nul_terminated_name() {
        let bytes = message(NFNL_MSG_ACCT_GET, 0, "ct_state_invalid_dropped_pkts").unwrap();
        // nlmsghdr: length, type (NFNL_SUBSYS_ACCT << 8 | GET), flags (REQUEST | ACK).
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        assert_eq!(u16::from_ne_bytes(bytes[4..6].try_into().unwrap()), 0x0701);
        assert_eq!(u16::from_ne_bytes(bytes[6..8].try_into().unwrap()), 0x0005);
        // nfgenmsg: AF_UNSPEC, version 0, res_id 0.
        assert_eq!(&bytes[16..20], &[0, 0, 0, 0]);
        // NFACCT_NAME: 4 + 30 bytes, padded to 36.
        assert_eq!(u16::from_ne_bytes(bytes[20..22].try_into().unwrap()), 34);
        assert_eq!(u16::from_ne_bytes(bytes[22..24].try_into().unwrap()), 1);
        assert_eq!(&bytes[24..54], b"ct_state_invalid_dropped_pkts\0");
        assert_eq!(bytes.len(), 20 + 36);
    }

    #[test]
    fn names_the_kernel_would_refuse_are_refused_here() {
        assert!(message(NFNL_MSG_ACCT_GET, 0, &"x".repeat(32)).is_err());
        assert!(message(NFNL_MSG_ACCT_GET, 0, "a\0b").is_err());
    }

    #[test]
    fn the_packet_count_is_big_endian() {
        let attrs = [
            netlink_packet_core::DefaultNla::new(1, b"n\0".to_vec()),
            netlink_packet_core::DefaultNla::new(2, 300u64.to_be_bytes().to_vec()),
            netlink_packet_core::DefaultNla::new(3, 9000u64.to_be_bytes().to_vec()),
        ];
        assert_eq!(packets_of(&attrs), Some(300));
        assert_eq!(packets_of(&attrs[..1]), None);
    }
}
