//! Privileged host initialisation (what `--init-only` does, and the first step of a normal
//! start): conntrack sysctls, per-mode kernel settings, the process OOM score.
//! Kernel parameters are written through [`params::KernelParams`] so tests can check exact
//! values without touching the host.

pub mod conntrack;
pub mod oom;
pub mod params;
pub mod sysctls;

pub use params::{FakeParams, KernelParams, ParamWrite, ProcParams};
