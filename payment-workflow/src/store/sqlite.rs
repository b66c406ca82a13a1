//! The payment tables on SQLite: its migrations, and what sets it apart from the other backend that runs the
//! standard payment SQL (`standard.rs`): the dialect of its statement phases.

use onceflow_engine::{SqliteStore, Store};

use super::PassLock;
use super::standard::StandardSql;
use super::statement::PhaseDialect;

/// The payment tables' embedded SQLite migrations (the engine migrates its own tables, with versions of
/// their own in the same history).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/sqlite") };

impl StandardSql for SqliteStore {
    const DIALECT: PhaseDialect = PhaseDialect::Sqlite;

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn migrate_own(&self) -> Result<(), onceflow_engine::Error> {
        MIGRATOR.run(self.write_pool()).await?;
        Ok(())
    }

    /// No lock: one process opens an SQLite database, and its writes are serialised anyway.
    async fn lock_pass(&self) -> Result<Option<PassLock>, sqlx::Error> {
        Ok(Some(PassLock::alone()))
    }
}
