//! IP fragments. A datagram's later fragments carry no ports: its first
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

/// `FRAGMENTS6` key: the datagram's addresses, the fragment header's
/// identification and the protocol it carries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragKey6 {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub id_be: u32,
    pub proto: u8,
    pub _pad: [u8; 3],
}

/// `FRAGMENTS` / `FRAGMENTS6` value: the ports of the datagram's first fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragPorts {
    pub sport_be: u16,
    pub dport_be: u16,
}
