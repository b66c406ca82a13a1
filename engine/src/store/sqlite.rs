//! The SQLite store: the embedded default for one process (WAL, a busy timeout, `BEGIN IMMEDIATE` writes).
//! A commit with no open transaction, and a statement phase with it, is one multi-statement call, and those of
//! concurrent workflows share a transaction (group commit).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite};

use super::group_commit::GroupCommit;
use super::held::Held;
use super::{
    Checkpoint, CompensationRecord, Conn, Listener, Persisted, Reopen, StepRecord, Store, Tx, WorkflowRecord,
    WorkflowUpdate, Writer, shared, shared::shared_store_methods,
};
use crate::error::Result;
use crate::phase::{PhaseCommit, SqlArg, StatementOutcome};

/// The embedded SQLite migrations (engine and payment tables).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// A [`Store`] on SQLite.
///
/// SQLite lets one transaction write at a time. Writes queue in process rather than in SQLite's busy handler
/// (which sleeps in steps of up to 100 ms): one-call commits, grouped by `group` (those queued meanwhile share
/// a transaction, see `GroupCommit`), and single writes on `held`, the writer connection the store keeps (see
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
            .max_connections(2)
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
        let held = Arc::new(Held::new(writer.clone(), 1));
        Ok(Self { group: GroupCommit::start(held.clone()), held, pool, writer })
    }

    /// A store over an existing pool (opened with WAL and a busy timeout), which then also writes. Call it
    /// inside a Tokio runtime (it starts the store's group committer).
    pub fn from_pool(pool: sqlx::SqlitePool) -> Self {
        let held = Arc::new(Held::new(pool.clone(), 1));
        Self { group: GroupCommit::start(held.clone()), held, writer: pool.clone(), pool }
    }

    const SELECT_STATE_FOR_UPDATE: &str = "SELECT state, compensations FROM workflows WHERE workflow_id = $1";
}

/// Where a statement phase's SQL on SQLite records what its statements did (a temporary table of the writer's
/// connection, empty when the phase starts): `INSERT INTO temp.onceflow_phase SELECT 'name' WHERE changes() = 1`
/// after a statement, `EXISTS (SELECT 1 FROM temp.onceflow_phase WHERE flag = 'name')` in a later one.
pub const PHASE_FLAGS: &str = "temp.onceflow_phase";

impl Store for SqliteStore {
    type Db = Sqlite;

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    shared_store_methods!();

    async fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease_until: i64, now: i64) -> Result<u64> {
        if workflow_ids.is_empty() {
            return Ok(0);
        }
        let ids = serde_json::to_string(workflow_ids)?;
        let mut w = self.writer().await?;
        let q = sqlx::query(shared::HEARTBEAT_SQLITE).bind(owner).bind(lease_until).bind(now).bind(ids);
        let done = q.execute(&mut *w).await;
        Ok(w.check(done)?.rows_affected())
    }

    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    fn write_pool(&self) -> &sqlx::Pool<Self::Db> {
        &self.writer
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

    async fn writer(&self) -> Result<Writer<'_, Sqlite>> {
        self.held.get().await
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
        let (parts, _) = shared::checkpoint_statements(checkpoint, 1, false);
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

    /// One multi-statement call to the writer's thread inside a group commit (see
    /// `GroupCommit`): the phase's statements, the bookkeeping, the phase's step rows and the outputs, where a
    /// transaction of closure steps costs a hand-off per statement and the writer waits through each. A check
    /// that fails (fence, insert, guard) inserts its code into `onceflow_checks`, whose triggers raise it
    /// (migration 0004), and the commit is undone alone.
    async fn commit_statement(
        &self,
        checkpoint: &Checkpoint<'_>,
        phase: Option<PhaseCommit<'_>>,
        _finished: bool,
    ) -> Result<Option<StatementOutcome>> {
        let args = phase.map_or(0, |p| p.phase.args.len());
        let (parts, mut next) = shared::checkpoint_statements(checkpoint, args + 1, false);
        let check =
            |ok: &str, code: &str| format!("INSERT INTO onceflow_checks SELECT '{code}' WHERE NOT COALESCE({ok}, 0)");
        let mut sql = Vec::new();
        if let Some(p) = phase {
            sql.push(format!("CREATE TEMP TABLE IF NOT EXISTS {PHASE_FLAGS} (flag TEXT PRIMARY KEY)"));
            sql.push(format!("DELETE FROM {PHASE_FLAGS}"));
            sql.extend(p.phase.ctes.iter().cloned());
        }
        let last = parts.len().saturating_sub(1);
        for (i, part) in parts.into_iter().enumerate() {
            sql.push(part);
            // Each check right after its statement, which `changes()` counts.
            if i == 0 && checkpoint.insert.is_some() {
                sql.push(check("changes() = 1", shared::CHECK_INSERT));
            }
            if i == last && checkpoint.fence.is_some() {
                sql.push(check("changes() = 1", shared::CHECK_FENCE));
            }
        }
        let (workflow, now) = (next, next + 1);
        next += 2;
        let rows = phase.map_or(&[][..], |p| p.rows);
        if !rows.is_empty() {
            sql.push(format!(
                "INSERT INTO {} SELECT ${workflow}, column1, column2, column3, column4, column5, column6, NULL, \
                 ${now}, CASE WHEN column7 THEN ${now} END FROM (VALUES {}) WHERE column8{}",
                shared::STEP_COLUMNS,
                shared::phase_step_values(rows, &mut next, false),
                shared::STEPS_ON_CONFLICT
            ));
        }
        if let Some((guard, _)) = phase.and_then(|p| p.phase.guard.as_ref()) {
            sql.push(check(&format!("({guard})"), shared::CHECK_GUARD));
        }
        if !rows.is_empty() {
            // An intent's output is empty text: written, with no output.
            sql.push(format!("SELECT {}", shared::phase_outputs(rows).join(", ")));
        }
        let q = shared::bind_statement!(sqlx::query(sqlx::AssertSqlSafe(sql.join(";\n"))), checkpoint, phase);
        match self.group.commit(q).await {
            Ok(found) => {
                let outputs = match found.last() {
                    Some(row) if !rows.is_empty() => shared::read_outputs(row, 0, rows.len())?,
                    _ => Vec::new(),
                };
                Ok(Some(StatementOutcome::Done(outputs)))
            }
            Err(sqlx::Error::Database(e)) => match shared::checked(e.message()) {
                Some(outcome) => Ok(Some(outcome)),
                None => Err(sqlx::Error::Database(e).into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }
}
