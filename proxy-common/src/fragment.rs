//! IPv4 fragments. A datagram's later fragments carry no ports: its first
//! fragment leaves them in `FRAGMENTS`, keyed by what every fragment of the
//! datagram carries, so the later ones find their flow and are translated
//! too (the TC and XDP hooks see fragments before the kernel reassembles them).

/// `FRAGMENTS` key: the datagram's addresses, IP identification and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub id_be: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// `FRAGMENTS` value: the ports of the datagram's first fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragPorts {
    pub sport_be: u16,
    pub dport_be: u16,
}
