//! SQLite's dialect of the channel word's queries (Postgres's, but for the lock: one process opens it).

use onceflow_engine::SqliteStore;

use crate::store::PassLock;

/// SQLite plans the lookups by the primary key without statistics.
pub(super) const ANALYZE_LINES: Option<&str> = None;

pub(super) use super::postgres::{
    DELETE_EXCEPTIONS, DELETE_LINES, IGNORE_SUFFIX, INSERT_IGNORE, UPSERT_COPY, UPSERT_RECONCILIATION,
};

/// No lock: one process opens an SQLite database.
#[allow(clippy::unused_async)]
pub(super) async fn lock(_store: &SqliteStore) -> Result<Option<PassLock>, sqlx::Error> {
    Ok(Some(PassLock::alone()))
}
