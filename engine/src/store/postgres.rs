//! The Postgres store: for production and for many processes against one database.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use super::held::Held;
use super::{
    Checkpoint, CompensationRecord, Conn, Listener, ListenerInner, Persisted, Reopen, StepRecord, Store, Tx,
    WorkflowRecord, WorkflowUpdate, Writer, shared, shared::shared_store_methods,
};
use crate::error::Result;
use crate::phase::{PhaseCommit, SqlArg, StatementOutcome};

/// The embedded Postgres migrations (engine and payment tables).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

const NOTIFY_CHANNEL: &str = "onceflow_workflow_done";

/// A [`Store`] on Postgres.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: sqlx::PgPool,
    /// Most of the pool's connections, kept for one-statement commits and writes (see [`Held`]); none when
    /// the pool is too small to spare them.
    held: Option<Arc<Held<Postgres>>>,
}

impl PgStore {
    /// Connects a pool of up to `max_connections` to `url` (`postgres://…`).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            // No ping on every acquire: it was a round trip per transaction. A connection a server restart
            // broke fails its query instead, which the engine retries and the API answers with `503`.
            .test_before_acquire(false)
            // With the database gone, sqlx keeps reconnecting until this timeout: a short one answers
            // `503` fast instead of holding requests (and doubles as load shedding when the pool is exhausted).
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(options)
            .await?;
        Ok(Self::from_pool(pool))
    }

    /// A store over an existing pool.
    pub fn from_pool(pool: sqlx::PgPool) -> Self {
        // A quarter of the connections, at least two, stay in the pool for reads and transactions.
        let max = pool.options().get_max_connections() as usize;
        let held = max.saturating_sub((max / 4).max(2));
        Self { held: (held > 0).then(|| Arc::new(Held::new(pool.clone(), held))), pool }
    }

    const SELECT_STATE_FOR_UPDATE: &str =
        "SELECT state, compensations FROM workflows WHERE workflow_id = $1 FOR UPDATE";
}

impl Store for PgStore {
    type Db = Postgres;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    shared_store_methods!();

    async fn heartbeat(&self, owner: &str, workflow_ids: &[String], lease_until: i64, now: i64) -> Result<u64> {
        if workflow_ids.is_empty() {
            return Ok(0);
        }
        let mut w = self.writer().await?;
        let q = sqlx::query(shared::HEARTBEAT_POSTGRES).bind(owner).bind(lease_until).bind(now).bind(workflow_ids);
        let done = q.execute(&mut *w).await;
        Ok(w.check(done)?.rows_affected())
    }

    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn begin(&self) -> Result<Tx<Self>> {
        Ok(self.pool.begin().await?)
    }

