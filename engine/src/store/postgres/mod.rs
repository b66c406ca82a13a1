//! The Postgres store: for production and for many processes against one database.
//!
//! Its SQL is written here with `$n` parameters: the queries of single rows and leases in this file, the rows a
//! commit writes in `rows.rs`, and the one-statement commit in `commit.rs`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row};

use super::common::{self, Cleanup};
use super::held::Held;
use super::ping;
use super::{
    Checkpoint, Committed, CompensationRecord, Conn, Deleted, Lease, Listener, ListenerInner, Reopen, StepRecord,
    Store, Tx, WorkflowFilter, WorkflowRecord, WorkflowState, WorkflowUpdate, Writer, compensations,
};
use crate::error::Result;
use crate::phase::PhaseCommit;

mod args;
mod audit;
mod commit;
mod gc;
mod group;
mod list;
mod migrate;
mod rows;

/// The engine's embedded Postgres migrations (its tables only: each crate migrates its own, so this one
/// leaves migrations it does not know, another crate's, alone).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/postgres") };

/// Connections of the lease heartbeat and the recovery scan, besides the pool.
const LEASE_CONNECTIONS: u32 = 2;

/// The database's clock in milliseconds since the epoch, which judges leases (see [`Lease`]): the time of the
/// statement's evaluation, not of its transaction's start.
pub(super) const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The channel on which a finished workflow's id is sent to waiters in other processes.
const NOTIFY_CHANNEL: &str = "onceflow_workflow_done";

/// A [`Store`] on Postgres.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: sqlx::PgPool,
    /// Most of the pool's connections, kept for one-statement commits and writes (see [`Held`]); none when
    /// the pool is too small to spare them.
    held: Option<Arc<Held<Postgres>>>,
    /// Two connections of their own for the lease heartbeat and the recovery scan, so that commits holding the
    /// pool and requests waiting on it cannot starve them (a lease that is not extended is lost to another
    /// process).
    leases: sqlx::PgPool,
    /// The group commit of one-statement commits (see `group.rs`); none when turned off.
    group: Option<Arc<group::GroupCommit>>,
}

/// Commits sent at once by default before more wait and go together (see [`PgStore::group_commit`]). Measured on
/// two cores (`docs/benchmarks.md`), two slots gave about twice the payments of commits alone with 64 in flight,
/// at a third to a fifth of the p99, and with 16 a quarter more over HTTP and half as much again in the library
/// (on another day a tenth fewer over HTTP, the p99 within a few milliseconds either way); a lone commit finds a
/// slot free and never waits. `0` turns group commit off.
pub const DEFAULT_COMMIT_SLOTS: usize = 2;

/// How long a commit sent alone by the group commit holds its slot, from the moment it has its connection, before
/// it gives it back (to a batch, if commits wait) and goes on without one: a payment's commit takes a few
/// milliseconds, so only one that waits for a row lock or a slow server holds a slot this long, and it would
/// otherwise hold up the process's other commits for as long as it waits. See [`PgStore::group_commit_holding`].
pub const SLOT_HOLD: Duration = Duration::from_millis(50);

/// The most commits one batch of the group commit holds.
const MAX_BATCH: usize = 32;

/// How long after a held connection is taken its prepared statements are first planned again, then after each
/// wait doubled, up to ten minutes (see `held.rs`): a plan made while a table was nearly empty does not outlive
/// the table's growth, even where no `ANALYZE` runs to invalidate it.
pub const REPLAN_FIRST: Duration = Duration::from_secs(10);

/// Whether a database error ended its session: the server's `FATAL` or `PANIC` (a restart, `pg_terminate_backend`,
/// `idle_session_timeout`), after which the connection is gone; an `ERROR` ended only the statement.
pub(super) fn ends_session(e: &(dyn sqlx::error::DatabaseError + 'static)) -> bool {
    use sqlx::postgres::{PgDatabaseError, PgSeverity};
    match e.try_downcast_ref::<PgDatabaseError>() {
        Some(pg) => matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic),
        None => true,
    }
}

