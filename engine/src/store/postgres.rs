//! The Postgres store: for production and for many processes against one database.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use super::{
    Checkpoint, CompensationRecord, Conn, Listener, ListenerInner, Persisted, Reopen, StepRecord, Store, Tx,
    WorkflowRecord, WorkflowUpdate, shared, shared::shared_store_methods,
};
use crate::error::Result;

/// The embedded Postgres migrations (engine and payment tables).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

const NOTIFY_CHANNEL: &str = "onceflow_workflow_done";

/// A [`Store`] on Postgres.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: sqlx::PgPool,
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
        Ok(Self { pool })
    }

    /// A store over an existing pool.
    pub fn from_pool(pool: sqlx::PgPool) -> Self {
        Self { pool }
    }

    const SELECT_STATE_FOR_UPDATE: &str = "SELECT state FROM workflows WHERE workflow_id = $1 FOR UPDATE";
}

impl Store for PgStore {
    type Db = Postgres;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    shared_store_methods!();

    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn begin(&self) -> Result<Tx<Self>> {
        Ok(self.pool.begin().await?)
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

    /// One statement: the workflow insert (first commit) and the step and compensation upserts ride as
    /// data-modifying CTEs of the fence, or of a final check that the insert happened.
    async fn persist(&self, conn: &mut Conn<Self>, checkpoint: &Checkpoint<'_>) -> Result<Persisted> {
        let mut parts = shared::checkpoint_statements(checkpoint);
        if checkpoint.insert.is_some() && checkpoint.fence.is_none() {
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

    async fn listen(&self) -> Result<Option<Listener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Some(Listener(ListenerInner::Postgres(listener))))
    }
}
