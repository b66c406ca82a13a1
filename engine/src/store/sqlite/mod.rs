//! The SQLite store: the embedded default for one process (WAL, a busy timeout, `BEGIN IMMEDIATE` writes).
//! A commit with no open transaction, and a statement phase with it, is one multi-statement call, and those of
//! concurrent workflows share a transaction (group commit).
//!
//! Its SQL is written here with `$n` parameters: the queries of single rows and leases in this file, the rows a
//! commit writes in `rows.rs`, the one-call commits in `commit.rs`; `group_commit.rs` runs the grouped ones and
//! `durable.rs` answers them once they are on disk.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Row, Sqlite};

use self::group_commit::GroupCommit;
use super::common::{self, Cleanup};
use super::held::Held;
use super::{
    Checkpoint, Committed, CompensationRecord, Conn, Deleted, Lease, Listener, Reopen, StepRecord, Store, Tx,
    WorkflowFilter, WorkflowRecord, WorkflowState, WorkflowUpdate, Writer, compensations,
};
use crate::error::Result;
use crate::phase::PhaseCommit;

mod audit;
mod commit;
mod durable;
mod gc;
mod group_commit;
mod list;
mod rows;

/// The engine's embedded SQLite migrations (its tables only: each crate migrates its own, so this one
/// leaves migrations it does not know, another crate's, alone).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/sqlite") };

