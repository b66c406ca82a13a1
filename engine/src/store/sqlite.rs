//! The SQLite store: the embedded default for one process (WAL, a busy timeout, `BEGIN IMMEDIATE` writes).

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite};

use super::{
    Checkpoint, CompensationRecord, Conn, Listener, Persisted, Reopen, StepRecord, Store, Tx, WorkflowRecord,
    WorkflowUpdate, shared, shared::shared_store_methods,
};
use crate::error::Result;

/// The embedded SQLite migrations (engine and payment tables).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// A [`Store`] on SQLite.
///
/// SQLite lets one transaction write at a time. Every write goes through `writer`, a pool of one connection,
/// so writers wait their turn in an async queue rather than in SQLite's busy handler (which sleeps in steps of
/// up to 100 ms); reads use `pool` and, in WAL mode, never wait for the writer.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: sqlx::SqlitePool,
    writer: sqlx::SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`). Commits are fully synchronous:
    /// a payment acknowledged is on disk.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        Ok(Self { pool, writer })
    }

    /// A store over an existing pool (opened with WAL and a busy timeout), which then also writes.
    pub fn from_pool(pool: sqlx::SqlitePool) -> Self {
        Self { writer: pool.clone(), pool }
    }

    const SELECT_STATE_FOR_UPDATE: &str = "SELECT state FROM workflows WHERE workflow_id = $1";
}

impl Store for SqliteStore {
    type Db = Sqlite;

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    shared_store_methods!();

    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    fn write_pool(&self) -> &sqlx::Pool<Self::Db> {
        &self.writer
    }

    async fn begin(&self) -> Result<Tx<Self>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn notify_finished(&self, _conn: &mut Conn<Self>, _workflow_id: &str) -> Result<()> {
        // One process owns an SQLite database: in-process notification covers every waiter.
        Ok(())
    }

    async fn claim_due(&self, owner: &str, now: i64, lease_until: i64, limit: i64) -> Result<Vec<WorkflowRecord>> {
        let mut tx = self.begin().await?;
        let claimed = sqlx::query_as(
            "UPDATE workflows SET lease_owner = $1, lease_expires_at = $3, lease_epoch = lease_epoch + 1 \
             WHERE workflow_id IN (SELECT workflow_id FROM workflows \
                   WHERE state IN ('running', 'compensating') AND next_attempt_at <= $2 \
                     AND (lease_expires_at IS NULL OR lease_expires_at <= $2) \
                   ORDER BY next_attempt_at LIMIT $4) RETURNING *",
        )
        .bind(owner)
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// One multi-statement query (one trip to the connection's worker thread instead of up to four); its rows
    /// tell whether the insert happened (`inserted`) and the fence's `notify`.
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Persisted> {
        let (parts, _) = shared::checkpoint_statements(checkpoint, 1);
        if parts.is_empty() {
            return Ok(Persisted::Done { notify: false });
        }
        let q = shared::bind_checkpoint!(sqlx::query(sqlx::AssertSqlSafe(parts.join("; "))), checkpoint);
        let rows = q.fetch_all(&mut *conn).await?;
        if checkpoint.insert.is_some() && !rows.iter().any(|r| r.try_get::<i64, _>("inserted").is_ok()) {
            return Ok(Persisted::Duplicate);
        }
        if checkpoint.fence.is_none() {
            return Ok(Persisted::Done { notify: false });
        }
        Ok(match rows.iter().find_map(|r| r.try_get::<bool, _>("notify").ok()) {
            Some(notify) => Persisted::Done { notify },
            None => Persisted::LeaseLost,
        })
    }

    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }
}
