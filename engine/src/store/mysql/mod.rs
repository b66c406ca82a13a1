//! The MySQL / MariaDB store: for teams whose payments already live there (MySQL 8, MariaDB 10.6+).
//!
//! Same guarantees as Postgres: conditional updates checked by rows matched (sqlx connects with
//! `CLIENT_FOUND_ROWS`), leases claimed with `FOR UPDATE SKIP LOCKED`, every commit fenced by the lease epoch,
//! duplicate keys read as "exists". Sessions run at `READ COMMITTED`, as Postgres does, so that a conditional
//! update or a read in a step sees the latest committed row and concurrent inserts take no gap locks.
//! A deadlock or lock-wait timeout rolls the phase back and replays it (see [`crate::error::is_transient`]).
//! MySQL has no `UPDATE … RETURNING` and no `LISTEN`: updates are followed by a read inside the same
//! transaction, and waiters in other processes poll.
//!
//! All of its SQL is here, written with MySQL's positional `?` parameters: a query binds its values in the
//! order they appear, which the binders below follow.

use std::str::FromStr;

use sqlx::mysql::{MySqlArguments, MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Executor, MySql};

use super::common::{self, Cleanup};
use super::{
    Checkpoint, Committed, CompensationRecord, Conn, Deleted, Lease, Listener, Reopen, StepRecord, Store, Tx,
    WorkflowFilter, WorkflowRecord, WorkflowState, WorkflowUpdate, WorkflowWrite, compensations, ping,
};
use crate::error::Result;

mod audit;
mod gc;
mod list;
mod migrate;

/// A query on MySQL, as the binders take and return it.
type MySqlQuery<'q> = sqlx::query::Query<'q, MySql, MySqlArguments>;

/// The engine's embedded MySQL migrations (its tables only: each crate migrates its own, so this one
/// leaves migrations it does not know, another crate's, alone).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/mysql") };

/// Session settings of every connection: Postgres's isolation level, and a bounded wait for a row lock (a
/// payment's order row is held for one short transaction at most).
const SESSION: [&str; 2] =
    ["SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", "SET SESSION innodb_lock_wait_timeout = 10"];

/// The database's clock in milliseconds since the epoch, which judges leases (see [`Lease`]); sessions run in UTC
/// (sqlx sets `time_zone`), so no daylight-saving hour is read twice.
macro_rules! db_now {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    };
}

/// Inserts a workflow with its compensation list, in the order of [`bind_workflow`]; a duplicate key fails it.
/// Its lease is moved onto the database's clock when the first parameter of `lease_expires_at` says so (see
/// [`super::Checkpoint::leases_by_database`]).
const INSERT_WORKFLOW: &str = concat!(
    "INSERT INTO workflows (workflow_id, name, input, input_hash, state, output, error, \
    lease_owner, lease_expires_at, lease_epoch, next_attempt_at, notify, created_at, updated_at, compensations, \
    tenant, trace) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CASE WHEN ? THEN ? + ",
    db_now!(),
    " ELSE ? END, ?, ?, ?, ?, ?, ?, ?, ?)"
);
/// Inserts step rows (followed by a `(?, …)` list per row, in the order of [`bind_steps`]).
const INSERT_STEPS: &str = "INSERT INTO workflow_steps \
    (workflow_id, step_key, step_name, kind, status, attempts, output, error, started_at, finished_at, seq) VALUES ";
/// Parameters per row of [`INSERT_STEPS`].
const STEP_PARAMS: usize = 11;
/// A step insert's conflict clause: the new row replaces the stored one, but for its `seq` (set by the first).
const STEPS_ON_DUPLICATE: &str = " ON DUPLICATE KEY UPDATE step_name = VALUES(step_name), kind = VALUES(kind), \
    status = VALUES(status), attempts = VALUES(attempts), output = VALUES(output), error = VALUES(error), \
    started_at = VALUES(started_at), finished_at = VALUES(finished_at)";
