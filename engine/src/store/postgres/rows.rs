//! The rows every Postgres commit writes besides the business rows: the workflow's insert, the step upserts and
//! the fence, each as SQL numbered from a given parameter (a one-statement commit puts several in one
//! statement), with the function that binds it in the same order next to it.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;

use super::super::{StepRecord, WorkflowRecord, WorkflowUpdate, common};
use super::args::Bind;

/// A query on Postgres, as the binders take and return it.
pub(super) type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Parameters of [`insert_workflow_sql`].
pub(super) const WORKFLOW_PARAMS: usize = 18;

/// Inserts a workflow with its compensation list, parameters from `$first` in the order of [`bind_workflow`],
/// unless its id exists. The last parameter says whether the lease is judged by the database's clock: then
/// `lease_expires_at` is moved onto it (see [`crate::store::Checkpoint::leases_by_database`]).
pub(super) fn insert_workflow_sql(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    let mut values: Vec<String> = (0..WORKFLOW_PARAMS - 1).map(p).collect();
    values[8] = format!(
        "CASE WHEN {by_db} THEN {expires} - {created} + {now} ELSE {expires} END",
        by_db = p(17),
        expires = p(8),
        created = p(12),
        now = super::DB_NOW
    );
    format!(
        "INSERT INTO workflows (workflow_id, name, input, input_hash, state, output, error, lease_owner, \
         lease_expires_at, lease_epoch, next_attempt_at, notify, created_at, updated_at, compensations, tenant, trace) \
         VALUES ({}) ON CONFLICT (workflow_id) DO NOTHING",
        values.join(", ")
    )
}

/// Binds `wf` and its stored compensation list `comps` for [`insert_workflow_sql`]; `by_database`: its lease is
/// moved onto the database's clock.
pub(super) fn bind_workflow<B: Bind>(q: B, wf: &WorkflowRecord, comps: String, by_database: bool) -> B {
    q.arg(&wf.workflow_id)
        .arg(&wf.name)
        .arg(&wf.input)
        .arg(&wf.input_hash)
        .arg(wf.state)
        .arg(&wf.output)
        .arg(&wf.error)
        .arg(&wf.lease_owner)
        .arg(wf.lease_expires_at)
        .arg(wf.lease_epoch)
        .arg(wf.next_attempt_at)
        .arg(wf.notify)
        .arg(wf.created_at)
        .arg(wf.updated_at)
        .arg(comps)
        .arg(&wf.tenant)
        .arg(&wf.trace)
        .arg(by_database)
}

/// `workflow_steps` with its columns, in the order [`bind_steps`] binds them.
pub(super) const STEP_COLUMNS: &str = "workflow_steps (workflow_id, step_key, step_name, kind, status, attempts, output, error, started_at, finished_at, seq)";

/// Parameters per row of [`STEP_COLUMNS`].
pub(super) const STEP_PARAMS: usize = 11;

/// A step upsert's conflict clause: the new row replaces the stored one, but for its `seq` (set by the first).
pub(super) const STEPS_ON_CONFLICT: &str = " ON CONFLICT (workflow_id, step_key) DO UPDATE SET \
    step_name = excluded.step_name, kind = excluded.kind, status = excluded.status, attempts = excluded.attempts, \
    output = excluded.output, error = excluded.error, started_at = excluded.started_at, \
    finished_at = excluded.finished_at";

/// Inserts or replaces `rows` step rows, parameters from `$first`; or with `after`, inserts them only if CTE
/// `after` returned a row (a workflow's first commit, where no step row can exist to conflict with: a plain
/// insert spares Postgres the speculative insertion of an upsert).
pub(super) fn write_steps_sql(rows: usize, first: usize, after: Option<&str>) -> String {
    let mut sql = format!("INSERT INTO {STEP_COLUMNS} ");
    sql.push_str(if after.is_some() { "SELECT * FROM (VALUES " } else { "VALUES " });
    common::push_value_rows(&mut sql, rows, STEP_PARAMS, Some(first));
    match after {
        Some(after) => sql.push_str(&format!(") v WHERE EXISTS (SELECT 1 FROM {after})")),
        None => sql.push_str(STEPS_ON_CONFLICT),
    }
    sql
}

/// Binds `steps` for [`write_steps_sql`].
pub(super) fn bind_steps<B: Bind>(mut q: B, steps: &[StepRecord]) -> B {
    for s in steps {
        q = q
            .arg(&s.workflow_id)
            .arg(&s.step_key)
            .arg(&s.step_name)
            .arg(s.kind)
            .arg(s.status)
            .arg(s.attempts)
            .arg(&s.output)
            .arg(&s.error)
            .arg(s.started_at)
            .arg(s.finished_at)
            .arg(s.seq);
    }
    q
}

/// Parameters of [`fence_sql`].
pub(super) const FENCE_PARAMS: usize = 8;

/// The fence: applies a [`WorkflowUpdate`] (and a new compensation list, if given) only while `lease_epoch` is
/// still the committer's, returning `notify`. Parameters from `$first`, in the order of [`bind_fence`].
pub(super) fn fence_sql(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "UPDATE workflows SET state = COALESCE({s}, state), output = COALESCE({o}, output), \
         error = COALESCE({e}, error), \
         lease_owner = CASE WHEN {r} IS NULL THEN lease_owner ELSE NULL END, \
         lease_expires_at = CASE WHEN {r} IS NULL THEN lease_expires_at ELSE NULL END, \
         next_attempt_at = COALESCE({r}, next_attempt_at), updated_at = {n}, \
         compensations = COALESCE({c}, compensations) WHERE workflow_id = {id} AND lease_epoch = {ep} RETURNING notify",
        id = p(0),
        ep = p(1),
        s = p(2),
        o = p(3),
        e = p(4),
        r = p(5),
        n = p(6),
        c = p(7),
    )
}

/// Binds a fence for [`fence_sql`]; `comps` is the new compensation list as stored, if it changes.
pub(super) fn bind_fence<B: Bind>(
    q: B,
    workflow_id: &str,
    epoch: i64,
    update: &WorkflowUpdate,
    now: i64,
    comps: Option<String>,
) -> B {
    q.arg(workflow_id)
        .arg(epoch)
        .arg(update.state)
        .arg(&update.output)
        .arg(&update.error)
        .arg(update.release_until)
        .arg(now)
        .arg(comps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn step_rows_number_parameters_in_order() {
        let sql = super::write_steps_sql(2, 1, None);
        assert!(sql.contains("VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11), ($12, $13, $14, $15, $16"));
    }
}
