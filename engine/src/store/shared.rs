//! The queries Postgres and SQLite run as the same SQL text (`$n` parameters work on both), and the column lists
//! and bind orders MySQL shares with them.
//! Expanded once per backend by `shared_store_methods!`, so each backend's `Store` impl stays concrete.

/// The columns of a [`super::WorkflowRecord`], in the order [`bind_workflow`] binds them.
macro_rules! workflow_fields {
    () => {
        "workflow_id, name, input, input_hash, state, output, error, lease_owner, lease_expires_at, \
         lease_epoch, next_attempt_at, notify, created_at, updated_at"
    };
}

/// `workflows` with the columns of a [`super::WorkflowRecord`] and the compensation list, as inserted.
macro_rules! workflow_columns {
    () => {
        concat!("workflows (", $crate::store::shared::workflow_fields!(), ", compensations)")
    };
}
pub(crate) use {workflow_columns, workflow_fields};

/// Inserts a workflow, with its compensation list (`$15`), unless its id exists.
pub(crate) const INSERT_WORKFLOW: &str = concat!(
    "INSERT INTO ",
    workflow_columns!(),
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT (workflow_id) DO NOTHING"
);

/// The fence: applies a [`super::WorkflowUpdate`] (and a new compensation list, if given) only while
/// `lease_epoch` is still the committer's. Parameters from `$first`: workflow_id, epoch, state, output, error,
/// release_until, now, compensations.
pub(crate) fn fence_sql(first: usize) -> String {
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

pub(crate) const SELECT_WORKFLOW: &str = "SELECT * FROM workflows WHERE workflow_id = $1";
pub(crate) const SELECT_STEPS: &str =
    "SELECT * FROM workflow_steps WHERE workflow_id = $1 ORDER BY started_at, step_key";
pub(crate) const SELECT_COMPENSATIONS: &str = "SELECT compensations FROM workflows WHERE workflow_id = $1";
/// The heartbeat, less its list of workflow ids (`$4`, see [`HEARTBEAT_SQLITE`]):
/// `owner`, `lease_until`, `now`.
macro_rules! heartbeat_sql {
    ($ids:literal) => {
        concat!(
            "UPDATE workflows SET lease_expires_at = $2 WHERE workflow_id ",
            $ids,
            " AND lease_owner = $1 AND state IN ('running', 'compensating') AND lease_expires_at > $3"
        )
    };
}
/// The heartbeat on SQLite: the ids as one JSON array.
pub(crate) const HEARTBEAT_SQLITE: &str = heartbeat_sql!("IN (SELECT value FROM json_each($4))");
pub(crate) const RELEASE: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, \
    next_attempt_at = $3, updated_at = $4 WHERE workflow_id = $1 AND lease_epoch = $2";
pub(crate) const RELEASE_ALL: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, \
    next_attempt_at = $2, updated_at = $2 WHERE lease_owner = $1 AND state IN ('running', 'compensating')";
pub(crate) const REQUEST_NOTIFY: &str = "UPDATE workflows SET notify = TRUE WHERE workflow_id = $1 RETURNING *";
pub(crate) const LIST: &str = "SELECT * FROM workflows WHERE ($1 IS NULL OR state = $1) \
    AND ($2 IS NULL OR created_at < $2) ORDER BY created_at DESC, workflow_id LIMIT $3";

/// Columns of `workflow_steps`, in the order [`bind_steps`] binds them.
pub(crate) const STEP_COLUMNS: &str =
    "workflow_steps (workflow_id, step_key, step_name, kind, status, attempts, output, error, started_at, finished_at)";

/// A checkpoint's statements, parameters numbered from `$first` across all of them in the order
/// [`bind_checkpoint`] binds: the workflow insert with its compensations (`RETURNING 1 AS inserted`), the step
/// upserts, the fence with the compensations if they changed (`RETURNING notify`); and the next free parameter
/// number. Postgres runs them as one statement of CTEs, SQLite as one multi-statement query.
///
/// With `ctes` (Postgres, where the parts become CTEs `w0`, `w1`, …), a workflow's first commit (see
/// [`super::Checkpoint::is_first`]) writes its step rows as plain inserts made only if the insert `w0` wrote the
/// row: a workflow that did not exist has none of them, so nothing can conflict, and Postgres skips the
/// speculative insertion an upsert costs.
pub(crate) fn checkpoint_statements(c: &super::Checkpoint<'_>, first: usize, ctes: bool) -> (Vec<String>, usize) {
    let mut parts = Vec::new();
    let mut next = first;
    let after = (ctes && c.is_first()).then_some("w0");
    if c.insert.is_some() {
        let mut sql = concat!("INSERT INTO ", workflow_columns!(), " VALUES ").to_owned();
        push_value_rows(&mut sql, 1, 15, Some(next));
        sql.push_str(" ON CONFLICT (workflow_id) DO NOTHING RETURNING 1 AS inserted");
        parts.push(sql);
        next += 15;
    }
    if !c.steps.is_empty() {
        parts.push(write_steps_sql(c.steps.len(), next, after));
        next += c.steps.len() * 10;
    }
    if c.fence.is_some() {
        parts.push(fence_sql(next));
        next += 8;
    }
    (parts, next)
}

/// Parameters per row of [`phase_step_values`], the row's key first.
pub(crate) const PHASE_ROW_PARAMS: usize = 6;

/// The `VALUES` rows of a statement phase's step rows, parameters from `next` (advanced past them): per row the
/// key, name, kind, status, attempts, `(output)`, finished and `(keep)`, the columns Postgres names in
/// `v (k, n, kind, status, a, o, fin, keep)` and SQLite `column1…column8`; `pg` adds Postgres's casts.
pub(crate) fn phase_step_values(rows: &[crate::phase::PhaseRow<'_>], next: &mut usize, pg: bool) -> String {
    let cast = |t: &'static str| if pg { t } else { "" };
    let mut values = Vec::new();
    for r in rows {
        let p = |i: usize| *next + i;
        values.push(format!(
            "(${}{t}, ${}{t}, ${}{t}, ${}{t}, ${}{i}, ({}){t}, ${}{b}, {})",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            r.output,
            p(5),
            r.when.map_or_else(|| "TRUE".to_owned(), |w| format!("({w})")),
            t = cast("::text"),
            i = cast("::int"),
            b = cast("::boolean"),
        ));
        *next += PHASE_ROW_PARAMS;
    }
    values.join(", ")
}

/// The codes a one-call commit raises to abort itself (Postgres: as the SQLSTATE; SQLite: as the message), and
/// what each means.
pub(crate) const CHECK_GUARD: &str = "OF001";
pub(crate) const CHECK_FENCE: &str = "OF002";
pub(crate) const CHECK_INSERT: &str = "OF003";

/// The outcome of a one-call commit that raised `code`, if it is one of the checks'.
pub(crate) fn checked(code: &str) -> Option<crate::phase::StatementOutcome> {
    use crate::phase::StatementOutcome;
    match code {
        CHECK_GUARD => Some(StatementOutcome::GuardFailed),
        CHECK_FENCE => Some(StatementOutcome::LeaseLost),
        CHECK_INSERT => Some(StatementOutcome::Duplicate),
        _ => None,
    }
}

/// The outputs of a phase's `count` step rows, read from `row`'s columns from `first` on.
pub(crate) fn read_outputs<R: sqlx::Row>(row: &R, first: usize, count: usize) -> sqlx::Result<Vec<Option<String>>>
where
    usize: sqlx::ColumnIndex<R>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    (0..count).map(|i| row.try_get::<Option<String>, _>(first + i)).collect()
}

/// A statement phase's outputs on SQLite: per step row, its output as text (empty for none) where its condition
/// held. (Postgres reads them back from the rows it wrote.)
pub(crate) fn phase_outputs(rows: &[crate::phase::PhaseRow<'_>]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("CASE WHEN ({}) THEN COALESCE(({}), '') END", r.when.unwrap_or("TRUE"), r.output))
        .collect()
}

/// What an operator action does to a workflow.
pub(crate) struct ReopenPlan {
    /// The workflow's new state.
    pub(crate) state: &'static str,
    /// Whether its error is cleared.
    pub(crate) clear_error: bool,
    /// Statements to run first (one parameter, the workflow id, written `$1`).
    pub(crate) cleanup: &'static [&'static str],
    /// Whether failed compensations are registered again (see [`super::compensations::reset_failed`]).
    pub(crate) reset_compensations: bool,
}

/// The [`ReopenPlan`] of `how`.
pub(crate) fn reopen_plan(how: super::Reopen) -> ReopenPlan {
    use super::{Reopen, state};
    match how {
        Reopen::Forward => ReopenPlan {
            state: state::RUNNING,
            clear_error: true,
            cleanup: &["DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed'"],
            reset_compensations: false,
        },
        Reopen::Compensation => ReopenPlan {
            state: state::COMPENSATING,
            clear_error: false,
            cleanup: &[
                "DELETE FROM workflow_steps WHERE workflow_id = $1 AND status = 'failed' AND step_key LIKE 'compensate/%'",
            ],
            reset_compensations: true,
        },
        Reopen::Cancel => {
            ReopenPlan { state: state::COMPENSATING, clear_error: false, cleanup: &[], reset_compensations: false }
        }
    }
}

/// `INSERT … VALUES (…), (…) ON CONFLICT … DO UPDATE` for `rows` step rows, parameters from `$first`.
pub(crate) fn upsert_steps_sql(rows: usize, first: usize) -> String {
    write_steps_sql(rows, first, None)
}

/// [`upsert_steps_sql`], or with `after` a plain insert made only if CTE `after` returned a row.
fn write_steps_sql(rows: usize, first: usize, after: Option<&str>) -> String {
    let mut sql = format!("INSERT INTO {STEP_COLUMNS} ");
    sql.push_str(if after.is_some() { "SELECT * FROM (VALUES " } else { "VALUES " });
    push_value_rows(&mut sql, rows, 10, Some(first));
    match after {
        Some(after) => sql.push_str(&format!(") v WHERE EXISTS (SELECT 1 FROM {after})")),
        None => sql.push_str(STEPS_ON_CONFLICT),
    }
    sql
}

/// A step upsert's conflict clause: the new row replaces the stored one.
pub(crate) const STEPS_ON_CONFLICT: &str = " ON CONFLICT (workflow_id, step_key) DO UPDATE SET \
    step_name = excluded.step_name, kind = excluded.kind, status = excluded.status, attempts = excluded.attempts, \
    output = excluded.output, error = excluded.error, started_at = excluded.started_at, \
    finished_at = excluded.finished_at";

/// Appends `rows` tuples of `cols` parameters: numbered from `first` (`$n`), or positional (`?`) without it.
pub(crate) fn push_value_rows(sql: &mut String, rows: usize, cols: usize, first: Option<usize>) {
    use std::fmt::Write;
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..cols {
            sql.push_str(if c == 0 { "" } else { ", " });
            match first {
                Some(first) => {
                    let _ = write!(sql, "${}", first + r * cols + c);
                }
                None => sql.push('?'),
            }
        }
        sql.push(')');
    }
}

