//! Running a packet through the loaded programs with BPF_PROG_TEST_RUN:
//! in the kernel, with the real maps, without attaching anything.

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun, TestRunOptions},
};

use super::PROG_FROM_POD;

/// The TC verdict and the packet as the program left it.
#[derive(Debug)]
pub struct Outcome {
    pub verdict: i32,
    pub packet: Vec<u8>,
}

/// Runs `packet` through `tc_from_pod`.
pub fn from_pod(ebpf: &Ebpf, packet: &[u8]) -> anyhow::Result<Outcome> {
    let prog: &SchedClassifier = ebpf
        .program(PROG_FROM_POD)
        .context("program missing")?
        .try_into()?;
    let mut out = vec![0u8; packet.len() + 256];
    let result = prog
        .test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ..TestRunOptions::new()
        })
        .context("BPF_PROG_TEST_RUN")?;
    out.truncate(result.data_size_out as usize);
    Ok(Outcome {
        verdict: result.return_value as i32,
        packet: out,
    })
}