/// A [`Store`] on SQLite.
///
/// SQLite lets one transaction write at a time. Writes queue in process rather than in SQLite's busy handler
/// (which sleeps in steps of up to 100 ms): one-call commits, grouped by `group` on a connection of its own (those
/// queued meanwhile share a transaction, flushed to disk off the write path: see `GroupCommit`, `Durable`), and
/// single writes on `held`, the writer connection the store keeps (see
/// `Held`: no ping to the worker thread between two uses); transactions of closure steps on `writer`'s other
/// connection, begun at their turn at `held` (see [`Store::begin`]), so a group commit that follows one waits in
/// the busy handler for its `COMMIT`. Reads use `pool` and, in WAL mode, never wait for a writer.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: sqlx::SqlitePool,
    writer: sqlx::SqlitePool,
    held: Arc<Held<Sqlite>>,
    group: GroupCommit,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`). A commit is answered once it is on
    /// disk: a payment acknowledged is on disk.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let held = Arc::new(Held::new(writer.clone(), 1));
        Ok(Self { group: GroupCommit::start(held.clone(), options), held, pool, writer })
    }

    /// A store over an existing pool (opened with WAL and a busy timeout), which then also writes. Call it
    /// inside a Tokio runtime (it starts the store's group committer, which opens a connection of its own with
    /// the pool's connect options, not its `after_connect` hook).
    pub fn from_pool(pool: sqlx::SqlitePool) -> Self {
        let held = Arc::new(Held::new(pool.clone(), 1));
        let group = GroupCommit::start(held.clone(), (*pool.connect_options()).clone());
        Self { group, held, writer: pool.clone(), pool }
    }
}

/// Where a statement phase's SQL on SQLite records what its statements did (a temporary table of the group
/// committer's connection, made when it opens, emptied when a phase starts): `INSERT INTO temp.onceflow_phase SELECT 'name' WHERE changes() = 1`
/// after a statement, `EXISTS (SELECT 1 FROM temp.onceflow_phase WHERE flag = 'name')` in a later one.
pub const PHASE_FLAGS: &str = "temp.onceflow_phase";

/// The database's clock in milliseconds since the epoch, which judges leases (see [`Lease`]): on SQLite, the
/// clock of its one process (`'now'` is read once per statement).
pub(super) const DB_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The `DELETE` of a reopen's [`Cleanup`].
fn cleanup_sql(cleanup: Cleanup) -> &'static str {
    match cleanup {
        Cleanup::FailedSteps => "DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed'",
        Cleanup::FailedCompensations => {
            "DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed' AND step_key LIKE 'compensate/%'"
        }
    }
}

impl Store for SqliteStore {
    type Db = Sqlite;

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn pool(&self) -> &sqlx::Pool<Self::Db> {
        &self.pool
    }

    fn write_pool(&self) -> &sqlx::Pool<Self::Db> {
        &self.writer
    }

    async fn writer(&self) -> Result<Writer<'_, Sqlite>> {
        self.held.get().await
    }

    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    /// On `writer`'s other connection, once it is this transaction's turn at the held writer: group commits
    /// follow one another with hardly a gap, which SQLite's busy handler (sleeping up to 100 ms between tries)
    /// would seldom hit. Once begun it holds SQLite's write lock, and the next group waits for its `COMMIT`.
    async fn begin(&self) -> Result<Tx<Self>> {
        let turn = self.held.turn().await?;
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        drop(turn);
        Ok(tx)
    }

    async fn insert_workflow(
        &self,
        conn: &mut Conn<Self>,
        wf: &WorkflowRecord,
        compensations: &[CompensationRecord],
    ) -> Result<bool> {
        let q = sqlx::query(sqlx::AssertSqlSafe(rows::insert_workflow_sql(1)));
        let done = rows::bind_workflow(q, wf, compensations::encode(compensations)?, false).execute(&mut *conn).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn write_steps(&self, conn: &mut Conn<Self>, steps: &[StepRecord]) -> Result<()> {
        if steps.is_empty() {
            return Ok(());
        }
        let q = sqlx::query(sqlx::AssertSqlSafe(rows::upsert_steps_sql(steps.len(), 1)));
        rows::bind_steps(q, steps).execute(&mut *conn).await?;
        Ok(())
    }

    async fn fence(
        &self,
        conn: &mut Conn<Self>,
        workflow_id: &str,
        epoch: i64,
        update: &WorkflowUpdate,
        now: i64,
        compensations: Option<&[CompensationRecord]>,
    ) -> Result<Option<bool>> {
        let comps = compensations.map(compensations::encode).transpose()?;
        let q = sqlx::query(sqlx::AssertSqlSafe(rows::fence_sql(1)));
        let q = rows::bind_fence(q, workflow_id, epoch, update, now, comps);
        Ok(q.try_map(|row: SqliteRow| row.try_get(0)).fetch_optional(&mut *conn).await?)
    }

    /// One multi-statement query (see `commit::persist`).
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Committed> {
        commit::persist(conn, checkpoint).await
    }

    /// One multi-statement call inside a group commit (see `commit::commit_in_one_call`).
    async fn commit_in_one_call(
        &self,
        checkpoint: &Checkpoint<'_>,
        phase: Option<PhaseCommit<'_>>,
        _finished: bool,
    ) -> Result<Option<Committed>> {
        commit::commit_in_one_call(self, checkpoint, phase).await
    }

    async fn notify_finished(&self, _conn: &mut Conn<Self>, _workflow_id: &str) -> Result<()> {
        // One process owns an SQLite database: in-process notification covers every waiter.
        Ok(())
    }

    async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
        let q = sqlx::query_as("SELECT * FROM workflows WHERE workflow_id = $1").bind(workflow_id);
        Ok(q.fetch_optional(&self.pool).await?)
    }

    async fn steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>> {
        let q =
            sqlx::query_as("SELECT * FROM workflow_steps WHERE workflow_id = $1 ORDER BY seq, started_at, step_key");
        Ok(q.bind(workflow_id).fetch_all(&self.pool).await?)
    }

    async fn compensations(&self, workflow_id: &str) -> Result<Vec<CompensationRecord>> {
        let q = sqlx::query_scalar("SELECT compensations FROM workflows WHERE workflow_id = $1").bind(workflow_id);
        let stored: Option<Option<String>> = q.fetch_optional(&self.pool).await?;
        compensations::decode(workflow_id, stored.flatten().as_deref())
    }

    /// Due by the engine's clock (`$2`); the lease by the database's (`$3` null) or the engine's.
    async fn claim_due(&self, owner: &str, lease: Lease, limit: i64) -> Result<Vec<WorkflowRecord>> {
        let sql = format!(
            "UPDATE workflows SET lease_owner = $1, lease_expires_at = COALESCE($3, {DB_NOW}) + $4, \
             lease_epoch = lease_epoch + 1 \
             WHERE workflow_id IN (SELECT workflow_id FROM workflows \
                   WHERE state IN ('running', 'compensating') AND next_attempt_at <= $2 \
                     AND (lease_expires_at IS NULL OR lease_expires_at <= COALESCE($3, {DB_NOW})) \
                   ORDER BY next_attempt_at LIMIT $5) RETURNING *"
        );
        let mut tx = self.begin().await?;
        let claimed = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(owner)
            .bind(lease.now)
            .bind(lease.given_now())
            .bind(lease.length_ms)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// The ids travel as one JSON array.
    async fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease: Lease) -> Result<u64> {
        if workflow_ids.is_empty() {
            return Ok(0);
        }
        let ids = serde_json::to_string(workflow_ids)?;
        let sql = format!(
            "UPDATE workflows SET lease_expires_at = COALESCE($2, {DB_NOW}) + $3 \
             WHERE workflow_id IN (SELECT value FROM json_each($4)) AND lease_owner = $1 \
             AND state IN ('running', 'compensating') AND lease_expires_at > COALESCE($2, {DB_NOW})"
        );
        let mut w = self.writer().await?;
        let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(owner).bind(lease.given_now()).bind(lease.length_ms);
        let done = q.bind(ids).execute(&mut *w).await;
        Ok(w.check(done)?.rows_affected())
    }

    async fn release(&self, workflow_id: &str, epoch: i64, next_attempt_at: i64, now: i64) -> Result<bool> {
        let mut w = self.writer().await?;
        let q = sqlx::query(
            "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = $3, updated_at = $4 \
             WHERE workflow_id = $1 AND lease_epoch = $2",
        );
        let done = q.bind(workflow_id).bind(epoch).bind(next_attempt_at).bind(now).execute(&mut *w).await;
        Ok(w.check(done)?.rows_affected() == 1)
    }

    async fn release_all(&self, owner: &str, now: i64) -> Result<u64> {
        let mut w = self.writer().await?;
        let q = sqlx::query(
            "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = $2, updated_at = $2 \
             WHERE lease_owner = $1 AND state IN ('running', 'compensating')",
        );
        let done = q.bind(owner).bind(now).execute(&mut *w).await;
        Ok(w.check(done)?.rows_affected())
    }

    async fn request_notify(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
        let mut w = self.writer().await?;
        let q = sqlx::query_as("UPDATE workflows SET notify = TRUE WHERE workflow_id = $1 RETURNING *");
        let found = q.bind(workflow_id).fetch_optional(&mut *w).await;
        Ok(w.check(found)?)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn count_by_state(&self) -> Result<Vec<(WorkflowState, i64)>> {
        Ok(sqlx::query_as("SELECT state, count(*) FROM workflows GROUP BY state").fetch_all(&self.pool).await?)
    }

    /// See `list.rs`.
    async fn list(&self, filter: WorkflowFilter<'_>, limit: i64) -> Result<Vec<WorkflowRecord>> {
        list::list(&self.pool, filter, limit).await
    }

    async fn reopen(
        &self,
        workflow_id: &str,
        from_states: &[WorkflowState],
        how: Reopen,
        error: Option<String>,
        now: i64,
    ) -> Result<Option<WorkflowRecord>> {
        let mut tx = self.begin().await?;
        let current = sqlx::query_as("SELECT state, compensations FROM workflows WHERE workflow_id = $1")
            .bind(workflow_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(plan) = common::reopen_plan(workflow_id, current, from_states, how)? else {
            return Ok(None);
        };
        if let Some(cleanup) = plan.cleanup {
            sqlx::query(cleanup_sql(cleanup)).bind(workflow_id).execute(&mut *tx).await?;
        }
        let row: WorkflowRecord = sqlx::query_as(
            "UPDATE workflows SET state = $2, error = CASE WHEN $3 THEN NULL ELSE COALESCE($4, error) END, \
             lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1, \
             next_attempt_at = $5, updated_at = $5, compensations = COALESCE($6, compensations) \
             WHERE workflow_id = $1 RETURNING *",
        )
        .bind(workflow_id)
        .bind(plan.state)
        .bind(plan.clear_error)
        .bind(error)
        .bind(now)
        .bind(plan.compensations)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(row))
    }

    async fn delete_finished(&self, ended_by: i64, limit: i64) -> Result<Deleted> {
        gc::delete_finished(self, ended_by, limit).await
    }

    async fn count_finished(&self, ended_by: i64) -> Result<Deleted> {
        gc::count_finished(self, ended_by).await
    }

    async fn insert_audit(&self, entry: &super::AuditRecord) -> Result<()> {
        audit::insert(&self.writer, entry).await
    }

    async fn finish_audit(&self, id: &str, status: i32, result: &str) -> Result<()> {
        audit::finish(&self.writer, id, status, result).await
    }

    async fn audit(&self, filter: super::AuditFilter<'_>) -> Result<Vec<super::AuditRecord>> {
        audit::read(&self.pool, filter).await
    }

    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn claim(&self, workflow_id: &str, owner: &str, lease: Lease) -> Result<Option<WorkflowRecord>> {
        let sql = format!(
            "UPDATE workflows SET lease_owner = $2, lease_expires_at = COALESCE($3, {DB_NOW}) + $4, \
             lease_epoch = lease_epoch + 1, next_attempt_at = MIN(next_attempt_at, $5) \
             WHERE workflow_id = $1 AND state IN ('running', 'compensating') AND (lease_owner = $2 \
             OR lease_expires_at IS NULL OR lease_expires_at <= COALESCE($3, {DB_NOW})) RETURNING *"
        );
        let mut w = self.writer().await?;
        let q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(workflow_id).bind(owner).bind(lease.given_now());
        let found = q.bind(lease.length_ms).bind(lease.now).fetch_optional(&mut *w).await;
        Ok(w.check(found)?)
    }
}
