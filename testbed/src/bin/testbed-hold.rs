//! Builds a small testbed, prints its namespaces, and waits for a signal.
//! Used to check that Ctrl-C (SIGINT) and SIGTERM remove everything; also
//! handy for poking at a topology by hand.

use testbed::{Cni, Testbed};

fn main() -> anyhow::Result<()> {
    let tb = Testbed::new(Cni::Routed, &["pod-a", "pod-b"])?;
    let mut names = vec![tb.node_ns.clone(), tb.external_ns.clone()];
    names.extend(tb.pods.iter().map(|p| p.ns.clone()));
    println!("{}", names.join(" "));
    loop {
        std::thread::park();
    }
}
