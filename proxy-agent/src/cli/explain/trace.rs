//! Runs a packet through the programs it meets on arrival, with
//! BPF_PROG_TEST_RUN, and records what each returned, the packet as it left
//! and the datapath counters that moved.

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use proxy_common::Counter;

use super::probe::{Origin, Probe};
use crate::modes::ebpf::{
    KernelMaps, PROG_FROM_NETDEV, PROG_FROM_POD, PROG_XDP,
    test_run::{self, Hook},
};

/// A loaded and programmed datapath, never attached, and where packets arrive.
pub struct Datapath {
    pub ebpf: Ebpf,
    pub maps: KernelMaps,
    pub stats: PerCpuArray<MapData, u64>,
    /// The interface pod traffic arrives on (`tc_from_pod`).
    pub pod_ifindex: u32,
    /// The external interface outside traffic arrives on (XDP, `tc_from_netdev`).
    pub external_ifindex: u32,
    /// Whether outside traffic meets `xdp_from_netdev` first.
    pub xdp: bool,
}

pub use proxy_common::action::{
    TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX,
};
use proxy_common::action::{
    TC_ACT_PIPE, TC_ACT_QUEUED, TC_ACT_RECLASSIFY, TC_ACT_REPEAT, TC_ACT_STOLEN, TC_ACT_UNSPEC,
    XDP_REDIRECT,
};

/// One program's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub program: &'static str,
    pub xdp: bool,
    pub code: i32,
}

impl Step {
    /// The return code's name.
    pub fn action(&self) -> &'static str {
        if super::host::PROGRAMS.contains(&self.program) {
            return if self.code == 1 {
                "SOCK_ALLOW"
            } else {
                "SOCK_REFUSE"
            };
        }
        if self.xdp {
            match self.code {
                XDP_ABORTED => "XDP_ABORTED",
                XDP_DROP => "XDP_DROP",
                XDP_PASS => "XDP_PASS",
                XDP_TX => "XDP_TX",
                XDP_REDIRECT => "XDP_REDIRECT",
                _ => "XDP_UNKNOWN",
            }
        } else {
            match self.code {
                TC_ACT_UNSPEC => "TC_ACT_UNSPEC",
                TC_ACT_OK => "TC_ACT_OK",
                TC_ACT_RECLASSIFY => "TC_ACT_RECLASSIFY",
                TC_ACT_SHOT => "TC_ACT_SHOT",
                TC_ACT_PIPE => "TC_ACT_PIPE",
                TC_ACT_STOLEN => "TC_ACT_STOLEN",
                TC_ACT_QUEUED => "TC_ACT_QUEUED",
                TC_ACT_REPEAT => "TC_ACT_REPEAT",
                TC_ACT_REDIRECT => "TC_ACT_REDIRECT",
                _ => "TC_ACT_UNKNOWN",
            }
        }
    }
}

/// What happened to one packet.
#[derive(Clone, Debug)]
pub struct Trace {
    pub steps: Vec<Step>,
    /// The packet as the last program left it.
    pub output: Vec<u8>,
    /// Counters that moved, in counter order, with how much.
    pub counters: Vec<(Counter, u64)>,
}

impl Trace {
    pub fn moved(&self, c: Counter) -> u64 {
        self.counters
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |(_, n)| *n)
    }
}

/// Runs `probe` through the programs of its origin: `tc_from_pod`, or
/// `xdp_from_netdev` and, when XDP passes the packet on, `tc_from_netdev`,
/// or for the node's own connections the socket hook of its family ([`super::host`]).
pub fn run(dp: &mut Datapath, probe: &Probe) -> anyhow::Result<Trace> {
    let before = counters(&dp.stats);
    let mut steps = Vec::new();
    let mut packet = probe.bytes();
    let tc = match probe.origin {
        Origin::Pod => (Hook::FromPod, PROG_FROM_POD, dp.pod_ifindex),
        Origin::Outside => (Hook::FromNetdev, PROG_FROM_NETDEV, dp.external_ifindex),
        Origin::Host => {
            let outcome = super::host::run(dp, probe)?;
            return Ok(Trace::new(
                vec![outcome.step],
                outcome.output,
                &before,
                &dp.stats,
            ));
        }
    };
    let mut finished = false;
    if probe.origin == Origin::Outside && dp.xdp {
        let out = test_run::run(&dp.ebpf, Hook::Xdp, &packet, dp.external_ifindex, 1)?;
        steps.push(Step {
            program: PROG_XDP,
            xdp: true,
            code: out.verdict,
        });
        finished = out.verdict != XDP_PASS;
        packet = out.packet;
    }
    if !finished {
        let out = test_run::run(&dp.ebpf, tc.0, &packet, tc.2, 1)?;
        steps.push(Step {
            program: tc.1,
            xdp: false,
            code: out.verdict,
        });
        packet = out.packet;
    }
    Ok(Trace::new(steps, packet, &before, &dp.stats))
}

impl Trace {
    /// The counters that moved since `before` was read.
    fn new(
        steps: Vec<Step>,
        output: Vec<u8>,
        before: &[u64],
        stats: &PerCpuArray<MapData, u64>,
    ) -> Self {
        let after = counters(stats);
        Trace {
            steps,
            output,
            counters: Counter::ALL
                .iter()
                .zip(before.iter().zip(after))
                .filter_map(|(c, (b, a))| (a > *b).then_some((*c, a - b)))
                .collect(),
        }
    }
}

/// Every counter summed over the CPUs, in [`Counter::ALL`] order.
fn counters(stats: &PerCpuArray<MapData, u64>) -> Vec<u64> {
    Counter::ALL
        .iter()
        .map(|c| stats.get(&(*c as u32), 0).map_or(0, |v| v.iter().sum()))
        .collect()
}
