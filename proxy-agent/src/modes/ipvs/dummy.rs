//! `kube-ipvs0`, the dummy interface upstream's ipvs proxier binds the
//! service addresses to (so the node accepts their packets for IPVS),
//! over rtnetlink.

use std::{collections::BTreeSet, ffi::CString, io, net::IpAddr};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
};

use super::cleanup::DUMMY_IFACE;
use crate::sources::host::Rtnl;

/// What the proxier needs of the interface.
pub trait DummyDevice {
    /// Creates it unless it exists.
    fn ensure(&mut self) -> io::Result<()>;
    fn addresses(&mut self) -> io::Result<BTreeSet<IpAddr>>;
    fn bind(&mut self, ip: IpAddr) -> io::Result<()>;
    fn unbind(&mut self, ip: IpAddr) -> io::Result<()>;
}

/// The real interface, in the namespace of the thread that opened it.
pub struct NetlinkDummy {
    rtnl: Rtnl,
}

impl NetlinkDummy {
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            rtnl: Rtnl::open()?,
        })
    }

    fn index(&self) -> io::Result<u32> {
        let name = CString::new(DUMMY_IFACE).expect("no NUL");
        // SAFETY: a NUL-terminated name; no other preconditions.
        match unsafe { libc::if_nametoindex(name.as_ptr()) } {
            0 => Err(io::Error::last_os_error()),
            i => Ok(i),
        }
    }

    fn address_message(&self, ip: IpAddr) -> io::Result<AddressMessage> {
        let mut m = AddressMessage::default();
        m.header.index = self.index()?;
        (m.header.family, m.header.prefix_len) = match ip {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        m.attributes.push(AddressAttribute::Local(ip));
        m.attributes.push(AddressAttribute::Address(ip));
        Ok(m)
    }
}

impl DummyDevice for NetlinkDummy {
    fn ensure(&mut self) -> io::Result<()> {
        let mut link = LinkMessage::default();
        link.attributes
            .push(LinkAttribute::IfName(DUMMY_IFACE.into()));
        link.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        match self.rtnl.execute(
            RouteNetlinkMessage::NewLink(link),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    fn addresses(&mut self) -> io::Result<BTreeSet<IpAddr>> {
        let index = self.index()?;
        let answers = self
            .rtnl
            .dump(|| RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        Ok(answers
            .into_iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewAddress(m) if m.header.index == index => {
                    m.attributes.into_iter().find_map(|a| match a {
                        AddressAttribute::Address(ip) => Some(ip),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect())
    }

    fn bind(&mut self, ip: IpAddr) -> io::Result<()> {
        let m = self.address_message(ip)?;
        match self.rtnl.execute(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    fn unbind(&mut self, ip: IpAddr) -> io::Result<()> {
        let m = self.address_message(ip)?;
        self.rtnl.execute(RouteNetlinkMessage::DelAddress(m), 0)
    }
}
