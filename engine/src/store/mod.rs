//! Where workflows, steps and compensations are kept: one [`Store`] trait, one implementation per database.
//!
//! Writes that belong to a step take the caller's connection inside an open transaction, so that a step's
//! business writes, its step row and the workflow's progress commit together.
//!
//! A backend is a folder (`postgres/`, `sqlite/`, `mysql/`) that holds all of its SQL, written out in its own
//! parameter style next to the code that binds it, so that one database's queries read and change on their
//! own. What the backends share is Rust without SQL: the decisions in `common.rs`, the compensation list's
//! encoding in `compensations.rs`, the held connections in `held.rs`, the statuses and their text in `status.rs`.

use std::future::Future;

use crate::error::Result;
use crate::phase::PhaseCommit;

mod audit;
mod common;
mod compensations;
mod held;
mod mysql;
mod page;
mod ping;
mod postgres;
mod records;
mod shapes;
mod sqlite;
mod status;
mod stored_as_text;

pub use crate::error::is_transient;
pub use audit::{AuditFilter, AuditRecord};
pub use held::Writer;
pub use mysql::{MIGRATOR as MYSQL_MIGRATOR, MySqlStore};
pub use page::{Cursor, WorkflowFilter};
pub use ping::PING_IDLE;
pub use postgres::{DEFAULT_COMMIT_SLOTS, MIGRATOR as POSTGRES_MIGRATOR, PgStore, REPLAN_FIRST, SLOT_HOLD};
pub use records::{CompensationRecord, Deleted, StepRecord, WorkflowRecord};
pub use sqlite::{MIGRATOR as SQLITE_MIGRATOR, PHASE_FLAGS as SQLITE_PHASE_FLAGS, SqliteStore};
pub use status::{CompensationStatus, StepKind, StepStatus, WorkflowState};

/// A connection of the store's database, as handed to transactional steps.
pub type Conn<S> = <<S as Store>::Db as sqlx::Database>::Connection;

/// An open transaction of the store's database.
pub type Tx<S> = sqlx::Transaction<'static, <S as Store>::Db>;

/// The change a commit makes to its workflow's row, applied only while the committer holds the lease.
#[derive(Debug, Clone, Default)]
pub struct WorkflowUpdate {
    /// New state, if it changes.
    pub state: Option<WorkflowState>,
    /// Output JSON, when completing.
    pub output: Option<String>,
    /// Failure JSON, when failing.
    pub error: Option<String>,
    /// Release the lease and make the workflow runnable again at this time.
    pub release_until: Option<i64>,
}

impl WorkflowUpdate {
    /// `row` as this update leaves it: what the fence writes, for a row not yet inserted.
    pub fn applied_to(&self, row: &WorkflowRecord, now: i64) -> WorkflowRecord {
        let mut row = row.clone();
        if let Some(state) = self.state {
            row.state = state;
        }
        if self.output.is_some() {
            row.output.clone_from(&self.output);
        }
        if self.error.is_some() {
            row.error.clone_from(&self.error);
        }
        if let Some(until) = self.release_until {
            row.lease_owner = None;
            row.lease_expires_at = None;
            row.next_attempt_at = until;
        }
        row.updated_at = now;
        row
    }
}

/// What one commit came to: the answer of [`Store::persist`] (the bookkeeping, inside the caller's transaction)
/// and of [`Store::commit_in_one_call`] (a whole commit as one call). Anything but `Done` means the commit must not
/// stand: a one-call commit has rolled itself back, and after `persist` the caller rolls back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Written.
    Done {
        /// A waiter in another process asked to hear of the workflow's end and this call did not tell it: the
        /// caller does ([`Store::notify_finished`]) if the commit ends the workflow. Always `false` from
        /// [`Store::commit_in_one_call`], which tells such waiters itself.
        notify: bool,
        /// Each statement phase step's output (JSON text; empty for an intent), `None` where its condition did
        /// not hold, in the phase's order. Empty without a phase, so always from [`Store::persist`].
        outputs: Vec<Option<String>>,
    },
    /// The statement phase's guard did not hold (only a one-call commit with a guarded phase reports it).
    GuardFailed,
    /// The fence found another epoch: this worker lost the lease.
    LeaseLost,
    /// The workflow row to insert exists: another start recorded it first.
    Duplicate,
}

