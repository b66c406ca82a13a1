//! The HTTP server: axum's router on hyper's HTTP/1 connections, with the bounds `axum::serve` does not set — a
//! client gets `header_read_timeout` to send a request's headers and then `body_read_timeout` for its body (a
//! slowloris client, or a slow POST, is cut off instead of holding its connection for ever), and at most
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

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::routes::BODY_LIMIT;

/// How long open requests get to finish once shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// What one server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request's headers to arrive (also bounds an idle keep-alive connection's wait for the next).
    pub header_read_timeout: Duration,
    /// Time for a request's body to arrive once its headers are in.
    pub body_read_timeout: Duration,
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
    let body_read_timeout = limits.body_read_timeout;
    let app = app.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        read_body_within(body_read_timeout, req, next)
    }));
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

/// Reads the request's body (at most [`BODY_LIMIT`]) within `timeout`, then hands the request on with the body in
/// memory; the routes would buffer it anyway. A body that does not arrive in time is answered `408` and its
/// connection closed; one over the limit `413`.
async fn read_body_within(timeout: Duration, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) if is_too_large(&e) => crate::extract::payload_too_large().into_response(),
        Ok(Err(_)) => ApiError::invalid("the request body could not be read").into_response(),
        Err(_) => {
            let detail = format!("the request body did not arrive within {}", humantime::format_duration(timeout));
            let mut response = ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", "Request timeout", detail)
                .into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// Whether reading a body failed on [`BODY_LIMIT`].
fn is_too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}