/// Binds a workflow row in the column order of [`INSERT_WORKFLOW`].
macro_rules! bind_workflow {
    ($q:expr, $wf:expr) => {
        $q.bind(&$wf.workflow_id)
            .bind(&$wf.name)
            .bind(&$wf.input)
            .bind(&$wf.input_hash)
            .bind(&$wf.state)
            .bind(&$wf.output)
            .bind(&$wf.error)
            .bind(&$wf.lease_owner)
            .bind($wf.lease_expires_at)
            .bind($wf.lease_epoch)
            .bind($wf.next_attempt_at)
            .bind($wf.notify)
            .bind($wf.created_at)
            .bind($wf.updated_at)
    };
}

/// Binds step rows in the column order of [`upsert_steps_sql`].
macro_rules! bind_steps {
    ($q:expr, $steps:expr) => {{
        let mut q = $q;
        for s in $steps {
            q = q
                .bind(&s.workflow_id)
                .bind(&s.step_key)
                .bind(&s.step_name)
                .bind(&s.kind)
                .bind(&s.status)
                .bind(s.attempts)
                .bind(&s.output)
                .bind(&s.error)
                .bind(s.started_at)
                .bind(s.finished_at);
        }
        q
    }};
}

/// Binds a fence in the parameter order of [`fence_sql`]; `$comps` is the new compensation list as stored,
/// if it changes.
macro_rules! bind_fence {
    ($q:expr, $workflow_id:expr, $epoch:expr, $update:expr, $now:expr, $comps:expr) => {
        $q.bind($workflow_id)
            .bind($epoch)
            .bind($update.state)
            .bind(&$update.output)
            .bind(&$update.error)
            .bind($update.release_until)
            .bind($now)
            .bind($comps)
    };
}