impl Committed {
    /// Written, with no phase outputs and nothing for the caller to notify.
    pub(crate) fn done() -> Self {
        Self::Done { notify: false, outputs: Vec::new() }
    }
}

/// Everything one commit writes besides the business rows.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint<'a> {
    /// What the commit writes to its workflow's row: the row itself on the first commit, the fence on every
    /// later one.
    pub workflow: WorkflowWrite<'a>,
    /// Step rows to insert or replace.
    pub steps: &'a [StepRecord],
    /// The workflow's whole compensation list, when this commit changes it (kept in the workflow's row).
    pub compensations: Option<&'a [CompensationRecord]>,
    /// On a first commit: whether the inserted row's lease is judged by the database's clock (see [`Lease`]):
    /// its `lease_expires_at` is then moved onto that clock (the same length from the database's now as from the
    /// row's `created_at`), so that a starter whose clock runs behind does not insert a lease already over.
    pub leases_by_database: bool,
}

/// A lease as a claim, a heartbeat or a first commit gives it: `length_ms` from now, where now is the
/// database's clock when `by_database` (Postgres `clock_timestamp()`, MySQL `NOW(3)`, SQLite `julianday('now')`:
/// one clock for every process, so that one whose clock runs ahead cannot take a live lease, nor one whose clock
/// runs behind lose its own), else `now`, the engine's (a clock the database cannot see, which tests move past a
/// lease; see [`crate::clock::Clock::leases_by_database`]). Whether a workflow is due (`next_attempt_at`) is
/// always judged by `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Now by the engine's clock (ms since the epoch).
    pub now: i64,
    /// How long the lease lasts (ms).
    pub length_ms: i64,
    /// Whether the database's clock judges when the lease ends.
    pub by_database: bool,
}

impl Lease {
    /// A lease judged by `now` alone (what store tests give).
    pub fn at(now: i64, length_ms: i64) -> Self {
        Self { now, length_ms, by_database: false }
    }

    /// The now the SQL reads as `COALESCE(<this>, <the database's now>)`: `None` when the database judges.
    pub(crate) fn given_now(&self) -> Option<i64> {
        (!self.by_database).then_some(self.now)
    }
}

/// How a commit writes its workflow's row: each commit does exactly one of the two.
#[derive(Debug, Clone, Copy)]
pub enum WorkflowWrite<'a> {
    /// The workflow's first commit inserts its row, as this commit leaves it and leased to its starter. It has
    /// no fence (the epoch is the starter's) and finds no step row of the workflow; a row already there is a
    /// duplicate start.
    Insert(&'a WorkflowRecord),
    /// Every later commit is fenced by the committer's lease epoch, and changes the row only while that holds.
    Fence(Fence<'a>),
}

impl Checkpoint<'_> {
    /// The workflow's first commit: it inserts the workflow row and has no fence, so no step row of the
    /// workflow can exist yet.
    pub(crate) fn is_first(&self) -> bool {
        matches!(self.workflow, WorkflowWrite::Insert(_))
    }

    /// The workflow committed: the inserted row's, or the fence's.
    pub(crate) fn workflow_id(&self) -> &str {
        match self.workflow {
            WorkflowWrite::Insert(row) => &row.workflow_id,
            WorkflowWrite::Fence(fence) => fence.workflow_id,
        }
    }
}

/// The fence of a commit: see [`Store::fence`].
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    /// The workflow.
    pub workflow_id: &'a str,
    /// The committer's lease epoch.
    pub epoch: i64,
    /// The change to the workflow's row.
    pub update: &'a WorkflowUpdate,
    /// Now (ms).
    pub now: i64,
}

