//! Running a packet through the loaded programs with BPF_PROG_TEST_RUN:
//! in the kernel, with the real maps, without attaching anything.

use std::time::Duration;

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};

use super::{PROG_FROM_HOST, PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP};

/// Which program sees the packet: where it arrives on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// TC ingress of a pod interface.
    FromPod,
    /// TC ingress of an external interface.
    FromNetdev,
    /// XDP on an external interface.
    Xdp,
    /// TC egress (`tc_from_host`). A test run's skb carries a socket, as
    /// the node's own packets do (a forwarded packet's does not).
    FromHost,
}

/// The program's return code, the packet as the program left it, and how
/// long a run took.
#[derive(Debug)]
pub struct Outcome {
    pub verdict: i32,
    pub packet: Vec<u8>,
    /// The kernel's mean time per run (over `repeat` runs).
    pub duration: Duration,
}

/// Runs `packet` through `tc_from_pod`.
pub fn from_pod(ebpf: &Ebpf, packet: &[u8]) -> anyhow::Result<Outcome> {
    run(ebpf, Hook::FromPod, packet, 0, 1)
}

/// Runs `packet` through the program of `hook` `repeat` times, as if it
/// arrived on interface `ifindex` (0: none). The kernel must know `ifindex`.
pub fn run(
    ebpf: &Ebpf,
    hook: Hook,
    packet: &[u8],
    ifindex: u32,
    repeat: u32,
) -> anyhow::Result<Outcome> {
    run_gso(ebpf, hook, packet, ifindex, repeat, 0)
}

/// [`run`], the packet a GSO one of `gso_size` payload bytes per segment
/// (TC hooks only; 0: not GSO), as a local socket's bulk TCP reaches TC.
pub fn run_gso(
    ebpf: &Ebpf,
    hook: Hook,
    packet: &[u8],
    ifindex: u32,
    repeat: u32,
    gso_size: u32,
) -> anyhow::Result<Outcome> {
    let name = match hook {
        Hook::FromPod => PROG_FROM_POD,
        Hook::FromNetdev => PROG_FROM_NETDEV,
        Hook::FromHost => PROG_FROM_HOST,
        Hook::Xdp => PROG_XDP,
    };
    let prog = ebpf
        .program(name)
        .with_context(|| format!("program {name} missing"))?;
    if hook == Hook::Xdp {
        anyhow::ensure!(gso_size == 0, "XDP sees no GSO packet");
        return xdp(prog.try_into()?, packet, ifindex, repeat);
    }
    let prog: &SchedClassifier = prog.try_into()?;
    let skb = SkbContext {
        ifindex,
        ingress_ifindex: ifindex,
        gso_segs: if gso_size == 0 {
            0
        } else {
            (packet.len() as u32).div_ceil(gso_size)
        },
        gso_size,
        ..SkbContext::default()
    };
    // SAFETY: plain data laid out like the kernel's __sk_buff prefix.
    run_program(prog, packet, ifindex, unsafe { as_bytes(&skb) }, repeat)
}

/// Runs `packet` through any loaded XDP program `repeat` times, as if it
/// arrived on interface `ifindex` (0: none).
pub fn xdp(prog: &Xdp, packet: &[u8], ifindex: u32, repeat: u32) -> anyhow::Result<Outcome> {
    // The kernel insists that an XDP context's data_end equals the packet size.
    let md = XdpMd {
        data_end: packet.len() as u32,
        ingress_ifindex: ifindex,
        ..XdpMd::default()
    };
    // SAFETY: plain data laid out like the kernel's xdp_md.
    run_program(prog, packet, ifindex, unsafe { as_bytes(&md) }, repeat)
}

fn run_program<P>(
    prog: &P,
    packet: &[u8],
    ifindex: u32,
    ctx: &[u8],
    repeat: u32,
) -> anyhow::Result<Outcome>
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = aya::programs::TestRunResult>,
{
    let mut out = vec![0u8; packet.len() + 256];
    let options = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        repeat,
        ..TestRunOptions::new()
    };
    let result = prog
        .test_run(context(options, ifindex, ctx))
        .context("BPF_PROG_TEST_RUN")?;
    out.truncate(result.data_size_out as usize);
    Ok(Outcome {
        verdict: result.return_value as i32,
        packet: out,
        duration: result.duration,
    })
}

/// Passes `ctx` only when the run names an interface; without one the kernel
/// uses its defaults (loopback).
fn context<'a>(options: TestRunOptions<'a>, ifindex: u32, ctx: &'a [u8]) -> TestRunOptions<'a> {
    if ifindex == 0 {
        return options;
    }
    TestRunOptions {
        ctx_in: Some(ctx),
        ..options
    }
}

/// The `__sk_buff` fields up to `gso_size`, laid out as the kernel's UAPI
/// has them; a test run may set the interfaces and the GSO fields, the rest
/// must be 0.
#[repr(C)]
#[derive(Default)]
struct SkbContext {
    len: u32,
    pkt_type: u32,
    mark: u32,
    queue_mapping: u32,
    protocol: u32,
    vlan_present: u32,
    vlan_tci: u32,
    vlan_proto: u32,
    priority: u32,
    ingress_ifindex: u32,
    ifindex: u32,
    /// `tc_index` up to `data_meta`.
    _unset: [u32; 25],
    flow_keys: u64,
    tstamp: u64,
    wire_len: u32,
    gso_segs: u32,
    sk: u64,
    gso_size: u32,
    /// `tstamp_type` and its padding.
    _tail: u32,
}

const _: () = assert!(std::mem::offset_of!(SkbContext, gso_size) == 176);

/// `struct xdp_md`.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

unsafe fn as_bytes<T>(v: &T) -> &[u8] {
    // SAFETY: the caller passes a plain-data struct without padding.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}
