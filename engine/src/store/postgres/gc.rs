//! The retention pass's SQL on Postgres: finished workflows and their steps, a batch at a time.

use super::{Deleted, PgStore};
use crate::error::Result;

/// One batch as one statement (its own short transaction): the oldest finished workflows through the partial index
/// `workflows_finished` (a `failed` one only once nothing it registered is left to undo: see
/// [`crate::store::WorkflowState::DELETABLE`]), locked `SKIP LOCKED` (a row an operator's retry holds is left for the
/// next pass; a row that changed since the statement's snapshot is re-checked on its new version, so a reopened
/// workflow is not deleted), then their step rows.
const DELETE_FINISHED: &str = "WITH doomed AS ( \
       SELECT workflow_id FROM workflows \
       WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at <= $1 \
         AND (state <> 'failed' OR NOT compensations::jsonb @> '[{\"status\": \"registered\"}]') \
       ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
     gone AS (DELETE FROM workflows w USING doomed WHERE w.workflow_id = doomed.workflow_id \
       RETURNING w.workflow_id), \
     steps AS (DELETE FROM workflow_steps s USING gone WHERE s.workflow_id = gone.workflow_id RETURNING 1) \
     SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM steps)";

const COUNT_FINISHED: &str = "SELECT count(*), COALESCE(sum((SELECT count(*) FROM workflow_steps s \
       WHERE s.workflow_id = w.workflow_id)), 0)::BIGINT \
     FROM workflows w WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at <= $1 \
       AND (state <> 'failed' OR NOT compensations::jsonb @> '[{\"status\": \"registered\"}]')";

pub(super) async fn delete_finished(store: &PgStore, ended_by: i64, limit: i64) -> Result<Deleted> {
    let (workflows, steps): (i64, i64) =
        sqlx::query_as(DELETE_FINISHED).bind(ended_by).bind(limit).fetch_one(&store.pool).await?;
    Ok(deleted(workflows, steps))
}

pub(super) async fn count_finished(store: &PgStore, ended_by: i64) -> Result<Deleted> {
    let (workflows, steps): (i64, i64) = sqlx::query_as(COUNT_FINISHED).bind(ended_by).fetch_one(&store.pool).await?;
    Ok(deleted(workflows, steps))
}

fn deleted(workflows: i64, steps: i64) -> Deleted {
    Deleted { workflows: u64::try_from(workflows).unwrap_or(0), steps: u64::try_from(steps).unwrap_or(0) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn deletes_the_deletable_states_only() {
        let deletable = crate::store::common::deletable_states_in();
        for sql in [super::DELETE_FINISHED, super::COUNT_FINISHED] {
            assert!(sql.contains(&deletable), "{sql}");
        }
    }
}
