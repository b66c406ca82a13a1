//! The retention pass's SQL on MySQL / MariaDB: finished workflows and their steps, a batch at a time.

use super::{Deleted, MySqlStore, Store, placeholders};
use crate::error::Result;

/// Finished workflows ended by `?` (a `failed` one only once nothing it registered is left to undo: see
/// [`crate::store::WorkflowState::DELETABLE`]), through `workflows_finished (state, updated_at)` (one range per state;
/// no `ORDER BY`, so the scan stops at the limit), locked `SKIP LOCKED`: a row an operator's retry holds is left for
/// the next pass, and a locking read sees the latest committed row, so a reopened workflow is not taken.
const DOOMED: &str = "SELECT workflow_id FROM workflows \
     WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at <= ? \
       AND (state <> 'failed' OR NOT COALESCE(JSON_CONTAINS(compensations, '{\"status\": \"registered\"}'), 0)) \
     LIMIT ? FOR UPDATE SKIP LOCKED";
const COUNT_WORKFLOWS: &str = "SELECT COUNT(*) FROM workflows \
     WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at <= ? \
       AND (state <> 'failed' OR NOT COALESCE(JSON_CONTAINS(compensations, '{\"status\": \"registered\"}'), 0))";
const COUNT_STEPS: &str = "SELECT COUNT(*) FROM workflow_steps s JOIN workflows w ON w.workflow_id = s.workflow_id \
     WHERE w.state IN ('completed', 'failed', 'cancelled') AND w.updated_at <= ? \
       AND (w.state <> 'failed' OR NOT COALESCE(JSON_CONTAINS(w.compensations, '{\"status\": \"registered\"}'), 0))";

/// One batch in one short transaction: the rows locked, their steps deleted, then the rows.
pub(super) async fn delete_finished(store: &MySqlStore, ended_by: i64, limit: i64) -> Result<Deleted> {
    let mut tx = store.begin().await?;
    let ids: Vec<String> = sqlx::query_scalar(DOOMED).bind(ended_by).bind(limit).fetch_all(&mut *tx).await?;
    if ids.is_empty() {
        tx.commit().await?;
        return Ok(Deleted::default());
    }
    let in_ids = placeholders(ids.len());
    let mut deleted = Deleted::default();
    for (table, count) in [("workflow_steps", &mut deleted.steps), ("workflows", &mut deleted.workflows)] {
        let sql = format!("DELETE FROM {table} WHERE workflow_id IN ({in_ids})");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in &ids {
            q = q.bind(id);
        }
        *count = q.execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(deleted)
}

pub(super) async fn count_finished(store: &MySqlStore, ended_by: i64) -> Result<Deleted> {
    let workflows: i64 = sqlx::query_scalar(COUNT_WORKFLOWS).bind(ended_by).fetch_one(store.pool()).await?;
    let steps: i64 = sqlx::query_scalar(COUNT_STEPS).bind(ended_by).fetch_one(store.pool()).await?;
    Ok(Deleted { workflows: u64::try_from(workflows).unwrap_or(0), steps: u64::try_from(steps).unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn deletes_the_deletable_states_only() {
        let deletable = crate::store::common::deletable_states_in();
        for sql in [super::DOOMED, super::COUNT_WORKFLOWS, super::COUNT_STEPS] {
            assert!(sql.contains(&deletable), "{sql}");
        }
    }
}
