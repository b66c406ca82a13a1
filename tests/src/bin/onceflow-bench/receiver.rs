//! An HTTP server inside the bench, on a loopback port, for what `onceflow serve` sends out: webhook deliveries
//! (`events/postgres`) and trace exports (`tracing/postgres`).

use std::future::IntoFuture;

/// Serves `app` on `127.0.0.1:<a free port>` for the rest of the process; its base URL `http://127.0.0.1:<port>`.
pub(crate) async fn listen(app: axum::Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(axum::serve(listener, app).into_future());
    Ok(base)
}
