//! Where the channel's word is kept (migration 0045): its notifications, the statements reconciliation reads,
//! and what reconciling found. The [`ChannelWordStore`] trait, its rows, and one implementation over every
//! backend (`queries.rs`, the same SQL built through `QueryBuilder`), with what differs between the databases
//! beside each backend (`postgres.rs`, `sqlite.rs`, `mysql.rs`: upserts, batched deletes, the run's lock).

use std::future::Future;

use onceflow_engine::Store;

use super::PassLock;
use crate::model::PaymentRecord;

mod mysql;
mod postgres;
mod queries;
mod sqlite;

/// The channel's word on one charge or refund: a verified notification (`source` `notification`) or a
/// statement's settlement of a payment still unknown or processing (`statement`), recorded once per
/// `(merchant_id, notification_id)`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ChannelWord {
    /// The channel merchant it is for.
    pub merchant_id: String,
    /// The notification's `id`, or `statement:<day>:<kind>:<number>`.
    pub notification_id: String,
    /// `notification` or `statement`.
    pub source: String,
    /// The tenant whose merchant id it names.
    pub tenant: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// The charge's `merchant_request_no` or the refund's `merchant_refund_no`.
    pub number: String,
    /// The final status reported: `succeeded`, `declined` or `failed`.
    pub status: String,
    /// Minor units.
    pub amount: i64,
    /// The notification's body as received (or the statement's line): evidence.
    pub body: String,
    /// When onceflow took it (ms).
    pub received_at: i64,
    /// When it was taken up — applied by the workflow holding the number, or found to settle nothing (a number
    /// onceflow does not hold, a final status it agrees with or contradicts, another payment's data); `None`
    /// while it waits to be delivered.
    pub applied_at: Option<i64>,
    /// What came of it ([`crate::notifications::WordOutcome`]).
    pub outcome: Option<String>,
}

/// One line of a statement's copy, as reconciliation reads it back.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StagedLine {
    /// `charge` or `refund`.
    pub kind: String,
    /// The entry's number.
    pub number: String,
    /// The channel's final status.
    pub status: String,
    /// Minor units.
    pub amount: i64,
    /// The line as the channel sent it (JSON).
    pub line: String,
}

/// The copy of a day's statement reconciliation reads.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StatementCopy {
    /// Whose.
    pub tenant: String,
    /// `YYYY-MM-DD`.
    pub day: String,
    /// Its lines' key in `statement_lines`.
    pub copy_id: String,
    /// 1 when the channel said the day was closed.
    pub complete: i64,
    /// Lines read (repeats included).
    pub line_count: i64,
    /// When it was read (ms).
    pub fetched_at: i64,
}

/// A (tenant, day)'s reconciliation as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReconciliationRow {
    /// Whose.
    pub tenant: String,
    /// `YYYY-MM-DD`.
    pub day: String,
    /// The run whose exceptions are current.
    pub run_id: String,
    /// `complete` or `partial`.
    pub state: String,
    /// When that run ended (ms).
    pub ran_at: i64,
    /// `{class: count}` (JSON).
    pub counts: String,
}

/// One exception of a run as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ExceptionRow {
    /// `charge` or `refund`.
    pub kind: String,
    /// Its number.
    pub number: String,
    /// Its class.
    pub class: String,
    /// Ours (JSON), if we hold it.
    pub ours: Option<String>,
    /// The channel's line (JSON), if it has one.
    pub channel: Option<String>,
    /// `none`, `settled` or `operator`.
    pub action: String,
}

