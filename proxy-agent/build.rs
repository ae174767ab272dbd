//! Builds the eBPF programs from `proxy-ebpf` with Debian's rustc (linked into
//! rustup as the `bpf-debian` toolchain by `cargo xtask setup`) and bpf-linker,
//! and leaves the objects (the programs, the datapath benchmark's floor and
//! its conntrack-table experiment) in OUT_DIR for `include_bytes_aligned!`.
use std::{env, fs, path::PathBuf, process::Command};

use anyhow::{Context as _, anyhow};

const TOOLCHAIN: &str = "bpf-debian";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        // Lets host-only work (unit tests, clippy) run without the eBPF toolchain;
        // the agent reports a clear error if it is asked to load this empty object.
        fs::write(out_dir.join("proxy-ebpf"), b"")?;
        fs::write(out_dir.join("bench-floor"), b"")?;
        fs::write(out_dir.join("bench-ct"), b"")?;
        return Ok(());
    }
    let have_toolchain = Command::new("rustup")
        .args(["run", TOOLCHAIN, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let have_linker = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_toolchain || !have_linker {
        return Err(anyhow!(
            "the eBPF toolchain is missing (rustup toolchain `{TOOLCHAIN}`: {have_toolchain}, bpf-linker: {have_linker}); \
             run `cargo xtask setup` once, or set AYA_BUILD_SKIP=1 for host-only builds"
        ));
    }
    println!("cargo:rerun-if-changed=../proxy-common/src");
    // -Z build-std=core needs unstable flags on Debian's stable rustc.
    // SAFETY: build scripts are single-threaded.
    unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    let ebpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../proxy-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "proxy-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(TOOLCHAIN),
    )
}
