//! The little HTTP the agent serves (health, health-check node ports,
//! metrics): hyper HTTP/1 over tokio, every request answered by one handler
//! function, listeners bound as Go's `net.Listen("tcp", ...)` binds them and
//! retried as upstream retries them.

use std::{
    convert::Infallible,
    io,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, error, info};

use crate::events::{EventRecorder, Regarding};

/// How long a failed listen waits before the next try (upstream's `wait.Until` period).
pub const LISTEN_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub type Response = hyper::Response<Full<Bytes>>;

/// Answers one request; sees the method, path and headers, never needs the body.
pub type Handler = Arc<dyn Fn(&Request<Incoming>) -> Response + Send + Sync>;

/// Binds `addr`; an unspecified address of either family (`0.0.0.0`,
/// `[::]`) listens on both, as Go's "tcp" listener does (falling back to
/// that family alone when the other is missing).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.ip().is_unspecified() {
        let both = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port());
        if let Ok(listener) = bind(both, false) {
            return Ok(listener);
        }
    }
    bind(addr, addr.is_ipv6())
}

fn bind(addr: SocketAddr, v6_only: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(v6_only)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Serves connections from `listener` until the future is dropped, which
/// closes the listener and every connection it accepted, as Go's
/// `http.Server.Close` does: a health-check node port closed for a service
/// must not keep answering on a connection a load balancer keeps open.
pub async fn serve(listener: TcpListener, handler: Handler) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "accept");
                continue;
            }
        };
        let handler = handler.clone();
        connections.spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = handler(&req);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %e, "HTTP connection");
            }
        });
    }
}

/// Listens on `addr` (or starts with `bound`, already listening there) and
/// serves `handler`, retrying a failed listen every [`LISTEN_RETRY`] with a
/// Warning event `reason` on this node; with `hard_fail`
/// (`bindAddressHardFail`) the first failure is returned instead. Never
/// returns otherwise.
pub async fn serve_with_retry(
    what: &'static str,
    addr: SocketAddr,
    mut bound: Option<tokio::net::TcpListener>,
    handler: Handler,
    hard_fail: bool,
    events: Arc<dyn EventRecorder>,
    reason: &'static str,
) -> anyhow::Error {
    loop {
        let listening = match bound.take() {
            Some(listener) => Ok(listener),
            None => listen(addr),
        };
        match listening {
            Ok(listener) => {
                info!(address = %addr, "{what} server listening");
                serve(listener, handler.clone()).await;
            }
            Err(e) => {
                let message = format!("failed to start {what} on {addr}: {e}");
                events.warning(Regarding::ThisNode, reason, "StartKubeProxy", &message);
                if hard_fail {
                    return anyhow::anyhow!("{message} (bindAddressHardFail is set)");
                }
                error!(retry_in = ?LISTEN_RETRY, "{message}");
            }
        }
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

/// A response with a body and headers.
pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Response {
    let mut builder = hyper::Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// Go's `http.NotFound`, which a `ServeMux` answers for paths it does not know.
pub fn not_found() -> Response {
    respond(
        404,
        &[
            ("Content-Type", "text/plain; charset=utf-8"),
            ("X-Content-Type-Options", "nosniff"),
        ],
        "404 page not found\n",
    )
}

/// `host:port` as kube-proxy's bind addresses are written; a missing port
/// is `default_port` (upstream appends it).
pub fn bind_address(text: &str, default_port: u16) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let host = text.trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, default_port))
        .map_err(|_| format!("{text:?} is not an IP address with an optional port"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_take_the_default_port_when_they_have_none() {
        assert_eq!(
            bind_address("0.0.0.0:10256", 1),
            Ok("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(
            bind_address("198.18.0.1", 10256),
            Ok("198.18.0.1:10256".parse().unwrap())
        );
        assert_eq!(bind_address("::", 10249), Ok("[::]:10249".parse().unwrap()));
        assert_eq!(
            bind_address("[2001:db8::1]", 10249),
            Ok("[2001:db8::1]:10249".parse().unwrap())
        );
        assert!(bind_address("node-a:1", 1).is_err());
    }

    /// Either family's unspecified address takes connections of both, as
    /// Go's `net.Listen("tcp", "[::]:10256")` does; a specific one only its own.
    #[tokio::test]
    async fn an_unspecified_address_of_either_family_listens_on_both() {
        for any in ["0.0.0.0:0", "[::]:0"] {
            let listener = listen(any.parse().unwrap()).unwrap();
            let port = listener.local_addr().unwrap().port();
            for peer in ["127.0.0.1", "::1"] {
                let to = SocketAddr::new(peer.parse().unwrap(), port);
                let connected = tokio::net::TcpStream::connect(to).await;
                assert!(connected.is_ok(), "{any} from {to}: {connected:?}");
            }
        }
        let v6 = listen("[::1]:0".parse().unwrap()).unwrap();
        let port = v6.local_addr().unwrap().port();
        let v4 = SocketAddr::new([127, 0, 0, 1].into(), port);
        assert!(tokio::net::TcpStream::connect(v4).await.is_err());
    }
}
