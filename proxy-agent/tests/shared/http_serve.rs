#![allow(dead_code)]
//! Runs one of the agent's HTTP handlers on a loopback port, in a thread of
//! its own, for the duration of the test process.

use std::net::SocketAddr;

use proxy_agent::httpserve::{self, Handler};

/// Serves `handler` on `ip`:(a free port); returns the address.
pub fn serve_in_background(ip: &str, handler: Handler) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let ip: std::net::IpAddr = ip.parse().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = httpserve::listen(SocketAddr::new(ip, 0)).unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            httpserve::serve(listener, handler).await;
        });
    });
    rx.recv().unwrap()
}
