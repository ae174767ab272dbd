//! The address family as a type parameter of the map ABI (see
//! docs/dual-stack.md): every key and value that carries an address is
//! generic over [`Family`], and each family has maps of its own. The IPv4
//! instances are byte for byte the types the datapath has always used.

/// An IP address family: how its addresses sit in keys and values.
pub trait Family:
    Copy + Default + Eq + Ord + core::fmt::Debug + core::hash::Hash + 'static
{
    /// An address in network byte order.
    type Addr: Copy + Default + Eq + Ord + core::fmt::Debug + core::hash::Hash;
    /// The bytes a key or value of this family needs after its last field
    /// to have no implicit padding (see [`SockKeyOf`](crate::sock::SockKeyOf)).
    type TailPad: Copy + Default + Eq + Ord + core::fmt::Debug + core::hash::Hash;
    /// `AF_INET` / `AF_INET6`.
    const AF: u16;
    /// Bits in an address (LPM prefix lengths count in these).
    const BITS: u32;
    /// The address as 32-bit words.
    fn addr_words(addr: &Self::Addr) -> &[u32];
}

/// IPv4: a `u32` in network byte order.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct V4;

/// IPv6: four `u32` words in network byte order.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct V6;

impl Family for V4 {
    type Addr = u32;
    type TailPad = [u8; 0];
    const AF: u16 = 2;
    const BITS: u32 = 32;
    #[inline(always)]
    fn addr_words(addr: &u32) -> &[u32] {
        core::slice::from_ref(addr)
    }
}

impl Family for V6 {
    type Addr = [u32; 4];
    type TailPad = [u8; 4];
    const AF: u16 = 10;
    const BITS: u32 = 128;
    #[inline(always)]
    fn addr_words(addr: &[u32; 4]) -> &[u32] {
        addr
    }
}