/// Binds a checkpoint in the parameter order of [`checkpoint_statements`].
macro_rules! bind_checkpoint {
    ($q:expr, $c:expr) => {{
        let c = $c;
        let comps = c.compensations.map(super::compensations::encode).transpose()?;
        let q = match c.insert {
            Some(row) => shared::bind_workflow!($q, row).bind(comps.clone().unwrap_or_else(|| "[]".to_owned())),
            None => $q,
        };
        let q = shared::bind_steps!(q, c.steps);
        match &c.fence {
            Some(f) => shared::bind_fence!(q, f.workflow_id, f.epoch, f.update, f.now, comps),
            None => q,
        }
    }};
}

/// Binds a single-statement commit: the phase's arguments, the checkpoint, the workflow id and the phase's
/// `now`, then each step row's key, name, kind, status, attempts and finished (see [`phase_step_values`]).
macro_rules! bind_statement {
    ($q:expr, $checkpoint:expr, $phase:expr) => {{
        let (checkpoint, phase) = ($checkpoint, $phase);
        let mut q = $q;
        for arg in phase.map_or(&[][..], |p| &p.phase.args[..]) {
            q = match arg {
                SqlArg::Text(t) => q.bind(t),
                SqlArg::Int(i) => q.bind(*i),
            };
        }
        let mut q = shared::bind_checkpoint!(q, checkpoint);
        q = q.bind(checkpoint.workflow_id()).bind(phase.map_or(0, |p| p.now));
        for r in phase.map_or(&[][..], |p| p.rows) {
            q = q.bind(&r.key).bind(r.name).bind(r.kind).bind(r.status).bind(r.attempts).bind(r.finished);
        }
        q
    }};
}

