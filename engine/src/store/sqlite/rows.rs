//! The rows every SQLite commit writes besides the business rows: the workflow's insert, the step upserts and
//! the fence, each as SQL numbered from a given parameter (a one-call commit runs several in one call), with
//! the function that binds it in the same order next to it.

use sqlx::Sqlite;
use sqlx::sqlite::SqliteArguments;

use super::super::{StepRecord, WorkflowRecord, WorkflowUpdate, common};

/// A query on SQLite, as the binders take and return it.
pub(super) type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

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
pub(super) fn bind_workflow<'q>(
    q: SqliteQuery<'q>,
    wf: &WorkflowRecord,
    comps: String,
    by_database: bool,
) -> SqliteQuery<'q> {
    q.bind(&wf.workflow_id)
        .bind(&wf.name)
        .bind(&wf.input)
        .bind(&wf.input_hash)
        .bind(wf.state)
        .bind(&wf.output)
        .bind(&wf.error)
        .bind(&wf.lease_owner)
        .bind(wf.lease_expires_at)
        .bind(wf.lease_epoch)
        .bind(wf.next_attempt_at)
        .bind(wf.notify)
        .bind(wf.created_at)
        .bind(wf.updated_at)
        .bind(comps)
        .bind(&wf.tenant)
        .bind(&wf.trace)
        .bind(by_database)
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

/// Inserts or replaces `rows` step rows, parameters from `$first`.
pub(super) fn upsert_steps_sql(rows: usize, first: usize) -> String {
    let mut sql = format!("INSERT INTO {STEP_COLUMNS} VALUES ");
    common::push_value_rows(&mut sql, rows, STEP_PARAMS, Some(first));
    sql.push_str(STEPS_ON_CONFLICT);
    sql
}

/// Binds `steps` for [`upsert_steps_sql`].
pub(super) fn bind_steps<'q>(mut q: SqliteQuery<'q>, steps: &[StepRecord]) -> SqliteQuery<'q> {
    for s in steps {
        q = q
            .bind(&s.workflow_id)
            .bind(&s.step_key)
            .bind(&s.step_name)
            .bind(s.kind)
            .bind(s.status)
            .bind(s.attempts)
            .bind(&s.output)
            .bind(&s.error)
            .bind(s.started_at)
            .bind(s.finished_at)
            .bind(s.seq);
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
pub(super) fn bind_fence<'q>(
    q: SqliteQuery<'q>,
    workflow_id: &str,
    epoch: i64,
    update: &WorkflowUpdate,
    now: i64,
    comps: Option<String>,
) -> SqliteQuery<'q> {
    q.bind(workflow_id)
        .bind(epoch)
        .bind(update.state)
        .bind(&update.output)
        .bind(&update.error)
        .bind(update.release_until)
        .bind(now)
        .bind(comps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn step_rows_number_parameters_in_order() {
        let sql = super::upsert_steps_sql(2, 1);
        assert!(sql.contains("VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11), ($12, $13, $14, $15, $16"));
    }
}
