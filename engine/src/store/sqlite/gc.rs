//! The retention pass's SQL on SQLite: finished workflows and their steps, a batch at a time.

use super::{Deleted, SqliteStore, Store};
use crate::error::Result;

/// The oldest finished workflows (a `failed` one only once nothing it registered is left to undo: see
/// [`crate::store::WorkflowState::DELETABLE`]), through the partial index `workflows_finished`, named: without
/// statistics SQLite would rather take `workflows_state` for the `IN` and sort every finished workflow.
const DOOMED: &str = "SELECT workflow_id FROM workflows INDEXED BY workflows_finished \
     WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at <= $1 \
       AND (state <> 'failed' OR NOT EXISTS (SELECT 1 FROM json_each(compensations) \
         WHERE json_extract(value, '$.status') = 'registered')) \
     ORDER BY updated_at LIMIT $2";
/// The ids travel as one JSON array.
const DELETE_STEPS: &str = "DELETE FROM workflow_steps WHERE workflow_id IN (SELECT value FROM json_each($1))";
const DELETE_WORKFLOWS: &str = "DELETE FROM workflows WHERE workflow_id IN (SELECT value FROM json_each($1))";
const COUNT_FINISHED: &str = "SELECT count(*), COALESCE(sum((SELECT count(*) FROM workflow_steps s \
       WHERE s.workflow_id = w.workflow_id)), 0) \
     FROM workflows w INDEXED BY workflows_finished WHERE state IN ('completed', 'failed', 'cancelled') \
       AND updated_at <= $1 AND (state <> 'failed' OR NOT EXISTS (SELECT 1 FROM json_each(compensations) \
         WHERE json_extract(value, '$.status') = 'registered'))";

/// One batch in one `BEGIN IMMEDIATE` transaction (the single writer: nothing changes between its reads and
/// its deletes).
pub(super) async fn delete_finished(store: &SqliteStore, ended_by: i64, limit: i64) -> Result<Deleted> {
    let mut tx = store.begin().await?;
    let ids: Vec<String> = sqlx::query_scalar(DOOMED).bind(ended_by).bind(limit).fetch_all(&mut *tx).await?;
    if ids.is_empty() {
        tx.commit().await?;
        return Ok(Deleted::default());
    }
    let ids = serde_json::to_string(&ids)?;
    let steps = sqlx::query(DELETE_STEPS).bind(&ids).execute(&mut *tx).await?.rows_affected();
    let workflows = sqlx::query(DELETE_WORKFLOWS).bind(&ids).execute(&mut *tx).await?.rows_affected();
    tx.commit().await?;
    Ok(Deleted { workflows, steps })
}

pub(super) async fn count_finished(store: &SqliteStore, ended_by: i64) -> Result<Deleted> {
    let (workflows, steps): (i64, i64) = sqlx::query_as(COUNT_FINISHED).bind(ended_by).fetch_one(&store.pool).await?;
    Ok(Deleted { workflows: u64::try_from(workflows).unwrap_or(0), steps: u64::try_from(steps).unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn deletes_the_deletable_states_only() {
        let deletable = crate::store::common::deletable_states_in();
        for sql in [super::DOOMED, super::COUNT_FINISHED] {
            assert!(sql.contains(&deletable), "{sql}");
        }
    }
}
