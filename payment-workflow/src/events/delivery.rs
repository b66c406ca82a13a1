//! The delivery loop, run by `serve` and `worker`: the dispatcher turns committed events into deliveries, then
//! due deliveries are claimed per endpoint — as many as the process's slots allow it (`slots.rs`: a lane of
//! its own for every endpoint, shared slots in turn, none for an endpoint that is failing), so a slow or dead
//! endpoint holds only its own — and each attempt is sent in a task of its own (`attempt.rs`). The loop runs
//! again when an attempt ends, or after its poll. Every few seconds it counts what is pending and how far
//! dispatching lags, and names the transaction holding the log back when that lasts.
//!
//! A claim leases the delivery, on the database's clock, for longer than an attempt can take
//! ([`EventSettings::lease`]), and an attempt is sent only while its lease has room for it, so no two processes
//! send one attempt at once; a process that dies mid-attempt leaves its lease to expire, and the delivery is
//! sent again — with the same `webhook-id` — by whichever process claims it next.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_engine::Engine;
use tokio::task::JoinSet;

use super::attempt::{Job, attempt, client};
use super::model::rfc3339;
use super::settings::EventSettings;
use super::slots::Slots;
use super::store::EventStore;
use crate::settings::millis;

/// Events the dispatcher takes per transaction.
const DISPATCH_BATCH: i64 = 500;

/// How often the gauges are counted.
const GAUGES: Duration = Duration::from_secs(5);

/// How long events may wait to be dispatched before the loop says what holds them.
const HELD_WARNING: Duration = Duration::from_secs(10);

/// How often it says so, at most.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Dispatches everything committed since the last pass, a batch per transaction: how many events.
pub(crate) async fn dispatch_all<S: EventStore>(store: &S, now: i64, schedule: &str) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let n = store.dispatch(DISPATCH_BATCH, now, schedule).await?;
        total += n;
        if n < DISPATCH_BATCH.unsigned_abs() {
            return Ok(total);
        }
    }
}

/// A place to start visiting `n` endpoints from, drawn for each pass.
fn start(n: usize) -> usize {
    usize::try_from(uuid::Uuid::new_v4().as_u128() % (n.max(1) as u128)).unwrap_or(0)
}

/// Runs the dispatcher and the deliveries until aborted (`serve`, `worker`).
pub(crate) async fn run<S: EventStore>(engine: Engine<S>, settings: Arc<EventSettings>) {
    let client = match client(&settings) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "webhook deliveries cannot start: no HTTP client");
            return;
        }
    };
    let slots = Slots::new(settings.per_endpoint);
    let mut tasks = JoinSet::new();
    let schedule = settings.stored_schedule();
    let lease = settings.lease();
    let mut watch = Watch::default();
    loop {
        let store = engine.store();
        if let Err(e) = dispatch_all(store, engine.now_ms(), &schedule).await {
            tracing::warn!(error = %e, "event dispatch failed; the next pass tries again");
        }
        while tasks.try_join_next().is_some() {}
        match store.due_endpoints().await {
            Ok(due) => {
                for (endpoint, permits) in slots.reserve(&due, start(due.len())) {
                    let asked_at = Instant::now();
                    let n = i64::try_from(permits.len()).unwrap_or(1);
                    let claimed = match EventStore::claim(store, &endpoint, n, engine.now_ms(), millis(lease)).await {
                        Ok(claimed) => claimed,
                        Err(e) => {
                            tracing::warn!(error = %e, endpoint, "could not claim deliveries");
                            continue;
                        }
                    };
                    // Permits a claim did not use go back as the iterator drops them.
                    for (c, permit) in claimed.into_iter().zip(permits) {
                        let job = Job {
                            engine: engine.clone(),
                            client: client.clone(),
                            settings: settings.clone(),
                            slots: slots.clone(),
                            deadline: asked_at + lease,
                        };
                        tasks.spawn(attempt(job, c, permit.used()));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for due deliveries"),
        }
        if watch.counted.is_none_or(|at| at.elapsed() >= GAUGES) {
            watch.counted = Some(Instant::now());
            watch.count(&engine).await;
            slots.forget_old();
        }
        tokio::select! {
            () = tokio::time::sleep(settings.poll) => {}
            () = slots.ended() => {}
        }
    }
}

/// The gauges, and when the loop last counted them and last warned.
#[derive(Default)]
struct Watch {
    counted: Option<Instant>,
    warned: Option<Instant>,
}

impl Watch {
    /// Counts what is pending and how far dispatching lags; names what holds the log back when it lags long.
    #[allow(clippy::cast_precision_loss)]
    async fn count<S: EventStore>(&mut self, engine: &Engine<S>) {
        let store = engine.store();
        if let Ok((count, oldest)) = store.pending().await {
            metrics::gauge!("onceflow_webhook_pending").set(count as f64);
            let age = oldest.map_or(0, |created| (engine.now_ms() - created).max(0));
            metrics::gauge!("onceflow_webhook_oldest_pending_seconds").set(age as f64 / 1000.0);
        }
        let lag = match store.undispatched().await {
            Ok(first) => first.map_or(0, |created| (engine.now_ms() - created).max(0)),
            Err(e) => {
                tracing::warn!(error = %e, "could not measure the dispatch lag");
                return;
            }
        };
        metrics::gauge!("onceflow_event_dispatch_lag_seconds").set(lag as f64 / 1000.0);
        if lag < millis(HELD_WARNING) || self.warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.warned = Some(Instant::now());
        let lag_seconds = lag / 1000;
        match store.log_held_by().await {
            Ok(Some(holder)) => tracing::warn!(
                lag_seconds,
                pid = holder.pid,
                xact_start = %holder.xact_start.map(rfc3339).unwrap_or_default(),
                state = %holder.state.unwrap_or_default(),
                "events wait to be dispatched: the log shows an event only once every transaction of this database \
                 that began before it has ended, and this one has not (end it; idle_in_transaction_session_timeout \
                 ends such sessions: see docs/events.md)"
            ),
            Ok(None) => tracing::warn!(lag_seconds, "events committed this long ago are not dispatched yet"),
            Err(e) => tracing::warn!(error = %e, lag_seconds, "events wait to be dispatched; no holder found"),
        }
    }
}
