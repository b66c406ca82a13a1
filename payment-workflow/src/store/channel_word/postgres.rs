//! Postgres's dialect of the channel word's queries, and the reconciliation's lock.

use onceflow_engine::{PgStore, Store};

use crate::store::PassLock;

pub(super) const INSERT_IGNORE: &str = "INSERT INTO";
pub(super) const IGNORE_SUFFIX: &str = " ON CONFLICT DO NOTHING";
pub(super) const UPSERT_COPY: &str = " ON CONFLICT (tenant, day) DO UPDATE SET copy_id = excluded.copy_id, \
     complete = excluded.complete, line_count = excluded.line_count, fetched_at = excluded.fetched_at";
pub(super) const UPSERT_RECONCILIATION: &str = " ON CONFLICT (tenant, day) DO UPDATE SET run_id = excluded.run_id, \
     state = excluded.state, ran_at = excluded.ran_at, counts = excluded.counts";
/// Statistics of the lines' table (a sample of it: cheap whatever its size).
pub(super) const ANALYZE_LINES: Option<&str> = Some("ANALYZE statement_lines");
/// A batch of a scratch id's lines: `(before the id, between id and limit, after the limit)`.
pub(super) const DELETE_LINES: (&str, &str, &str) = (
    "DELETE FROM statement_lines WHERE (copy_id, kind, number) IN (SELECT copy_id, kind, number \
     FROM statement_lines WHERE copy_id = ",
    " LIMIT ",
    ")",
);
pub(super) const DELETE_EXCEPTIONS: (&str, &str, &str) = (
    "DELETE FROM reconciliation_exceptions WHERE (run_id, kind, number) IN (SELECT run_id, kind, number \
     FROM reconciliation_exceptions WHERE run_id = ",
    " LIMIT ",
    ")",
);

/// The reconciliation's advisory lock (per database), another key than the retention pass's.
const LOCK: &str = "SELECT pg_try_advisory_lock(8029464472809402232)";
const UNLOCK: &str = "SELECT pg_advisory_unlock(8029464472809402232)";

/// A session-level advisory lock on a connection of its own, held for the run.
pub(super) async fn lock(store: &PgStore) -> Result<Option<PassLock>, sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    // Closed, not pooled, however the run ends (see the retention pass's lock).
    conn.close_on_drop();
    let locked: bool = sqlx::query_scalar(LOCK).fetch_one(&mut *conn).await?;
    Ok(locked.then(|| PassLock::postgres(conn, UNLOCK)))
}