/// The fence: applies a [`WorkflowUpdate`] (and a new compensation list, if given) only while `lease_epoch` is
/// still the committer's.
const FENCE: &str = "UPDATE workflows SET state = COALESCE(?, state), output = COALESCE(?, output), \
    error = COALESCE(?, error), lease_owner = CASE WHEN ? IS NULL THEN lease_owner ELSE NULL END, \
    lease_expires_at = CASE WHEN ? IS NULL THEN lease_expires_at ELSE NULL END, \
    next_attempt_at = COALESCE(?, next_attempt_at), updated_at = ?, compensations = COALESCE(?, compensations) \
    WHERE workflow_id = ? AND lease_epoch = ?";
const SELECT_WORKFLOW: &str = "SELECT * FROM workflows WHERE workflow_id = ?";
const SELECT_STEPS: &str = "SELECT * FROM workflow_steps WHERE workflow_id = ? ORDER BY seq, started_at, step_key";
const SELECT_COMPENSATIONS: &str = "SELECT compensations FROM workflows WHERE workflow_id = ?";
/// The heartbeat, followed by the list of ids it extends (`(?, ?, …)`, at most [`HEARTBEAT_CHUNK`]).
const HEARTBEAT: &str = concat!(
    "UPDATE workflows SET lease_expires_at = COALESCE(?, ",
    db_now!(),
    ") + ? WHERE lease_owner = ? AND state IN ('running', 'compensating') AND lease_expires_at > COALESCE(?, ",
    db_now!(),
    ") AND workflow_id IN "
);
/// Most ids one heartbeat statement lists.
const HEARTBEAT_CHUNK: usize = 500;
const RELEASE: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = ?, \
    updated_at = ? WHERE workflow_id = ? AND lease_epoch = ?";
const RELEASE_ALL: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = ?, \
    updated_at = ? WHERE lease_owner = ? AND state IN ('running', 'compensating')";
/// Due by the engine's clock; the lease by the database's (a null) or the engine's.
const DUE: &str = concat!(
    "SELECT workflow_id FROM workflows WHERE state IN ('running', 'compensating') \
    AND next_attempt_at <= ? AND (lease_expires_at IS NULL OR lease_expires_at <= COALESCE(?, ",
    db_now!(),
    ")) ORDER BY next_attempt_at LIMIT ? FOR UPDATE SKIP LOCKED"
);
/// Leases the workflows [`DUE`] chose (followed by their ids' list).
const LEASE_DUE: &str = concat!(
    "UPDATE workflows SET lease_owner = ?, lease_expires_at = COALESCE(?, ",
    db_now!(),
    ") + ?, lease_epoch = lease_epoch + 1 WHERE workflow_id IN "
);
/// [`Store::claim`]: one workflow, due or not, if its lease is free or ended.
const CLAIM: &str = concat!(
    "UPDATE workflows SET lease_owner = ?, lease_expires_at = COALESCE(?, ",
    db_now!(),
    ") + ?, lease_epoch = lease_epoch + 1, next_attempt_at = LEAST(next_attempt_at, ?) \
    WHERE workflow_id = ? AND state IN ('running', 'compensating') \
    AND (lease_owner = ? OR lease_expires_at IS NULL OR lease_expires_at <= COALESCE(?, ",
    db_now!(),
    "))"
);

/// A [`Store`] on MySQL or MariaDB.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: sqlx::MySqlPool,
    /// Two connections of their own for the lease heartbeat and the recovery scan (see `PgStore`).
    leases: sqlx::MySqlPool,
}

impl MySqlStore {
    /// Applies `migrator`'s migrations not yet applied, one process at a time (a lock of its own: sqlx's is not
    /// taken on MariaDB, see `migrate.rs`). For the migrations of the crates on top of the engine, which share
    /// its history table.
    pub async fn run_migrations(&self, migrator: &'static sqlx::migrate::Migrator) -> Result<()> {
        migrate::run(&self.pool, migrator).await
    }

