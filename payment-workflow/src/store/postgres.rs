//! The payment tables on Postgres: its migrations, and what sets it apart from the other backend that runs the
//! standard payment SQL (`standard.rs`): the dialect of its statement phases.

use onceflow_engine::{PgStore, Store};

use super::standard::StandardSql;
use super::statement::PhaseDialect;

/// The payment tables' embedded Postgres migrations (the engine migrates its own tables, with versions of
/// their own in the same history).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/postgres") };

impl StandardSql for PgStore {
    const DIALECT: PhaseDialect = PhaseDialect::Postgres;

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn migrate_own(&self) -> Result<(), onceflow_engine::Error> {
        MIGRATOR.run(self.write_pool()).await?;
        Ok(())
    }
}
