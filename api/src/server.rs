//! The HTTP server: axum's router on hyper's HTTP/1 connections, with the bounds `axum::serve` does not set — a
//! client gets `header_read_timeout` to send a request's headers (a slowloris client is cut off instead of holding
//! its connection for ever; its body has the router's `body_read_timeout`, see `routes/body.rs`), and at most
//! `max_connections` connections are served at once (past that, new ones wait in the listen backlog until one
//! ends). Shutdown stops accepting and lets open requests finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long open requests get to finish once shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// What one server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request's headers to arrive (also bounds an idle keep-alive connection's wait for the next).
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains open connections (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        // A slot first, then a connection: at the limit, new connections wait in the kernel's backlog.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that leaves or is cut off ends its connection; nothing to report.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("shutdown: connections still open after {DRAIN:?}, closing them");
    }
    Ok(())
}