/// Where the channel's word and the reconciliations are kept: every [`super::PaymentStore`] is one.
pub trait ChannelWordStore: Store {
    /// Records `word` unless one with its `(merchant_id, notification_id)` exists; whether it did. Durable
    /// when this returns.
    fn record_word(&self, word: &ChannelWord) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// Every word recorded on the tenant's `kind` `number`, oldest first.
    fn words_on(
        &self,
        tenant: &str,
        kind: &str,
        number: &str,
    ) -> impl Future<Output = Result<Vec<ChannelWord>, sqlx::Error>> + Send;
    /// Marks the word `(merchant_id, notification_id)` taken up, with what came of it (`outcome`), unless it was
    /// taken up before; whether this marked it.
    fn mark_word(
        &self,
        merchant_id: &str,
        notification_id: &str,
        outcome: &str,
        now: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// Up to `limit` words not taken up yet, oldest first (few: each is taken up as soon as it is delivered).
    fn unapplied_words(&self, limit: i64) -> impl Future<Output = Result<Vec<ChannelWord>, sqlx::Error>> + Send;
    /// How many words are recorded, all sources (for tests and the benchmark).
    fn count_words(&self) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Takes the reconciliation's lock without waiting (one process at a time): `None` when another holds it.
    fn lock_reconcile(&self) -> impl Future<Output = Result<Option<PassLock>, sqlx::Error>> + Send;
    /// Notes a copy or run `id` begun for (tenant, day), so that it can be found and deleted if it never
    /// becomes current.
    fn begin_scratch(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        now: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Adds lines to a copy; a line whose (kind, number) the copy has is the same entry and is dropped.
    fn stage_lines(&self, copy_id: &str, lines: &[StagedLine]) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Refreshes the planner's statistics of the statement lines after a copy was staged (Postgres: a
    /// database without autovacuum, or one whose autovacuum has not come round yet, would otherwise plan the
    /// batches' lookups as scans of a table it believes empty).
    fn analyze_lines(&self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Makes `copy` the (tenant, day)'s current copy, in one statement.
    fn set_copy(&self, copy: &StatementCopy) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The (tenant, day)'s current copy.
    fn copy_of(
        &self,
        tenant: &str,
        day: &str,
    ) -> impl Future<Output = Result<Option<StatementCopy>, sqlx::Error>> + Send;
    /// The copy's lines of `kind` after `number`, in number order, at most `limit`: one range of the primary key
    /// per batch (a condition over both columns, `kind > … OR (kind = … AND number > …)`, is no range to every
    /// planner, and made a day of a million lines quadratic).
    fn lines_after(
        &self,
        copy_id: &str,
        kind: &str,
        number: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<StagedLine>, sqlx::Error>> + Send;
    /// The copy's lines of `kind` among `numbers`.
    fn lines_numbered(
        &self,
        copy_id: &str,
        kind: &str,
        numbers: &[String],
    ) -> impl Future<Output = Result<Vec<StagedLine>, sqlx::Error>> + Send;
    /// The tenant's payments among `numbers`.
    fn payments_numbered(
        &self,
        tenant: &str,
        numbers: &[String],
    ) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
    /// The tenant's payments `succeeded` with their last change in `[from, to)` (ms), by `request_no` after
    /// `after`, at most `limit`.
    fn succeeded_between(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
        after: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
    /// Adds exceptions to run `run_id` (invisible until the run is current).
    fn insert_exceptions(
        &self,
        run_id: &str,
        rows: &[ExceptionRow],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Makes `row` the (tenant, day)'s reconciliation, in one statement: the run's counts and exceptions
    /// replace the previous run's at once.
    fn set_reconciliation(&self, row: &ReconciliationRow) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The reconciliations of `day` (of `tenant` only, when given).
    fn reconciliations_on(
        &self,
        day: &str,
        tenant: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ReconciliationRow>, sqlx::Error>> + Send;
    /// The days since `since` (inclusive) whose reconciliation is `partial`, oldest first.
    fn partial_days(&self, since: &str) -> impl Future<Output = Result<Vec<(String, String)>, sqlx::Error>> + Send;
    /// A run's exceptions, by kind and number, at most `limit`.
    fn exceptions_of(
        &self,
        run_id: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ExceptionRow>, sqlx::Error>> + Send;
    /// A run's exceptions that `previous` did not have in the same class (what a re-run newly found), at most
    /// `limit`.
    fn new_exceptions(
        &self,
        run_id: &str,
        previous: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ExceptionRow>, sqlx::Error>> + Send;
    /// The ids begun for (tenant, day) that are neither its current copy nor its current run.
    fn stale_scratch(&self, tenant: &str, day: &str) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;
    /// Deletes up to `limit` rows (lines, then exceptions) of scratch `id`; how many. At 0, forgets `id`.
    fn delete_scratch(&self, id: &str, limit: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}