    /// Connects a pool of up to `max_connections` to `url` (`mysql://…`, or `mariadb://…`).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let options = MySqlConnectOptions::from_str(&url)?;
        Ok(Self::from_pool(Self::pool_options(max_connections).connect_with(options).await?))
    }

    /// Pool options that set up each session as the store expects; for pools made elsewhere.
    pub fn pool_options(max_connections: u32) -> MySqlPoolOptions {
        MySqlPoolOptions::new()
            .max_connections(max_connections)
            // No ping on every acquire (a round trip per transaction), as on Postgres...
            .test_before_acquire(false)
            // ...but one idle a second or more is pinged: the server may have ended it meanwhile (a restart, its
            // `wait_timeout`), which sqlx's ping as it came back does not tell (`ping.rs`).
            .before_acquire(ping::ping_if_idle)
            // As on Postgres: with the database gone, answer `503` fast rather than hold requests.
            .acquire_timeout(ping::ACQUIRE_TIMEOUT)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    for sql in SESSION {
                        conn.execute(sql).await?;
                    }
                    Ok(())
                })
            })
    }

    /// A store over an existing pool, made with [`MySqlStore::pool_options`].
    pub fn from_pool(pool: sqlx::MySqlPool) -> Self {
        let leases = Self::pool_options(2).connect_lazy_with((*pool.connect_options()).clone());
        Self { pool, leases }
    }

    async fn select_in(&self, conn: &mut Conn<Self>, ids: &[String]) -> Result<Vec<WorkflowRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!("SELECT * FROM workflows WHERE workflow_id IN ({})", placeholders(ids.len()));
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
        for id in ids {
            q = q.bind(id);
        }
        Ok(q.fetch_all(&mut *conn).await?)
    }
}

/// `n` positional parameters, `?, ?, …`.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Binds `wf` and its stored compensation list `comps` for [`INSERT_WORKFLOW`]; `by_database`: its lease is moved
/// onto the database's clock.
fn bind_workflow<'q>(q: MySqlQuery<'q>, wf: &WorkflowRecord, comps: String, by_database: bool) -> MySqlQuery<'q> {
    q.bind(&wf.workflow_id)
        .bind(&wf.name)
        .bind(&wf.input)
        .bind(&wf.input_hash)
        .bind(wf.state)
        .bind(&wf.output)
        .bind(&wf.error)
        .bind(&wf.lease_owner)
        .bind(by_database)
        .bind(wf.lease_expires_at.map(|until| until - wf.created_at))
        .bind(wf.lease_expires_at)
        .bind(wf.lease_epoch)
        .bind(wf.next_attempt_at)
        .bind(wf.notify)
        .bind(wf.created_at)
        .bind(wf.updated_at)
        .bind(comps)
        .bind(&wf.tenant)
        .bind(&wf.trace)
}

/// Binds `steps` for [`INSERT_STEPS`].
fn bind_steps<'q>(mut q: MySqlQuery<'q>, steps: &[StepRecord]) -> MySqlQuery<'q> {
    for s in steps {
        q = q
            .bind(&s.workflow_id)
            .bind(&s.step_key)
            .bind(&s.step_name)
            .bind(s.kind)
            .bind(s.status)
            .bind(s.attempts)
            .bind(&s.output)
            .bind(&s.error)
            .bind(s.started_at)
            .bind(s.finished_at)
            .bind(s.seq);
    }
    q
}

/// The `DELETE` of a reopen's [`Cleanup`].
fn cleanup_sql(cleanup: Cleanup) -> &'static str {
    match cleanup {
        Cleanup::FailedSteps => "DELETE FROM workflow_steps WHERE workflow_id = ? AND status = 'failed'",
        Cleanup::FailedCompensations => {
            "DELETE FROM workflow_steps WHERE workflow_id = ? AND status = 'failed' AND step_key LIKE 'compensate/%'"
        }
    }
}