impl PgStore {
    /// Connects a pool of up to `max_connections` to `url` (`postgres://…`).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)?;
        Ok(Self::from_pool(Self::pool_options(max_connections).connect_with(options).await?))
    }

    /// The options of the store's pools; for pools made elsewhere and given to [`PgStore::from_pool`].
    pub fn pool_options(max_connections: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections)
            // No ping on every acquire: it was a round trip per transaction. A connection a server restart
            // broke fails its query instead, which the engine retries and the API answers with `503`...
            .test_before_acquire(false)
            // ...unless it sat idle a second or more, as after a restart: that one is pinged (`ping.rs`).
            .before_acquire(ping::ping_if_idle)
            .acquire_timeout(ping::ACQUIRE_TIMEOUT)
    }

    /// The plan (`EXPLAIN`) of the query [`Store::list`] sends for `filter`, on `conn` (whose session settings it
    /// keeps): for tests and operators who check that a page reads an index, not the table.
    pub async fn explain_list(conn: &mut sqlx::PgConnection, filter: WorkflowFilter<'_>, limit: i64) -> Result<String> {
        let (sql, args) = list::list_query(filter, limit)?;
        let q = sqlx::query_scalar_with::<Postgres, String, _>(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")), args);
        Ok(q.fetch_all(conn).await?.join("\n"))
    }

    /// Applies `migrator`'s migrations not yet applied, one process at a time: the migration lock is tried
    /// rather than waited for, so that processes starting together do not deadlock an index built
    /// `CONCURRENTLY`, and an index such a build left INVALID is built again (see `migrate.rs`). For the
    /// migrations of the crates on top of the engine, which share its history table.
    pub async fn run_migrations(&self, migrator: &'static sqlx::migrate::Migrator) -> Result<()> {
        migrate::run(&self.pool, migrator).await
    }

    /// A store over an existing pool, made with [`PgStore::pool_options`] (else it lends idle connections
    /// unchecked, or pings every one).
    pub fn from_pool(pool: sqlx::PgPool) -> Self {
        // A quarter of the connections, at least two, stay in the pool for reads and transactions.
        let max = pool.options().get_max_connections() as usize;
        let held = max.saturating_sub((max / 4).max(2));
        let leases = Self::pool_options(LEASE_CONNECTIONS).connect_lazy_with((*pool.connect_options()).clone());
        let held = (held > 0).then(|| {
            let mut held = Held::new(pool.clone(), held);
            held.ping_after(ping::PING_IDLE, ends_session);
            Arc::new(held)
        });
        Self { held, pool, leases, group: None }.group_commit(DEFAULT_COMMIT_SLOTS).replan_after(REPLAN_FIRST)
    }

    /// Plans the held connections' statements again `first` after each is taken, then after each wait doubled
    /// (default [`REPLAN_FIRST`]). Only on a new store, before it is cloned (tests shorten the wait); a store
    /// shared already keeps its wait.
    #[must_use]
    pub fn replan_after(mut self, first: Duration) -> Self {
        if let Some(held) = self.held.as_mut().and_then(Arc::get_mut) {
            held.replan_after(first);
        }
        self
    }

    /// Sends at most `slots` one-statement commits at once: a commit that finds them all busy waits and goes
    /// with the others waiting (up to 32), in one transaction, when a slot frees (see `group.rs`); `0` sends every
    /// commit at once on its own, without group commit. A commit that has held a slot [`SLOT_HOLD`] since it was
    /// sent gives it back and goes on without one, as does a batch's member that waits for a row lock: so more
    /// than `slots` commits may be under way, but no more than `slots` hold up the queue. On by default
    /// ([`DEFAULT_COMMIT_SLOTS`]); needs the engine's migrations (the batch's function).
    #[must_use]
    pub fn group_commit(self, slots: usize) -> Self {
        self.group_commit_holding(slots, SLOT_HOLD)
    }

    /// [`PgStore::group_commit`] where a commit sent alone holds its slot at most `hold` (default
    /// [`SLOT_HOLD`]); past it the commit goes on without a slot, and the slot takes what waits.
    #[must_use]
    pub fn group_commit_holding(mut self, slots: usize, hold: Duration) -> Self {
        self.group = (slots > 0).then(|| Arc::new(group::GroupCommit::new(slots, MAX_BATCH, hold)));
        self
    }
}

/// The `DELETE` of a reopen's [`Cleanup`].
fn cleanup_sql(cleanup: Cleanup) -> &'static str {
    match cleanup {
        Cleanup::FailedSteps => "DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed'",
        Cleanup::FailedCompensations => {
            "DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed' AND step_key LIKE 'compensate/%'"
        }
    }
}

impl Store for PgStore {
    type Db = Postgres;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn pool(&self) -> &sqlx::Pool<Self::Db> {
        &self.pool
    }

    async fn migrate(&self) -> Result<()> {
        self.run_migrations(&MIGRATOR).await
    }

    async fn begin(&self) -> Result<Tx<Self>> {
        Ok(self.pool.begin().await?)
    }

