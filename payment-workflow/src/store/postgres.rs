//! The payment tables on Postgres: its migrations, and what sets it apart from the other backend that runs the
//! standard payment SQL (`standard.rs`): the dialect of its statement phases.

use onceflow_engine::{PgStore, Store};

use super::PassLock;
use super::standard::StandardSql;
use super::statement::PhaseDialect;

/// The payment tables' embedded Postgres migrations (the engine migrates its own tables, with versions of
/// their own in the same history).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/postgres") };

/// The advisory lock of the retention pass (per database): `onceflow` in ASCII.
const PASS_LOCK: &str = "SELECT pg_try_advisory_lock(8029464472809402231)";
const PASS_UNLOCK: &str = "SELECT pg_advisory_unlock(8029464472809402231)";

impl StandardSql for PgStore {
    const DIALECT: PhaseDialect = PhaseDialect::Postgres;

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn migrate_own(&self) -> Result<(), onceflow_engine::Error> {
        self.run_migrations(&MIGRATOR).await
    }

    /// A session-level advisory lock on a connection of its own, held for the pass (a pass's batches run on
    /// other connections, each its own short transaction).
    async fn lock_pass(&self) -> Result<Option<PassLock>, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        // Closed, not pooled, however the pass ends: even if this future is dropped between the lock and the
        // [`PassLock`] that would release it.
        conn.close_on_drop();
        let locked: bool = sqlx::query_scalar(PASS_LOCK).fetch_one(&mut *conn).await?;
        Ok(locked.then(|| PassLock::postgres(conn, PASS_UNLOCK)))
    }
}
