//! A do-nothing native XDP program (`return XDP_PASS`) for the lan-side veth
//! peers of a [`crate::cluster::Cluster`], loaded and attached with the raw
//! bpf(2) syscall so that the testbed needs no BPF toolchain or build step.
//!
//! Why: on a veth, XDP_TX (and XDP_REDIRECT into a veth) puts frames on the
//! *peer's* XDP ring, and the driver only schedules the peer's NAPI to drain
//! it when the peer itself has an XDP program (`veth_xdp_flush` in
//! `drivers/net/veth.c`: `if (!rcu_access_pointer(rcv_rq->xdp_prog)) goto
//! out;`). GRO enables NAPI on the peer, so the frames are accepted, but
//! without a program there nothing kicks it: they wait in the ring until
//! unrelated traffic arrives (seconds). A real NIC sends XDP_TX frames at
//! once, so the testbed attaches this program to the bridge side of each
//! node's `eth0` to behave like a wire.

use std::{
    ffi::CString,
    io, mem,
    os::fd::{FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, bail};
use proxy_common::action::XDP_PASS;

use crate::netns;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `struct bpf_insn`: opcode, dst_reg (low nibble) | src_reg (high nibble), off, imm.
#[repr(C)]
#[derive(Clone, Copy)]
struct BpfInsn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// `r0 = action; exit`.
fn program(action: i32) -> [BpfInsn; 2] {
    [
        // BPF_ALU64 | BPF_MOV | BPF_K, dst r0
        BpfInsn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm: action,
        },
        // BPF_JMP | BPF_EXIT
        BpfInsn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ]
}

/// The leading fields of `union bpf_attr` for BPF_PROG_LOAD.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The leading fields of `union bpf_attr` for BPF_LINK_CREATE.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, fully initialised prefix of `union bpf_attr`
    // and its size is passed; the kernel zero-extends shorter attrs.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success both commands return a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

fn load(action: i32) -> anyhow::Result<OwnedFd> {
    let license = c"GPL";
    let insns = program(action);
    let mut name = [0u8; 16];
    let label = if action == XDP_PASS {
        "xdp_pass".to_owned()
    } else {
        format!("xdp_const_{action}")
    };
    name[..label.len()].copy_from_slice(label.as_bytes());
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        expected_attach_type: BPF_XDP,
        ..Default::default()
    };
    bpf(BPF_PROG_LOAD, &mut attr)
        .with_context(|| format!("BPF_PROG_LOAD of an XDP program returning {action}"))
}

/// Loads the `XDP_PASS` program (named `xdp_pass`) and attaches it in native
/// (driver) mode to `iface` of namespace `ns` through a bpf link. The program
/// stays attached as long as the returned link fd is open and the interface
/// exists.
pub fn attach(ns: &str, iface: &str) -> anyhow::Result<OwnedFd> {
    attach_returning(ns, iface, XDP_PASS)
}

/// Like [`attach`], for a program that always returns `action` (e.g.
/// [`proxy_common::action::XDP_TX`], to test how XDP_TX frames travel).
pub fn attach_returning(ns: &str, iface: &str, action: i32) -> anyhow::Result<OwnedFd> {
    let c_iface = CString::new(iface).context("interface name")?;
    // The ifindex, and the device BPF_LINK_CREATE looks it up in, are those
    // of the calling thread's namespace.
    let link = netns::run_in(ns, move || -> anyhow::Result<OwnedFd> {
        // SAFETY: a valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(c_iface.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface: {}", io::Error::last_os_error());
        }
        let prog = load(action)?;
        let mut attr = LinkCreateAttr {
            prog_fd: std::os::fd::AsRawFd::as_raw_fd(&prog) as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: XDP_FLAGS_DRV_MODE,
        };
        // The link holds the program; `prog` may close.
        bpf(BPF_LINK_CREATE, &mut attr).context("BPF_LINK_CREATE (native XDP)")
    })?;
    link.with_context(|| format!("attaching native XDP to {iface} in netns {ns}"))
}
