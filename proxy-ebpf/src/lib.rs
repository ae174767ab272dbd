#![no_std]
// Empty on purpose: the programs live in the `proxy-ebpf` binary target; this
// library target only exists so cargo can treat the crate as a dependency.
