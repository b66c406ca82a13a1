//! The HTTP server: axum's router on hyper's HTTP/1 connections, with the bounds `axum::serve` does not set — a
//! client gets `header_read_timeout` to send a request's headers (a slowloris client is cut off instead of holding
//! its connection for ever; its body has the router's `body_read_timeout`, see `routes/body.rs`), a request's
//! head is at most `max_header_bytes` (hyper answers `431` past it), and at most `max_connections` connections
//! are served at once.
//!
//! At that limit a new connection is not simply left to wait: the timeouts bound each request, not a
//! connection, so clients sending each request just inside them (no key needed: a `401` keeps the connection)
//! would hold every connection for good. Each connection says whether it is working (a request whose body has
//! been read is being answered), reading a request (from its first byte, or from the connection's start), or
//! idle (answered, nothing sent since); at the limit the connection that has been reading a request the longest
//! is closed to make room (one reading a body is answered `408` first, see `routes/body.rs`), and only when none
//! is reading the one idle the longest (a keep-alive connection a client is not using). Only when every
//! connection is working does a new one wait for one to end. Shutdown stops accepting and lets open requests
//! finish.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long open requests get to finish once shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);
/// How often a new connection at the limit looks again for room, should a wake-up be missed.
const RECHECK: Duration = Duration::from_millis(50);

/// What one server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request's headers to arrive (also bounds an idle keep-alive connection's wait for the next).
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Largest request head (request line and headers), in bytes (at least 8192).
    pub max_header_bytes: usize,
}

/// What one connection is doing, shared by its task, the requests it serves and the server's accept loop.
#[derive(Debug)]
struct Connection {
    /// A request has arrived (its head) and is not answered yet.
    in_request: AtomicBool,
    /// A request whose body has been read is being answered.
    working: AtomicBool,
    /// Answered, and nothing received since (a fresh connection is reading: it is there to send a request).
    idle: AtomicBool,
    /// Since when it has been waiting on its client (reading a request, or idle): ms since the server started.
    waiting_since: AtomicU64,
    /// Cancelled to close the connection to make room for another: at once between requests, after answering
    /// (`408`, the body cut short) during one.
    close: CancellationToken,
}

/// A request's handle on its connection (a request extension): the router says when the body has been read, so
/// that the connection counts as working rather than waiting on its client. Absent under other servers (tests
/// that serve the router with `axum::serve`).
#[derive(Debug, Clone)]
pub(crate) struct Phase(Arc<Connection>);

impl Phase {
    /// The request's body has been read: the connection works for the client until the answer is written.
    pub(crate) fn working(&self) {
        self.0.working.store(true, Ordering::Relaxed);
    }

    /// Resolves when the connection is closed to make room for another: a body still being read is cut short.
    pub(crate) async fn closing(&self) {
        self.0.close.cancelled().await;
    }
}

/// The open connections.
#[derive(Debug)]
struct Open {
    started: Instant,
    connections: Mutex<Vec<(u64, Arc<Connection>)>>,
    /// Notified when a connection ends or stops working.
    changed: Notify,
}

impl Open {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn len(&self) -> usize {
        self.connections.lock().map_or(0, |c| c.len())
    }

    fn add(&self, id: u64) -> Arc<Connection> {
        let connection = Arc::new(Connection {
            in_request: AtomicBool::new(false),
            working: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            waiting_since: AtomicU64::new(self.now_ms()),
            close: CancellationToken::new(),
        });
        if let Ok(mut all) = self.connections.lock() {
            all.push((id, connection.clone()));
        }
        connection
    }

    fn remove(&self, id: u64) {
        if let Ok(mut all) = self.connections.lock() {
            all.retain(|(i, _)| *i != id);
        }
        self.changed.notify_waiters();
    }

    /// Closes the connection that has been reading a request the longest or, when none is, the one idle the
    /// longest; whether there was one (none while every connection is working).
    fn evict(&self) -> bool {
        let Ok(mut all) = self.connections.lock() else { return false };
        let victim = all
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| !c.working.load(Ordering::Relaxed))
            .min_by_key(|(_, (_, c))| (c.idle.load(Ordering::Relaxed), c.waiting_since.load(Ordering::Relaxed)))
            .map(|(at, _)| at);
        let Some(at) = victim else { return false };
        let (_, connection) = all.swap_remove(at);
        connection.close.cancel();
        metrics::counter!("onceflow_http_connections_evicted_total").increment(1);
        true
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains open connections (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let open = Arc::new(Open { started: Instant::now(), connections: Mutex::new(Vec::new()), changed: Notify::new() });
    let max = limits.max_connections.max(1);
    let header_read_timeout = limits.header_read_timeout;
    let stopping = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192));
    tokio::pin!(shutdown);
    let mut next_id = 0u64;
    'accept: loop {
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
        // At the limit, room for it: the connection waiting on its client the longest goes; with every one
        // working, it waits for one to end (and newer ones in the kernel's backlog behind it).
        while open.len() >= max && !open.evict() {
            tokio::select! {
                () = open.changed.notified() => {}
                () = tokio::time::sleep(RECHECK) => {}
                () = &mut shutdown => break 'accept,
            }
        }
        while tasks.try_join_next().is_some() {}
        next_id += 1;
        let id = next_id;
        let connection = open.add(id);
        let service = {
            let (app, open, connection) = (app.clone(), open.clone(), connection.clone());
            tower::service_fn(move |mut req: Request<Incoming>| {
                connection.in_request.store(true, Ordering::Relaxed);
                req.extensions_mut().insert(Phase(connection.clone()));
                let (app, open, connection) = (app.clone(), open.clone(), connection.clone());
                async move {
                    let answered = app.oneshot(req).await;
                    // Answered: from here the connection waits on its client again (for the next request).
                    connection.waiting_since.store(open.now_ms(), Ordering::Relaxed);
                    connection.idle.store(true, Ordering::Relaxed);
                    connection.working.store(false, Ordering::Relaxed);
                    connection.in_request.store(false, Ordering::Relaxed);
                    open.changed.notify_waiters();
                    answered
                }
            })
        };
        let watched = Watched { stream, connection: connection.clone(), started: open.started };
        let served = http.serve_connection(TokioIo::new(watched), TowerToHyperService::new(service));
        let (open, stopping) = (open.clone(), stopping.clone());
        tasks.spawn(async move {
            let mut served = std::pin::pin!(served);
            // A client that leaves or is cut off ends its connection; nothing to report.
            // How long the answer in progress may still take: none, all it needs (a shutdown drains), or the
            // time a request's head gets (a connection closed to make room no longer counts toward the limit,
            // so it must not linger).
            let finish = tokio::select! {
                _ = served.as_mut() => None,
                // Making room: between requests at once (dropping the connection drops its socket); during one,
                // once it is answered (its body, if still being read, cut short with a `408`).
                () = connection.close.cancelled() => {
                    connection.in_request.load(Ordering::Relaxed).then_some(header_read_timeout)
                }
                () = stopping.cancelled() => Some(DRAIN),
            };
            if let Some(within) = finish {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(within, served).await;
            }
            open.remove(id);
        });
    }
    drop(listener);
    stopping.cancel();
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drained).await.is_err() {
        tracing::warn!("shutdown: connections still open after {DRAIN:?}, closing them");
    }
    Ok(())
}

/// A connection's socket, telling its [`Connection`] when an idle one starts receiving a request.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
    started: Instant,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && self.connection.idle.swap(false, Ordering::Relaxed) {
            let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.connection.waiting_since.store(now, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
