//! `events/postgres`: the usual HTTP payment load on `onceflow serve` on Postgres without a webhook endpoint,
//! then with one endpoint subscribed to every event, from the same invocation (issue 32): what the outbox and its
//! deliveries cost the payments.
//!
//! Two servers, each on a fresh database with the same flags (`--webhook-allow-http --webhook-allow-private`, so
//! that a loopback receiver may be registered): `events/postgres off` pays with no endpoint, then
//! `events/postgres` pays the same way with one endpoint registered through `POST /v1/webhook-endpoints`, whose
//! receiver is a server inside the bench answering `204` and counting deliveries by `webhook-id`. After the
//! payments it waits (bounded) until the receiver has every event, then checks: the log `GET /v1/events` paged
//! from start to end holds one `payment.succeeded` per payment made (each `request_no` and `order_no` once);
//! every event of the log was delivered, and nothing else was; an event delivered more than once is counted,
//! and its deliveries must not outnumber the attempts onceflow recorded for it (one attempt sent twice).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use super::http::{self, Server};
use super::measure::Run;
use super::options::Options;
use super::receiver;

/// Both servers' flags: the endpoint is a plain-http loopback receiver.
const LOCAL: [&str; 2] = ["--webhook-allow-http", "--webhook-allow-private"];

/// How long the receiver may take to get every event after the last payment.
const DRAIN: Duration = Duration::from_secs(180);

/// What the scenario measured and checked.
pub(crate) struct Evented {
    /// Payments without an endpoint.
    pub(crate) without: Run,
    /// Payments with one endpoint subscribed.
    pub(crate) with: Run,
    /// The receiver and the log after the latter.
    pub(crate) checked: Checked,
}

/// What the receiver and the event log showed after the payments with the endpoint.
pub(crate) struct Checked {
    /// Events of the log paged from start to end (all `payment.succeeded`, one per payment).
    pub(crate) logged: usize,
    /// Distinct event ids the receiver got.
    pub(crate) delivered: usize,
    /// Deliveries the receiver got in all.
    pub(crate) requests: u64,
    /// Event ids delivered more than once (a retry after a timeout, say).
    pub(crate) repeated: usize,
    /// Deliveries beyond the attempts onceflow recorded for their event: one attempt sent twice.
    pub(crate) doubled: u64,
    /// From the last payment's answer until the receiver had every event.
    pub(crate) drained: Duration,
}

/// What the receiver got: deliveries per `webhook-id`, and deliveries in all.
#[derive(Default)]
struct Received {
    by_id: HashMap<String, u64>,
    requests: u64,
}

type Sink = Arc<Mutex<Received>>;

/// A delivery: counted under its `webhook-id`, answered `204`.
async fn deliver(State(sink): State<Sink>, headers: HeaderMap, _body: Bytes) -> StatusCode {
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let mut got = sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    got.requests += 1;
    *got.by_id.entry(id).or_default() += 1;
    StatusCode::NO_CONTENT
}

fn received(sink: &Sink) -> std::sync::MutexGuard<'_, Received> {
    sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs both halves (see the module) on fresh databases of `base`'s server.
