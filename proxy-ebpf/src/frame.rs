//! What the shared service logic needs from a TC or XDP context.

use aya_ebpf::{
    EbpfContext,
    programs::{TcContext, XdpContext},
};

pub trait Frame: EbpfContext {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// The interface the packet arrived on.
    fn ifindex(&self) -> u32;

    /// A bounds-checked pointer to a `T` at `offset`.
    #[inline(always)]
    fn ptr_at<T>(&self, offset: usize) -> Option<*mut T> {
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
}
