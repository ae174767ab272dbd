//! TC programs of the service datapath.
#![no_std]
#![no_main]

mod conntrack;
mod lb;
mod maps;
mod nat;
mod packet;
mod service;
mod stats;

use aya_ebpf::{bindings::TC_ACT_SHOT, macros::classifier, programs::TcContext};

/// Attached at ingress of pod-facing interfaces: everything a pod sends passes
/// here, so requests to services are balanced and replies from backends are
/// reverse-translated before the node routes them.
#[classifier]
pub fn tc_from_pod(ctx: TcContext) -> i32 {
    match service::handle(&ctx) {
        Ok(action) => action,
        Err(reason) => {
            stats::count(reason);
            TC_ACT_SHOT
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