/// The `Store` methods whose SQL and binding are the same on every backend. Expanded inside each backend's
/// `impl Store`, where `Self::Db` is concrete.
macro_rules! shared_store_methods {
    () => {
        fn pool(&self) -> &sqlx::Pool<Self::Db> {
            &self.pool
        }

        async fn insert_workflow(
            &self,
            conn: &mut Conn<Self>,
            wf: &WorkflowRecord,
            compensations: &[CompensationRecord],
        ) -> Result<bool> {
            let q = shared::bind_workflow!(sqlx::query(shared::INSERT_WORKFLOW), wf);
            let done = q.bind(super::compensations::encode(compensations)?).execute(&mut *conn).await?;
            Ok(done.rows_affected() == 1)
        }

        async fn write_steps(&self, conn: &mut Conn<Self>, steps: &[StepRecord]) -> Result<()> {
            if steps.is_empty() {
                return Ok(());
            }
            let sql = shared::upsert_steps_sql(steps.len(), 1);
            shared::bind_steps!(sqlx::query(sqlx::AssertSqlSafe(sql)), steps).execute(&mut *conn).await?;
            Ok(())
        }

        async fn fence(
            &self,
            conn: &mut Conn<Self>,
            workflow_id: &str,
            epoch: i64,
            update: &WorkflowUpdate,
            now: i64,
            compensations: Option<&[CompensationRecord]>,
        ) -> Result<Option<bool>> {
            let comps = compensations.map(super::compensations::encode).transpose()?;
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(shared::fence_sql(1)));
            let q = shared::bind_fence!(q, workflow_id, epoch, update, now, comps);
            let notify: Option<bool> = q.fetch_optional(&mut *conn).await?;
            Ok(notify)
        }

        async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
            Ok(sqlx::query_as(shared::SELECT_WORKFLOW).bind(workflow_id).fetch_optional(&self.pool).await?)
        }

        async fn steps(&self, workflow_id: &str) -> Result<Vec<StepRecord>> {
            Ok(sqlx::query_as(shared::SELECT_STEPS).bind(workflow_id).fetch_all(&self.pool).await?)
        }

        async fn compensations(&self, workflow_id: &str) -> Result<Vec<CompensationRecord>> {
            let q = sqlx::query_scalar(shared::SELECT_COMPENSATIONS).bind(workflow_id);
            let stored: Option<Option<String>> = q.fetch_optional(&self.pool).await?;
            super::compensations::decode(workflow_id, stored.flatten().as_deref())
        }

        async fn release(&self, workflow_id: &str, epoch: i64, next_attempt_at: i64, now: i64) -> Result<bool> {
            let mut w = self.writer().await?;
            let q = sqlx::query(shared::RELEASE).bind(workflow_id).bind(epoch).bind(next_attempt_at).bind(now);
            let done = q.execute(&mut *w).await;
            Ok(w.check(done)?.rows_affected() == 1)
        }

        async fn release_all(&self, owner: &str, now: i64) -> Result<u64> {
            let mut w = self.writer().await?;
            let done = sqlx::query(shared::RELEASE_ALL).bind(owner).bind(now).execute(&mut *w).await;
            Ok(w.check(done)?.rows_affected())
        }

        async fn request_notify(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>> {
            let mut w = self.writer().await?;
            let found = sqlx::query_as(shared::REQUEST_NOTIFY).bind(workflow_id).fetch_optional(&mut *w).await;
            Ok(w.check(found)?)
        }

        async fn list(&self, state: Option<&str>, before: Option<i64>, limit: i64) -> Result<Vec<WorkflowRecord>> {
            Ok(sqlx::query_as(shared::LIST).bind(state).bind(before).bind(limit).fetch_all(&self.pool).await?)
        }

        async fn reopen(
            &self,
            workflow_id: &str,
            from_states: &[&str],
            how: Reopen,
            error: Option<String>,
            now: i64,
        ) -> Result<Option<WorkflowRecord>> {
            let mut tx = self.begin().await?;
            let current: Option<(String, Option<String>)> =
                sqlx::query_as(Self::SELECT_STATE_FOR_UPDATE).bind(workflow_id).fetch_optional(&mut *tx).await?;
            let Some((current, comps)) = current else {
                return Err(crate::Error::NotFound(workflow_id.to_owned()));
            };
            if !from_states.contains(&current.as_str()) {
                return Ok(None);
            }
            let plan = shared::reopen_plan(how);
            for sql in plan.cleanup {
                sqlx::query(*sql).bind(workflow_id).execute(&mut *tx).await?;
            }
            let comps = match plan.reset_compensations {
                true => Some(super::compensations::reset_failed(workflow_id, comps.as_deref())?),
                false => None,
            };
            let row: WorkflowRecord = sqlx::query_as(
                "UPDATE workflows SET state = $2, error = CASE WHEN $3 THEN NULL ELSE COALESCE($4, error) END, \
                 lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1, \
                 next_attempt_at = $5, updated_at = $5, compensations = COALESCE($6, compensations) \
                 WHERE workflow_id = $1 RETURNING *",
            )
            .bind(workflow_id)
            .bind(plan.state)
            .bind(plan.clear_error)
            .bind(error)
            .bind(now)
            .bind(comps)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Some(row))
        }
    };
}

pub(crate) use {bind_checkpoint, bind_fence, bind_statement, bind_steps, bind_workflow, shared_store_methods};

#[cfg(test)]
mod tests {
    #[test]
    fn value_rows_number_parameters_in_order() {
        let sql = super::upsert_steps_sql(2, 1);
        assert!(sql.contains("VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10), ($11, $12, $13, $14, $15"));
    }
}
