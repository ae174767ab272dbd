//! A testbed leaves nothing behind: on drop, on panic, and on SIGINT/SIGTERM.
//! Needs root (it creates network namespaces).

use std::time::Duration;

use testbed::{Cni, Testbed, netns};

fn all_gone(names: &[String]) -> bool {
    names.iter().all(|n| !netns::exists(n))
}

fn namespaces(tb: &Testbed) -> Vec<String> {
    let mut names = vec![tb.node_ns.clone(), tb.external_ns.clone()];
    names.extend(tb.pods.iter().map(|p| p.ns.clone()));
    names
}

#[test]
fn drop_removes_every_namespace() {
    let tb = Testbed::new(Cni::Bridge, &["a", "b"]).unwrap();
    let names = namespaces(&tb);
    assert_eq!(names.len(), 4);
    assert!(names.iter().all(|n| netns::exists(n)));
    drop(tb);
    assert!(all_gone(&names));
}

#[test]
fn a_panic_removes_every_namespace() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let tb = Testbed::new(Cni::Routed, &["a"]).unwrap();
        tx.send(namespaces(&tb)).unwrap();
        panic!("test body failed");
    })
    .join();
    assert!(result.is_err());
    let names = rx.recv().unwrap();
    assert!(all_gone(&names), "left behind: {names:?}");
}

#[test]
fn pods_talk_to_each_other_through_the_node() {
    for cni in [Cni::Routed, Cni::Bridge] {
        let tb = Testbed::new(cni, &["server", "client"]).unwrap();
        let server =
            testbed::servers::IdentityServer::start(&tb.pod("server").ns, "server", 8080).unwrap();
        let target = std::net::SocketAddr::from((tb.pod("server").ip, 8080));
        let id = netns::run_in(&tb.pod("client").ns, move || {
            testbed::servers::tcp_identity(target, Duration::from_secs(2))
        })
        .unwrap()
        .unwrap();
        assert_eq!(id, "server");
        assert_eq!(
            server.seen.tcp.lock().unwrap()[0].ip(),
            tb.pod("client").ip,
            "{cni:?}: no NAT between pods"
        );
    }
}

#[test]
fn sigint_and_sigterm_remove_every_namespace() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        crate::signal_removes_every_namespace(&[], 4, signal);
    }
}
