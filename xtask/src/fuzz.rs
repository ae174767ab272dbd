//! `cargo xtask fuzz`: every datapath program fuzzed through
//! BPF_PROG_TEST_RUN in both address families (the kernel tier's
//! `fuzz_datapath` tests) with many packets.

use anyhow::{Context as _, bail};

/// What the test reads for the number of packets per program.
const PACKETS_VAR: &str = "KUBE_EBPF_PROXY_FUZZ_PACKETS";

/// Runs the fuzzer with `packets` packets per program and family; it
/// prints one line of figures per program and family, and fails when a
/// packet breaks an invariant.
pub fn run(packets: u64) -> anyhow::Result<()> {
    let status = super::cargo()
        .args(["test", "--test", "kernel", "fuzz_datapath"])
        .args(["--", "--nocapture"])
        .env(PACKETS_VAR, packets.to_string())
        // The test loads the real programs: the object must be embedded.
        .env_remove("AYA_BUILD_SKIP")
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("the datapath fuzzer failed ({status})");
    }
    Ok(())
}
