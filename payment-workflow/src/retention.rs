//! The retention pass: what keeps the database bounded. Unused tokens are deleted once expired, used tokens
//! (with their stored responses) once the response retention has passed since their payment ended, finished
//! workflows (with their steps) once the history retention has passed since they ended. Orders and payment
//! records are business records and are kept; nothing unfinished is deleted (a token `in_use`, a workflow
//! running, compensating or `compensation_failed`).
//!
//! A pass deletes in batches of [`BATCH`] rows, each its own short statement or transaction found by an index
//! range, so a payment waits for at most one batch; one process at a time runs it (the store's lock), and
//! ages are measured against the engine's clock.

use std::time::Duration;

use crate::error::Result;
use crate::service::Payments;
use crate::settings::millis;
use crate::store::{PaymentStore, TokenKind};

/// Rows per batch: each batch is one short transaction.
pub const BATCH: i64 = 500;

/// What one pass deleted, or with `dry_run` would delete, per kind of row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    /// Unused tokens past their expiry.
    pub unused_tokens: u64,
    /// Used tokens, with their stored responses.
    pub used_tokens: u64,
    /// Finished workflows.
    pub workflows: u64,
    /// Their steps.
    pub steps: u64,
    /// Merchant events past `--event-retention` with nothing pending, with their delivery records.
    pub events: u64,
    /// Counted only; nothing was deleted.
    pub dry_run: bool,
}

impl PassReport {
    /// `(kind, rows)`, in the order a pass deletes them; the kinds are the `kind` label of
    /// `onceflow_gc_deleted_total`.
    pub fn kinds(&self) -> [(&'static str, u64); 5] {
        [
            ("unused_tokens", self.unused_tokens),
            ("used_tokens", self.used_tokens),
            ("workflows", self.workflows),
            ("steps", self.steps),
            ("events", self.events),
        ]
    }
}

/// An events error as the pass reports it (the events' retention fails only on the database).
fn events_error(e: crate::events::EventError) -> crate::error::Error {
    match e {
        crate::events::EventError::Database(e) => e.into(),
        _ => crate::error::Error::Unavailable("the events' retention failed"),
    }
}

fn deleted(kind: &'static str, rows: u64) {
    if rows > 0 {
        metrics::counter!("onceflow_gc_deleted_total", "kind" => kind).increment(rows);
    }
}

impl<S: PaymentStore> Payments<S> {
    /// Runs one retention pass now (what `serve` and `worker` run every `--gc-interval`): `None` when another
    /// process is running one. With `dry_run`, counts what it would delete and deletes nothing (no lock
    /// taken). The ages are measured from one "now" of the engine's clock, read when the pass starts.
    pub async fn retention_pass(&self, dry_run: bool) -> Result<Option<PassReport>> {
        let now = self.engine().now_ms();
        let retention = self.retention();
        let used_by = now.saturating_sub(millis(retention.response_retention));
        let history_by = now.saturating_sub(millis(retention.history_retention));
        let store = self.engine().store();
        if dry_run {
            let history = self.engine().count_finished_before(history_by).await?;
            return Ok(Some(PassReport {
                unused_tokens: store.count_tokens(TokenKind::Unused, now).await?,
                used_tokens: store.count_tokens(TokenKind::Used, used_by).await?,
                workflows: history.workflows,
                steps: history.steps,
                events: self.events().delete_old(true, BATCH).await.map_err(events_error)?,
                dry_run: true,
            }));
        }
        let Some(lock) = store.lock_pass().await? else {
            tracing::debug!("another process is running the retention pass");
            return Ok(None);
        };
        let pass = self.delete_all(now, used_by, history_by).await;
        // The lock goes back even when a batch failed; a failed release closes its session, which drops it.
        let released = lock.release().await;
        let report = pass?;
        if let Err(e) = released {
            tracing::warn!(error = %e, "could not release the retention lock: its connection was closed");
        }
        #[allow(clippy::cast_precision_loss)]
        let finished = self.engine().now_ms() as f64 / 1000.0;
        metrics::gauge!("onceflow_gc_last_run_timestamp_seconds").set(finished);
        tracing::info!(?report, "retention pass done");
        Ok(Some(report))
    }

    /// Every batch of every kind, oldest first, until a batch comes back short.
    async fn delete_all(&self, now: i64, used_by: i64, history_by: i64) -> Result<PassReport> {
        let store = self.engine().store();
        let mut report = PassReport::default();
        for (kind, by, total, label) in [
            (TokenKind::Unused, now, &mut report.unused_tokens, "unused_tokens"),
            (TokenKind::Used, used_by, &mut report.used_tokens, "used_tokens"),
        ] {
            loop {
                let rows =
                    crate::error::again_if_transient(|| async { Ok(store.delete_tokens(kind, by, BATCH).await?) })
                        .await?;
                *total += rows;
                deleted(label, rows);
                if rows < u64::try_from(BATCH).unwrap_or(u64::MAX) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        loop {
            let batch = crate::error::again_if_transient(|| async {
                Ok(self.engine().delete_finished_before(history_by, BATCH).await?)
            })
            .await?;
            report.workflows += batch.workflows;
            report.steps += batch.steps;
            deleted("workflows", batch.workflows);
            deleted("steps", batch.steps);
            if batch.workflows < u64::try_from(BATCH).unwrap_or(u64::MAX) {
                break;
            }
            tokio::task::yield_now().await;
        }
        report.events = self.events().delete_old(false, BATCH).await.map_err(events_error)?;
        deleted("events", report.events);
        Ok(report)
    }

    /// Runs a retention pass every `every` (the first at once), until aborted; a failed pass is logged and
    /// the next one tries again.
    pub fn spawn_retention(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let payments = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = payments.retention_pass(false).await {
                    tracing::warn!(error = %e, "retention pass failed; the next one tries again");
                }
            }
        })
    }
}