    /// A held connection (a statement left unfinished is drained before the next: sqlx waits for the
    /// server's `ReadyForQuery`), or one from the pool when every held one is in use (or none is held).
    async fn writer(&self) -> Result<Writer<'_, Postgres>> {
        match &self.held {
            Some(held) => held.get_or_pooled().await,
            None => Ok(Writer::pooled(self.pool.acquire().await?)),
        }
    }

    async fn notify_finished(&self, conn: &mut Conn<Self>, workflow_id: &str) -> Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(workflow_id).execute(&mut *conn).await?;
        Ok(())
    }

    async fn claim_due(&self, owner: &str, now: i64, lease_until: i64, limit: i64) -> Result<Vec<WorkflowRecord>> {
        Ok(sqlx::query_as(
            "UPDATE workflows w SET lease_owner = $1, lease_expires_at = $3, lease_epoch = w.lease_epoch + 1 \
             FROM (SELECT workflow_id FROM workflows \
                   WHERE state IN ('running', 'compensating') AND next_attempt_at <= $2 \
                     AND (lease_expires_at IS NULL OR lease_expires_at <= $2) \
                   ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) due \
             WHERE w.workflow_id = due.workflow_id RETURNING w.*",
        )
        .bind(owner)
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// One statement: the workflow insert (first commit) and the step rows (upserts, or plain inserts on the
    /// first commit) ride as data-modifying CTEs of the fence, or of a final check that the insert
    /// happened.
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Persisted> {
        let (mut parts, _) = shared::checkpoint_statements(checkpoint, 1, true);
        if checkpoint.is_first() {
            // `w0` is the insert: whether it wrote the row.
            parts.push("SELECT EXISTS (SELECT 1 FROM w0)".to_owned());
        }
        let Some(last) = parts.pop() else { return Ok(Persisted::Done { notify: false }) };
        let mut sql = String::new();
        for (i, part) in parts.iter().enumerate() {
            sql.push_str(if i == 0 { "WITH " } else { ", " });
            sql.push_str(&format!("w{i} AS ({part})"));
        }
        sql.push(' ');
        sql.push_str(&last);
        // The statement returns one boolean or nothing: the fence's `notify`, or whether the insert happened.
        let q = shared::bind_checkpoint!(sqlx::query_scalar(sqlx::AssertSqlSafe(sql)), checkpoint);
        let found: Option<bool> = q.fetch_optional(&mut *conn).await?;
        Ok(match (checkpoint.insert, &checkpoint.fence, found) {
            (_, Some(_), None) => Persisted::LeaseLost,
            (_, Some(_), Some(notify)) => Persisted::Done { notify },
            (Some(_), None, Some(false)) => Persisted::Duplicate,
            _ => Persisted::Done { notify: false },
        })
    }

    /// One statement in autocommit: the phase's CTEs, the bookkeeping's CTEs, the phase's step rows, and a final
    /// `SELECT` whose `onceflow_check` calls raise (rolling everything back) when the guard, the fence or the
    /// insert did not hold.
    async fn commit_statement(
        &self,
        checkpoint: &Checkpoint<'_>,
        phase: Option<PhaseCommit<'_>>,
        finished: bool,
    ) -> Result<Option<StatementOutcome>> {
        let args = phase.map_or(0, |p| p.phase.args.len());
        let (parts, mut next) = shared::checkpoint_statements(checkpoint, args + 1, true);
        let mut ctes: Vec<String> = phase.map(|p| p.phase.ctes.clone()).unwrap_or_default();
        ctes.extend(parts.iter().enumerate().map(|(i, part)| format!("w{i} AS ({part})")));
        // The bookkeeping's own check: the fence (the last part) matched, or else the insert (the first) happened.
        let (held, code) = match (&checkpoint.fence, checkpoint.insert) {
            (Some(_), _) => (format!("EXISTS (SELECT 1 FROM w{})", parts.len() - 1), shared::CHECK_FENCE),
            (None, Some(_)) => ("EXISTS (SELECT 1 FROM w0)".to_owned(), shared::CHECK_INSERT),
            (None, None) => ("TRUE".to_owned(), shared::CHECK_FENCE),
        };
        let (workflow, now) = (next, next + 1);
        next += 2;
        let rows = phase.map_or(&[][..], |p| p.rows);
        // The phase's outputs are read back from the step rows written (a row not written reads NULL; an
        // intent's empty text means written, with no output), so the statement evaluates each output once.
        let mut outputs = Vec::new();
        if !rows.is_empty() {
            let first_key = next;
            let values = shared::phase_step_values(rows, &mut next, true);
            ctes.push(format!(
                "ws AS (INSERT INTO {} SELECT ${workflow}::text, v.k, v.n, v.kind, v.status, v.a, v.o, NULL, \
                 ${now}::bigint, CASE WHEN v.fin THEN ${now}::bigint END \
                 FROM (VALUES {}) v (k, n, kind, status, a, o, fin, keep) WHERE v.keep{} RETURNING step_key, output)",
                shared::STEP_COLUMNS,
                values,
                // A workflow's first commit finds no step rows (see `checkpoint_statements`).
                if checkpoint.is_first() { " AND EXISTS (SELECT 1 FROM w0)" } else { shared::STEPS_ON_CONFLICT }
            ));
            outputs = (0..rows.len())
                .map(|i| {
                    let key = first_key + shared::PHASE_ROW_PARAMS * i;
                    format!("max(CASE WHEN step_key = ${key} THEN COALESCE(output, '') END)")
                })
                .collect();
        }
        let notify = finished && checkpoint.fence.is_some();
        if notify {
            ctes.push(format!(
                "n AS (SELECT pg_notify(${next}::text, ${workflow}::text) FROM w{} WHERE notify)",
                parts.len() - 1
            ));
        }
        // The bookkeeping's check first: a phase of a workflow that exists already (or is no longer ours) is a
        // duplicate start (or a lost lease), whatever its guard says.
        let guard = phase.and_then(|p| p.phase.guard.as_ref()).map_or("TRUE", |(g, _)| g.as_str());
        let mut sql = format!(
            "WITH {} SELECT onceflow_check({held}, '{code}'), onceflow_check({guard}, '{}')",
            ctes.join(", "),
            shared::CHECK_GUARD
        );
        if notify {
            sql.push_str(", (SELECT count(*) FROM n)");
        }
        if !outputs.is_empty() {
            sql.push_str(&format!(", o.* FROM (SELECT {} FROM ws) o", outputs.join(", ")));
        }
        let mut q = shared::bind_statement!(sqlx::query(sqlx::AssertSqlSafe(sql)), checkpoint, phase);
        if notify {
            q = q.bind(NOTIFY_CHANNEL);
        }
        let mut conn = self.writer().await?;
        let row = q.fetch_one(&mut *conn).await;
        let row = match conn.check(row) {
            Ok(row) => row,
            Err(sqlx::Error::Database(e)) => {
                return match e.code().as_deref().and_then(shared::checked) {
                    Some(outcome) => Ok(Some(outcome)),
                    None => Err(sqlx::Error::Database(e).into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        let first = if notify { 3 } else { 2 };
        Ok(Some(StatementOutcome::Done(shared::read_outputs(&row, first, rows.len())?)))
    }

    async fn listen(&self) -> Result<Option<Listener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Some(Listener(ListenerInner::Postgres(listener))))
    }
}
