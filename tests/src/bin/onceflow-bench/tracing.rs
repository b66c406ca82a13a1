//! `tracing/postgres`: the usual HTTP payment load on `onceflow serve` on Postgres without tracing, then with
//! `--otlp-endpoint` pointing at an OTLP/HTTP receiver inside the bench, from the same invocation (issue 33): what
//! exporting the spans of every request, workflow run and step costs the payments.
//!
//! Two servers, each on a fresh database: `tracing/postgres off` pays without the flag, then `tracing/postgres`
//! pays the same way with it. The receiver answers every `POST /v1/traces` `200` (an empty protobuf answer) and
//! counts the requests and their bytes; it does not decode them. The server batches its spans (the SDK's batch
//! processor, which drops spans past its queue rather than wait), so the count is of export requests, not spans;
//! it is read when the payments end and again once the next scheduled export has had time to come in.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;

use super::http;
use super::measure::Run;
use super::options::Options;
use super::receiver;

/// Longer than the batch processor's scheduled delay (5 s): the exports of the last spans come in by then.
const SETTLE: Duration = Duration::from_secs(6);

/// What the scenario measured.
pub(crate) struct Traced {
    /// Payments without tracing.
    pub(crate) without: Run,
    /// Payments exporting their traces.
    pub(crate) with: Run,
    /// What the receiver got.
    pub(crate) exports: Exports,
}

/// The export requests the receiver got.
pub(crate) struct Exports {
    /// By the end of the payments.
    pub(crate) at_end: u64,
    /// By `settle` later.
    pub(crate) settled: u64,
    /// Their bytes, by `settle` later.
    pub(crate) bytes: u64,
    /// How long after the payments `settled` was read.
    pub(crate) settle: Duration,
}

/// Export requests and their bytes.
#[derive(Default)]
struct Got {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn export(State(got): State<Arc<Got>>, body: Bytes) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    got.requests.fetch_add(1, Ordering::Relaxed);
    got.bytes.fetch_add(u64::try_from(body.len()).unwrap_or(u64::MAX), Ordering::Relaxed);
    ([("content-type", "application/x-protobuf")], Vec::new())
}

/// Runs both halves (see the module) on fresh databases of `base`'s server.
pub(crate) async fn postgres(base: &str, o: &Options) -> anyhow::Result<Traced> {
    let (off_server, _) = http::serve_seeded(base, "onceflow_bench_tracing_off", o, &[]).await?;
    let without = http::run("tracing/postgres off", &off_server, o).await?;
    drop(off_server);

    let got = Arc::new(Got::default());
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(export)).with_state(got.clone());
    let collector = receiver::listen(app).await?;
    let (server, _) = http::serve_seeded(base, "onceflow_bench_tracing", o, &["--otlp-endpoint", &collector]).await?;
    let with = http::run("tracing/postgres", &server, o).await?;
    let at_end = got.requests.load(Ordering::Relaxed);
    tokio::time::sleep(SETTLE).await;
    let exports = Exports {
        at_end,
        settled: got.requests.load(Ordering::Relaxed),
        bytes: got.bytes.load(Ordering::Relaxed),
        settle: SETTLE,
    };
    eprintln!(
        "  tracing/postgres: {} trace export requests by the end of the payments, {} ({} bytes) {} s later",
        exports.at_end,
        exports.settled,
        exports.bytes,
        SETTLE.as_secs()
    );
    anyhow::ensure!(exports.settled > 0, "no trace export reached the receiver");
    drop(server);
    Ok(Traced { without, with, exports })
}