/// Inserts `wf` (see [`INSERT_WORKFLOW`]); `false` when its id exists.
async fn insert(
    conn: &mut Conn<MySqlStore>,
    wf: &WorkflowRecord,
    compensations: &[CompensationRecord],
    by_database: bool,
) -> Result<bool> {
    let q = bind_workflow(sqlx::query(INSERT_WORKFLOW), wf, compensations::encode(compensations)?, by_database);
    match q.execute(&mut *conn).await {
        Ok(_) => Ok(true),
        Err(e) if duplicate(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// True when an insert hit an existing key: MySQL rolls back only that statement, the transaction goes on.
fn duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

impl Store for MySqlStore {
    type Db = MySql;

    fn backend(&self) -> &'static str {
        "mysql"
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

    async fn insert_workflow(
        &self,
        conn: &mut Conn<Self>,
        wf: &WorkflowRecord,
        compensations: &[CompensationRecord],
    ) -> Result<bool> {
        insert(conn, wf, compensations, false).await
    }

    /// The default bookkeeping, with the inserted row's lease moved onto the database's clock when the
    /// checkpoint says so.
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Committed> {
        let comps = checkpoint.compensations;
        if let WorkflowWrite::Insert(row) = checkpoint.workflow
            && !insert(conn, row, comps.unwrap_or_default(), checkpoint.leases_by_database).await?
        {
            return Ok(Committed::Duplicate);
        }
        self.write_steps(conn, checkpoint.steps).await?;
        Ok(match checkpoint.workflow {
            WorkflowWrite::Insert(_) => Committed::done(),
            WorkflowWrite::Fence(f) => match self.fence(conn, f.workflow_id, f.epoch, f.update, f.now, comps).await? {
                Some(notify) => Committed::Done { notify, outputs: Vec::new() },
                None => Committed::LeaseLost,
            },
        })
    }

    async fn write_steps(&self, conn: &mut Conn<Self>, steps: &[StepRecord]) -> Result<()> {
        if steps.is_empty() {
            return Ok(());
        }
        let mut sql = INSERT_STEPS.to_owned();
        common::push_value_rows(&mut sql, steps.len(), STEP_PARAMS, None);
        sql.push_str(STEPS_ON_DUPLICATE);
        bind_steps(sqlx::query(sqlx::AssertSqlSafe(sql)), steps).execute(&mut *conn).await?;
        Ok(())
    }

    /// Rows matched, not rows changed, decide: the lease is ours exactly when the row with our epoch exists.
    /// Whether a waiter asked for a notification is not read: MySQL has no channel to send it on.
    async fn fence(
        &self,
        conn: &mut Conn<Self>,
        workflow_id: &str,
        epoch: i64,
        update: &WorkflowUpdate,
        now: i64,
        compensations: Option<&[CompensationRecord]>,
    ) -> Result<Option<bool>> {
        let release = update.release_until;
        let comps = compensations.map(compensations::encode).transpose()?;
        let done = sqlx::query(FENCE)
            .bind(update.state)
            .bind(&update.output)
            .bind(&update.error)
            .bind(release)
            .bind(release)
            .bind(release)
            .bind(now)
            .bind(comps)
            .bind(workflow_id)
            .bind(epoch)
            .execute(&mut *conn)
            .await?;
        Ok((done.rows_affected() == 1).then_some(false))
    }

    async fn notify_finished(&self, _conn: &mut Conn<Self>, _workflow_id: &str) -> Result<()> {
        // No notification channel: waiters in other processes poll.
        Ok(())
    }

    async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
        Ok(sqlx::query_as(SELECT_WORKFLOW).bind(workflow_id).fetch_optional(&self.pool).await?)
    }

    async fn steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>> {
        Ok(sqlx::query_as(SELECT_STEPS).bind(workflow_id).fetch_all(&self.pool).await?)
    }

    async fn compensations(&self, workflow_id: &str) -> Result<Vec<CompensationRecord>> {
        let q = sqlx::query_scalar(SELECT_COMPENSATIONS).bind(workflow_id);
        let stored: Option<Option<String>> = q.fetch_optional(&self.pool).await?;
        compensations::decode(workflow_id, stored.flatten().as_deref())
    }

    async fn claim_due(&self, owner: &str, lease: Lease, limit: i64) -> Result<Vec<WorkflowRecord>> {
        let mut tx = self.leases.begin().await?;
        let due = sqlx::query_scalar(DUE).bind(lease.now).bind(lease.given_now()).bind(limit);
        let ids: Vec<String> = due.fetch_all(&mut *tx).await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let sql = format!("{LEASE_DUE}({})", placeholders(ids.len()));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(owner).bind(lease.given_now()).bind(lease.length_ms);
        for id in &ids {
            q = q.bind(id);
        }
        q.execute(&mut *tx).await?;
        let claimed = self.select_in(&mut tx, &ids).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease: Lease) -> Result<u64> {
        let mut extended = 0;
        for ids in workflow_ids.chunks(HEARTBEAT_CHUNK) {
            let sql = format!("{HEARTBEAT}({})", placeholders(ids.len()));
            let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease.given_now()).bind(lease.length_ms);
            let mut q = q.bind(owner).bind(lease.given_now());
            for id in ids {
                q = q.bind(id);
            }
            extended += q.execute(&self.leases).await?.rows_affected();
        }
        Ok(extended)
    }

    async fn release(&self, workflow_id: &str, epoch: i64, next_attempt_at: i64, now: i64) -> Result<bool> {
        let done = sqlx::query(RELEASE)
            .bind(next_attempt_at)
            .bind(now)
            .bind(workflow_id)
            .bind(epoch)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_all(&self, owner: &str, now: i64) -> Result<u64> {
        let done = sqlx::query(RELEASE_ALL).bind(now).bind(now).bind(owner).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    async fn request_notify(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
        sqlx::query("UPDATE workflows SET notify = TRUE WHERE workflow_id = ?")
            .bind(workflow_id)
            .execute(&self.pool)
            .await?;
        self.workflow(workflow_id).await
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
        let current = sqlx::query_as("SELECT state, compensations FROM workflows WHERE workflow_id = ? FOR UPDATE")
            .bind(workflow_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(plan) = common::reopen_plan(workflow_id, current, from_states, how)? else {
            return Ok(None);
        };
        if let Some(cleanup) = plan.cleanup {
            sqlx::query(cleanup_sql(cleanup)).bind(workflow_id).execute(&mut *tx).await?;
        }
        sqlx::query(
            "UPDATE workflows SET state = ?, error = CASE WHEN ? THEN NULL ELSE COALESCE(?, error) END, \
             lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1, \
             next_attempt_at = ?, updated_at = ?, compensations = COALESCE(?, compensations) WHERE workflow_id = ?",
        )
        .bind(plan.state)
        .bind(plan.clear_error)
        .bind(error)
        .bind(now)
        .bind(now)
        .bind(plan.compensations)
        .bind(workflow_id)
        .execute(&mut *tx)
        .await?;
        let row = self.select_in(&mut tx, &[workflow_id.to_owned()]).await?.pop();
        tx.commit().await?;
        Ok(row)
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
        Ok(None)
    }

    async fn claim(&self, workflow_id: &str, owner: &str, lease: Lease) -> Result<Option<WorkflowRecord>> {
        let mut tx = self.leases.begin().await?;
        let q = sqlx::query(CLAIM).bind(owner).bind(lease.given_now()).bind(lease.length_ms).bind(lease.now);
        let done = q.bind(workflow_id).bind(owner).bind(lease.given_now()).execute(&mut *tx).await?;
        let claimed = if done.rows_affected() == 1 {
            sqlx::query_as(SELECT_WORKFLOW).bind(workflow_id).fetch_optional(&mut *tx).await?
        } else {
            None
        };
        tx.commit().await?;
        Ok(claimed)
    }
}
