use which::which;

/// Rebuild when bpf-linker changes (for example after `cargo xtask setup` reinstalled it).
fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