pub(crate) async fn postgres(base: &str, o: &Options) -> anyhow::Result<Evented> {
    let (off_server, _) = http::serve_seeded(base, "onceflow_bench_events_off", o, &LOCAL).await?;
    let without = http::run("events/postgres off", &off_server, o).await?;
    drop(off_server);

    let sink = Sink::default();
    let app = axum::Router::new().route("/hooks", axum::routing::post(deliver)).with_state(sink.clone());
    let hooks = format!("{}/hooks", receiver::listen(app).await?);
    let (server, _) = http::serve_seeded(base, "onceflow_bench_events", o, &LOCAL).await?;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/v1/webhook-endpoints", server.base()))
        .json(&serde_json::json!({"url": hooks}))
        .send()
        .await?;
    let status = r.status();
    anyhow::ensure!(status == 201, "registering the endpoint: {status} {}", r.text().await.unwrap_or_default());

    let with = http::run("events/postgres", &server, o).await?;
    let paid = Instant::now();
    let expected = usize::try_from(with.done)?;
    while received(&sink).by_id.len() < expected && paid.elapsed() < DRAIN {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = paid.elapsed();
    let checked = check(&client, &server, &sink, expected, drained).await?;
    eprintln!(
        "  events/postgres: {} events in the log, {} delivered ({} deliveries) {:.1} s after the last payment; {} \
         delivered more than once, {} deliveries beyond their recorded attempts",
        checked.logged,
        checked.delivered,
        checked.requests,
        checked.drained.as_secs_f64(),
        checked.repeated,
        checked.doubled
    );
    anyhow::ensure!(checked.delivered == expected, "{expected} payments, {} events delivered", checked.delivered);
    anyhow::ensure!(checked.doubled == 0, "{} deliveries sent one attempt again", checked.doubled);
    drop(server);
    Ok(Evented { without, with, checked })
}

/// The log from start to end: one `payment.succeeded` per payment made; each of its events delivered and nothing
/// else; the repeats against the attempts recorded.
async fn check(
    client: &reqwest::Client,
    server: &Server,
    sink: &Sink,
    expected: usize,
    drained: Duration,
) -> anyhow::Result<Checked> {
    let base = server.base();
    let (mut ids, mut requests_nos, mut orders) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut logged = 0;
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("limit", "1000".to_owned())];
        query.extend(after.clone().map(|a| ("after", a)));
        let page: serde_json::Value =
            client.get(format!("{base}/v1/events")).query(&query).send().await?.error_for_status()?.json().await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            break;
        }
        for e in &events {
            anyhow::ensure!(e["type"] == "payment.succeeded", "an event of the log is not payment.succeeded: {e}");
            ids.insert(e["id"].as_str().unwrap_or_default().to_owned());
            requests_nos.insert(e["data"]["request_no"].as_str().unwrap_or_default().to_owned());
            orders.insert(e["data"]["order_no"].as_str().unwrap_or_default().to_owned());
        }
        logged += events.len();
        after = page["next_cursor"].as_str().map(str::to_owned);
        anyhow::ensure!(after.is_some(), "a page without next_cursor");
    }
    anyhow::ensure!(logged == expected, "{expected} payments, {logged} events in the log");
    anyhow::ensure!(ids.len() == logged, "{logged} events in the log, {} distinct ids", ids.len());
    anyhow::ensure!(
        requests_nos.len() == expected && orders.len() == expected,
        "{expected} payments: {} request_no and {} order_no in the log",
        requests_nos.len(),
        orders.len()
    );

    let (delivered, requests, repeats) = {
        let got = received(sink);
        let unknown: Vec<&String> = got.by_id.keys().filter(|id| !ids.contains(*id)).collect();
        anyhow::ensure!(unknown.is_empty(), "delivered but not in the log: {unknown:?}");
        let missing = ids.iter().filter(|id| !got.by_id.contains_key(*id)).count();
        anyhow::ensure!(
            missing == 0,
            "{missing} events of the log not delivered within {} s after the last payment",
            drained.as_secs()
        );
        let repeats: Vec<(String, u64)> =
            got.by_id.iter().filter(|(_, n)| **n > 1).map(|(id, n)| (id.clone(), *n)).collect();
        (got.by_id.len(), got.requests, repeats)
    };
    let mut doubled = 0;
    for (k, (id, n)) in repeats.iter().enumerate() {
        let detail: serde_json::Value =
            client.get(format!("{base}/v1/events/{id}")).send().await?.error_for_status()?.json().await?;
        let attempts: u64 = detail["deliveries"]
            .as_array()
            .map(|ds| ds.iter().filter_map(|d| d["attempts"].as_u64()).sum())
            .unwrap_or_default();
        if k < 5 {
            eprintln!("  events/postgres: {id} delivered {n} times, {attempts} attempt(s) recorded: {detail}");
        }
        doubled += n.saturating_sub(attempts);
    }
    Ok(Checked { logged, delivered, requests, repeated: repeats.len(), doubled, drained })
}