/// Operator actions that rewrite a workflow's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reopen {
    /// Run forward again from the failed step: its failed step rows are deleted.
    Forward,
    /// Run the compensations again: failed compensation steps are deleted.
    Compensation,
    /// Cancel: move to compensating with a `cancelled` failure.
    Cancel,
}

/// Persistence of the engine, implemented for Postgres ([`PgStore`]), SQLite ([`SqliteStore`]) and MySQL /
/// MariaDB ([`MySqlStore`]), which all pass one conformance suite (`tests/tests/store_conformance.rs`).
/// Postgres and SQLite also commit a whole commit, statement phase included, as one call
/// ([`Store::commit_in_one_call`]); MySQL commits in a transaction and has no statement phases.
///
/// The trait is sealed: only the engine implements it, so every store is one that suite checks. Code outside
/// the engine names it in bounds (`S: Store`) and calls it, but cannot implement it.
pub trait Store: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;

    /// Short name of the backend (`postgres`, `sqlite`, `mysql`).
    fn backend(&self) -> &'static str;

    /// The connection pool, for business reads outside steps.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    /// The pool for writes outside steps (SQLite: its single writer connection, so writers queue in process
    /// instead of sleeping in SQLite's busy handler). The same as [`Store::pool`] elsewhere.
    fn write_pool(&self) -> &sqlx::Pool<Self::Db> {
        self.pool()
    }

    /// A connection for one write outside a step (SQLite: the writer's, which the store holds; Postgres: one
    /// of those it holds for one-statement commits; elsewhere: from the pool). Held connections skip the ping
    /// an sqlx pool makes on every connection returned to it. Pass each call's result through
    /// [`Writer::check`] before the next call: a writer dropped with a call not checked is closed, not reused.
    fn writer(&self) -> impl Future<Output = Result<Writer<'_, Self::Db>>> + Send {
        async { Ok(Writer::pooled(self.write_pool().acquire().await?)) }
    }

    /// Applies the embedded migrations.
    fn migrate(&self) -> impl Future<Output = Result<()>> + Send;

    /// Begins a write transaction (SQLite: `BEGIN IMMEDIATE`, so it never has to upgrade a read lock).
    fn begin(&self) -> impl Future<Output = Result<Tx<Self>>> + Send;

    /// Inserts a new workflow, already leased to its starter, with its compensation list. `false` when the id
    /// exists.
    fn insert_workflow(
        &self,
        conn: &mut Conn<Self>,
        wf: &WorkflowRecord,
        compensations: &[CompensationRecord],
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Inserts or replaces step rows.
    fn write_steps(&self, conn: &mut Conn<Self>, steps: &[StepRecord]) -> impl Future<Output = Result<()>> + Send;

    /// The fence of every commit after the first: applies `update`, and replaces the compensation list (kept in
    /// the workflow's row) when `compensations` is given, only if the workflow's `lease_epoch` is still `epoch`.
    /// Returns `None` when the lease was lost, else whether a waiter elsewhere asked to be notified.
    fn fence(
        &self,
        conn: &mut Conn<Self>,
        workflow_id: &str,
        epoch: i64,
        update: &WorkflowUpdate,
        now: i64,
        compensations: Option<&[CompensationRecord]>,
    ) -> impl Future<Output = Result<Option<bool>>> + Send;

    /// Writes a commit's bookkeeping inside its transaction: the workflow row (on its first commit), step
    /// rows, the compensation list if it changed, and (on every later commit) the fence. Backends may do it in
    /// one round trip.
    fn persist(
        &self,
        conn: &mut Conn<Self>,
        checkpoint: &Checkpoint<'_>,
    ) -> impl Future<Output = Result<Committed>> + Send {
        async move {
            let comps = checkpoint.compensations;
            if let WorkflowWrite::Insert(row) = checkpoint.workflow
                && !self.insert_workflow(conn, row, comps.unwrap_or_default()).await?
            {
                return Ok(Committed::Duplicate);
            }
            self.write_steps(conn, checkpoint.steps).await?;
            Ok(match checkpoint.workflow {
                WorkflowWrite::Insert(_) => Committed::done(),
                WorkflowWrite::Fence(f) => {
                    match self.fence(conn, f.workflow_id, f.epoch, f.update, f.now, comps).await? {
                        Some(notify) => Committed::Done { notify, outputs: Vec::new() },
                        None => Committed::LeaseLost,
                    }
                }
            })
        }
    }

    /// Commits `checkpoint` as one call in a transaction of its own (Postgres: one statement, no `BEGIN` or
    /// `COMMIT` round trips; SQLite: one multi-statement call to the writer's thread), with the statement
    /// phase `phase` if given, and tells waiters in other processes when `finished`. A lost lease, a duplicate
    /// start or a failed guard roll the whole call back.
    /// `None` when this backend has no one-call commits (MySQL): nothing was done, and the caller commits in a
    /// transaction instead.
    fn commit_in_one_call(
        &self,
        checkpoint: &Checkpoint<'_>,
        phase: Option<PhaseCommit<'_>>,
        finished: bool,
    ) -> impl Future<Output = Result<Option<Committed>>> + Send {
        let _ = (checkpoint, phase, finished);
        async { Ok(None) }
    }

    /// The group commit's batches sent so far and the commits they answered (Postgres; `(0, 0)` elsewhere; a
    /// commit sent alone, or that left its batch to run alone, is not counted).
    fn group_commit_counts(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Tells waiters in other processes that the workflow ended (Postgres `NOTIFY`; a no-op elsewhere).
    fn notify_finished(&self, conn: &mut Conn<Self>, workflow_id: &str) -> impl Future<Output = Result<()>> + Send;

    /// One workflow.
    fn workflow(&self, workflow_id: &str) -> impl Future<Output = Result<Option<WorkflowRecord>>> + Send;

    /// A workflow's steps, in the order they started.
    fn steps(&self, workflow_id: &str) -> impl Future<Output = Result<Vec<StepRecord>>> + Send;

    /// A workflow's compensations, in registration order.
    fn compensations(&self, workflow_id: &str) -> impl Future<Output = Result<Vec<CompensationRecord>>> + Send;

    /// Claims up to `limit` runnable workflows (due by `lease.now`, their lease free or ended) for `owner`,
    /// leasing each for `lease` and incrementing its epoch.
    fn claim_due(
        &self,
        owner: &str,
        lease: Lease,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<WorkflowRecord>>> + Send;

    /// Extends the leases of `workflow_ids` (the workflows a live task of the process drives) by `lease`, each
    /// only while `owner` still holds it unended on an unfinished workflow; any other lease of `owner` is left to
    /// expire. Returns how many were extended. An empty list does no query.
    fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease: Lease)
    -> impl Future<Output = Result<u64>> + Send;

    /// Releases one workflow, runnable again at `next_attempt_at`, if `epoch` still holds it.
    fn release(
        &self,
        workflow_id: &str,
        epoch: i64,
        next_attempt_at: i64,
        now: i64,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Releases every workflow `owner` holds, runnable at once. Returns how many.
    fn release_all(&self, owner: &str, now: i64) -> impl Future<Output = Result<u64>> + Send;

    /// Marks that a waiter in another process wants a notification; returns the workflow as it is now.
    fn request_notify(&self, workflow_id: &str) -> impl Future<Output = Result<Option<WorkflowRecord>>> + Send;

    /// Whether the database answers a trivial query.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// How many workflows are in each state: a scan of the workflow table, run at most once per
    /// `count_interval` (see `Engine::workflow_counts`), never per request or scrape.
    fn count_by_state(&self) -> impl Future<Output = Result<Vec<(WorkflowState, i64)>>> + Send;

    /// Up to `limit` workflows that pass `filter`, newest first: by `created_at`, then `workflow_id`, both
    /// descending (the order [`Cursor`] continues). Every filter is a condition of the query, read through an
    /// index on `(tenant, created_at, workflow_id)` for a tenant (every backend) and on
    /// `(created_at, workflow_id)` otherwise (SQLite and MySQL; Postgres: see its store).
    fn list(&self, filter: WorkflowFilter<'_>, limit: i64) -> impl Future<Output = Result<Vec<WorkflowRecord>>> + Send;

    /// Operator retry or cancel: rewrites the workflow (and bumps its epoch, fencing out any current runner)
    /// if it is in one of `from_states`. Returns the workflow after the change, or `None` if its state did
    /// not allow it.
    fn reopen(
        &self,
        workflow_id: &str,
        from_states: &[WorkflowState],
        how: Reopen,
        error: Option<String>,
        now: i64,
    ) -> impl Future<Output = Result<Option<WorkflowRecord>>> + Send;

    /// Deletes up to `limit` finished workflows ([`WorkflowState::DELETABLE`]) whose last change (`updated_at`, their
    /// end) is at or before `ended_by` (ms), with their step rows, in one short transaction. A workflow another
    /// transaction holds (an operator's retry) is skipped, and one that changed meanwhile is deleted only if it
    /// is still finished and ended by `ended_by`. Returns what it deleted.
    fn delete_finished(&self, ended_by: i64, limit: i64) -> impl Future<Output = Result<Deleted>> + Send;

    /// What [`Store::delete_finished`] would delete with no limit (a dry run).
    fn count_finished(&self, ended_by: i64) -> impl Future<Output = Result<Deleted>> + Send;

    /// Records an operator action in the audit log (a table no retention pass touches).
    fn insert_audit(&self, entry: &AuditRecord) -> impl Future<Output = Result<()>> + Send;

    /// Completes the audit entry `id` with the action's answer.
    fn finish_audit(&self, id: &str, status: i32, result: &str) -> impl Future<Output = Result<()>> + Send;

    /// Audit entries (see [`AuditFilter`]).
    fn audit(&self, filter: AuditFilter<'_>) -> impl Future<Output = Result<Vec<AuditRecord>>> + Send;

    /// Waits for a notification that some workflow ended in another process (Postgres `LISTEN`). Returns the
    /// workflow id; `None` when this backend has no such channel (the caller then polls).
    fn listen(&self) -> impl Future<Output = Result<Option<Listener>>> + Send;

    /// Claims one workflow now, whether or not it is due, for `owner` (see [`crate::Engine::wake`]): if it is
    /// running or compensating and its lease is free, ended or `owner`'s own (a run of the owner's that stopped),
    /// leases it for `lease`, increments its epoch (fencing out any run of it) and makes it due at once (so that,
    /// should this claimer die, any process resumes it when the lease ends). `None` when it is finished,
    /// missing, or leased to another owner whose lease has not ended.
    fn claim(
        &self,
        workflow_id: &str,
        owner: &str,
        lease: Lease,
    ) -> impl Future<Output = Result<Option<WorkflowRecord>>> + Send;
}

/// Seals [`Store`]: `Sealed` is public in a private module, so no crate but the engine can name it, and so none
/// can implement [`Store`].
mod sealed {
    /// Implemented by the engine's stores only.
    pub trait Sealed {}

    impl Sealed for super::PgStore {}
    impl Sealed for super::SqliteStore {}
    impl Sealed for super::MySqlStore {}
}

/// A stream of ids of workflows that ended in another process.
pub struct Listener(pub(crate) ListenerInner);

pub(crate) enum ListenerInner {
    Postgres(sqlx::postgres::PgListener),
}

impl Listener {
    /// The next finished workflow's id.
    pub async fn recv(&mut self) -> Result<String> {
        match &mut self.0 {
            ListenerInner::Postgres(l) => Ok(l.recv().await?.payload().to_owned()),
        }
    }
}
