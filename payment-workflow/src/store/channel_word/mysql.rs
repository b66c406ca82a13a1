//! MySQL's dialect of the channel word's queries, and the reconciliation's lock.

use onceflow_engine::{MySqlStore, Store};

use crate::store::PassLock;

/// `INSERT IGNORE` drops a row whose key exists (and only warns of other problems a strict mode would refuse,
/// which these rows, built by onceflow, do not have).
pub(super) const INSERT_IGNORE: &str = "INSERT IGNORE INTO";
pub(super) const IGNORE_SUFFIX: &str = "";
pub(super) const UPSERT_COPY: &str = " ON DUPLICATE KEY UPDATE copy_id = VALUES(copy_id), complete = VALUES(complete), \
     line_count = VALUES(line_count), fetched_at = VALUES(fetched_at)";
pub(super) const UPSERT_RECONCILIATION: &str = " ON DUPLICATE KEY UPDATE run_id = VALUES(run_id), \
     state = VALUES(state), ran_at = VALUES(ran_at), counts = VALUES(counts)";
/// InnoDB samples its statistics itself as tables change.
pub(super) const ANALYZE_LINES: Option<&str> = None;
pub(super) const DELETE_LINES: (&str, &str, &str) = ("DELETE FROM statement_lines WHERE copy_id = ", " LIMIT ", "");
pub(super) const DELETE_EXCEPTIONS: (&str, &str, &str) =
    ("DELETE FROM reconciliation_exceptions WHERE run_id = ", " LIMIT ", "");

/// `GET_LOCK` names are server-wide: the name carries the database's.
const LOCK: &str = "SELECT GET_LOCK(CONCAT('onceflow.reconcile.', MD5(DATABASE())), 0)";
const UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('onceflow.reconcile.', MD5(DATABASE())))";

/// `GET_LOCK(name, 0)` on a connection of its own, held for the run.
pub(super) async fn lock(store: &MySqlStore) -> Result<Option<PassLock>, sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    conn.close_on_drop();
    let locked: Option<i64> = sqlx::query_scalar(LOCK).fetch_one(&mut *conn).await?;
    Ok((locked == Some(1)).then(|| PassLock::mysql(conn, UNLOCK)))
}