    /// A held connection (one whose last call was cut short is closed, not handed on: see `held.rs`), or one
    /// from the pool when every held one is in use (or none is held).
    async fn writer(&self) -> Result<Writer<'_, Postgres>> {
        match &self.held {
            Some(held) => held.get_or_pooled().await,
            None => Ok(Writer::pooled(self.pool.acquire().await?)),
        }
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
        let q = sqlx::query(sqlx::AssertSqlSafe(rows::write_steps_sql(steps.len(), 1, None)));
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
        Ok(q.try_map(|row: PgRow| row.try_get(0)).fetch_optional(&mut *conn).await?)
    }

    /// One statement (see `commit::persist`).
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Committed> {
        commit::persist(conn, checkpoint).await
    }

    /// One statement in autocommit (see `commit::commit_in_one_call`).
    async fn commit_in_one_call(
        &self,
        checkpoint: &Checkpoint<'_>,
        phase: Option<PhaseCommit<'_>>,
        finished: bool,
    ) -> Result<Option<Committed>> {
        commit::commit_in_one_call(self, checkpoint, phase, finished).await
    }

    fn group_commit_counts(&self) -> (u64, u64) {
        self.group.as_ref().map_or((0, 0), |g| g.counts())
    }

    async fn notify_finished(&self, conn: &mut Conn<Self>, workflow_id: &str) -> Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(workflow_id).execute(&mut *conn).await?;
        Ok(())
    }

    async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
        let q = sqlx::query_as("SELECT * FROM workflows WHERE workflow_id = $1").bind(workflow_id);
        Ok(q.fetch_optional(&self.pool).await?)
    }

    async fn steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>> {
        let q = sqlx::query_as(
            "SELECT * FROM workflow_steps WHERE workflow_id = $1 ORDER BY seq NULLS FIRST, started_at, step_key",
        );
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
            "UPDATE workflows w SET lease_owner = $1, lease_expires_at = COALESCE($3, {DB_NOW}) + $4, \
             lease_epoch = w.lease_epoch + 1 \
             FROM (SELECT workflow_id FROM workflows \
                   WHERE state IN ('running', 'compensating') AND next_attempt_at <= $2 \
                     AND (lease_expires_at IS NULL OR lease_expires_at <= COALESCE($3, {DB_NOW})) \
                   ORDER BY next_attempt_at LIMIT $5 FOR UPDATE SKIP LOCKED) due \
             WHERE w.workflow_id = due.workflow_id RETURNING w.*"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(owner)
            .bind(lease.now)
            .bind(lease.given_now())
            .bind(lease.length_ms)
            .bind(limit)
            .fetch_all(&self.leases)
            .await?)
    }

    /// The ids travel as one `text[]`.
    async fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease: Lease) -> Result<u64> {
        if workflow_ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "UPDATE workflows SET lease_expires_at = COALESCE($2, {DB_NOW}) + $3 WHERE workflow_id = ANY($4) \
             AND lease_owner = $1 AND state IN ('running', 'compensating') \
             AND lease_expires_at > COALESCE($2, {DB_NOW})"
        );
        let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(owner).bind(lease.given_now()).bind(lease.length_ms);
        let done = q.bind(workflow_ids).execute(&self.leases).await?;
        Ok(done.rows_affected())
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
        let current = sqlx::query_as("SELECT state, compensations FROM workflows WHERE workflow_id = $1 FOR UPDATE")
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
        audit::insert(&self.pool, entry).await
    }

    async fn finish_audit(&self, id: &str, status: i32, result: &str) -> Result<()> {
        audit::finish(&self.pool, id, status, result).await
    }

    async fn audit(&self, filter: super::AuditFilter<'_>) -> Result<Vec<super::AuditRecord>> {
        audit::read(&self.pool, filter).await
    }

    async fn listen(&self) -> Result<Option<Listener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Some(Listener(ListenerInner::Postgres(listener))))
    }

    async fn claim(&self, workflow_id: &str, owner: &str, lease: Lease) -> Result<Option<WorkflowRecord>> {
        let sql = format!(
            "UPDATE workflows SET lease_owner = $2, lease_expires_at = COALESCE($3, {DB_NOW}) + $4, \
             lease_epoch = lease_epoch + 1, next_attempt_at = LEAST(next_attempt_at, $5) \
             WHERE workflow_id = $1 AND state IN ('running', 'compensating') AND (lease_owner = $2 \
             OR lease_expires_at IS NULL OR lease_expires_at <= COALESCE($3, {DB_NOW})) RETURNING *"
        );
        let q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(workflow_id).bind(owner).bind(lease.given_now());
        Ok(q.bind(lease.length_ms).bind(lease.now).fetch_optional(&self.leases).await?)
    }
}
