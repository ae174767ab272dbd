//! Program return codes, as the kernel defines them: what `tc_from_*`
//! return (`TC_ACT_*`, `linux/pkt_cls.h`) and what `xdp_from_netdev` returns
//! (`enum xdp_action`, `linux/bpf.h`), and so what BPF_PROG_TEST_RUN reports.
//!
//! All are `i32`, the type of a TC program's return value (`TC_ACT_UNSPEC`
//! is -1) and of the verdicts user space compares. XDP actions are small and
//! non-negative: an XDP entry point, which returns `u32`, casts them.

/// Use the default action of the classifier (the kernel treats it as OK).
pub const TC_ACT_UNSPEC: i32 = -1;
/// The packet goes on through the stack.
pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_RECLASSIFY: i32 = 1;
/// The packet is dropped.
pub const TC_ACT_SHOT: i32 = 2;
pub const TC_ACT_PIPE: i32 = 3;
pub const TC_ACT_STOLEN: i32 = 4;
pub const TC_ACT_QUEUED: i32 = 5;
pub const TC_ACT_REPEAT: i32 = 6;
/// The packet leaves through the interface `bpf_redirect*` chose.
pub const TC_ACT_REDIRECT: i32 = 7;

/// The program failed; the packet is dropped (and traced as an exception).
pub const XDP_ABORTED: i32 = 0;
/// The packet is dropped.
pub const XDP_DROP: i32 = 1;
/// The packet goes on to the stack (and TC).
pub const XDP_PASS: i32 = 2;
/// The frame leaves at once through the interface it arrived on.
pub const XDP_TX: i32 = 3;
/// The frame leaves through the interface `bpf_redirect*` chose.
pub const XDP_REDIRECT: i32 = 4;
