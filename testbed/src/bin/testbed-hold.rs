//! Builds a small testbed (or, with argument `cluster`, a two-node cluster
//! with a pod on each node), prints its namespaces, and waits for a signal.
//! Used to check that Ctrl-C (SIGINT) and SIGTERM remove everything; also
//! handy for poking at a topology by hand.

use testbed::{
    Cni, Testbed,
    cluster::{Cluster, NodeId},
};

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("cluster") {
        let mut cluster = Cluster::new()?;
        cluster.add_pod(NodeId::A, "pod-a")?;
        cluster.add_pod(NodeId::B, "pod-b")?;
        hold(&cluster.namespaces())
    } else {
        let tb = Testbed::new(Cni::Routed, &["pod-a", "pod-b"])?;
        let mut names = vec![tb.node_ns.clone(), tb.external_ns.clone()];
        names.extend(tb.pods.iter().map(|p| p.ns.clone()));
        hold(&names)
    }
}

/// Prints the namespaces and sleeps until a signal ends the process (the
/// cleanup handler removes them then).
fn hold(names: &[String]) -> ! {
    println!("{}", names.join(" "));
    loop {
        std::thread::park();
    }
}
