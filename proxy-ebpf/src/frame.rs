//! What the shared service logic needs from a TC or XDP context.

use aya_ebpf::{
    EbpfContext,
    programs::{TcContext, XdpContext},
};

/// Headers end well before this (Ethernet + IPv6 + walked extension headers).
const MAX_OFFSET: usize = 0x3fff;

pub trait Frame: EbpfContext {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// The interface the packet arrived on.
    fn ifindex(&self) -> u32;
    /// A GSO packet's payload bytes per segment; 0 for any other packet.
    fn gso_size(&self) -> u32;

    /// A bounds-checked pointer to a `T` at `offset`.
    #[inline(always)]
    fn ptr_at<T>(&self, offset: usize) -> Option<*mut T> {
        // An explicit bound: an offset the compiler spilled and reloaded
        // reaches the verifier as an unbounded scalar otherwise.
        if offset > MAX_OFFSET {
            return None;
        }
        let start = self.data();
        if start + offset + core::mem::size_of::<T>() > self.data_end() {
            return None;
        }
        Some((start + offset) as *mut T)
    }
}

impl Frame for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the context points to a valid __sk_buff for the whole run.
        unsafe { (*self.skb.skb).ifindex }
    }
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.skb.skb).gso_size }
    }
}

impl Frame for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
    #[inline(always)]
    fn ifindex(&self) -> u32 {
        self.ingress_ifindex() as u32
    }
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        0
    }
}
