//! A MySQL commit with a statement phase in two calls: the phase's statements, the bookkeeping (workflow insert
//! or fence, step rows) and the phase's step rows as one multi-statement text inside a transaction, ending with a
//! `SELECT` of the checks and the phase's outputs; then `COMMIT`, or `ROLLBACK` where a check did not hold. A
//! transaction of closure steps costs a round trip per statement, its `BEGIN` and `COMMIT`: a payment's phase
//! seven or eight. The text carries its values as literals (see `inline.rs`): MySQL runs several statements in
//! one call only so.
//!
//! What each write did is kept in session variables (`@onceflow_…`) that the expressions after it read: the
//! phase's own (see the payment crate's dialect) and `@onceflow_held`, whether the bookkeeping held (the insert
//! happened, or the fence found the epoch). A duplicate workflow insert fails the text with a duplicate key (the
//! phase's inserts ignore theirs, the step rows update theirs): the transaction is rolled back and the start is a
//! duplicate.

use sqlx::Row;

use super::{FENCE, INSERT_STEPS, INSERT_WORKFLOW, STEPS_ON_DUPLICATE, duplicate, inline};
use crate::error::Result;
use crate::phase::PhaseCommit;
use crate::store::held::Writer;
use crate::store::{Checkpoint, Committed, StepRecord, WorkflowRecord, WorkflowWrite, common, compensations};

/// The literals of [`INSERT_WORKFLOW`] for `wf`, in its order.
fn workflow_values(wf: &WorkflowRecord, comps: &str, by_database: bool) -> Vec<String> {
    vec![
        inline::text(&wf.workflow_id),
        inline::text(&wf.name),
        inline::text(&wf.input),
        inline::text(&wf.input_hash),
        inline::text(wf.state.as_str()),
        inline::opt_text(wf.output.as_deref()),
        inline::opt_text(wf.error.as_deref()),
        inline::opt_text(wf.lease_owner.as_deref()),
        if by_database { "TRUE" } else { "FALSE" }.to_owned(),
        inline::opt_int(wf.lease_expires_at.map(|until| until - wf.created_at)),
        inline::opt_int(wf.lease_expires_at),
        wf.lease_epoch.to_string(),
        wf.next_attempt_at.to_string(),
        if wf.notify { "TRUE" } else { "FALSE" }.to_owned(),
        wf.created_at.to_string(),
        wf.updated_at.to_string(),
        inline::text(comps),
        inline::opt_text(wf.tenant.as_deref()),
        inline::opt_text(wf.trace.as_deref()),
    ]
}

/// The literals of [`INSERT_STEPS`]' rows for `steps`, in its order.
fn step_values(steps: &[StepRecord]) -> Vec<String> {
    let mut values = Vec::with_capacity(steps.len() * super::STEP_PARAMS);
    for s in steps {
        values.extend([
            inline::text(&s.workflow_id),
            inline::text(&s.step_key),
            inline::text(&s.step_name),
            inline::text(s.kind.as_str()),
            inline::text(s.status.as_str()),
            s.attempts.to_string(),
            inline::opt_text(s.output.as_deref()),
            inline::opt_text(s.error.as_deref()),
            s.started_at.to_string(),
            inline::opt_int(s.finished_at),
            inline::opt_int(s.seq.map(i64::from)),
        ]);
    }
    values
}

/// The commit's statements, in order, ending with the `SELECT` of `@onceflow_held`, the guard and the outputs.
fn statements(checkpoint: &Checkpoint<'_>, phase: PhaseCommit<'_>) -> Result<Vec<String>> {
    let args: Vec<String> = phase.phase.args.iter().map(inline::arg).collect();
    let arg = |sql: &str| inline::numbered(sql, &args);
    let mut sql = vec!["START TRANSACTION".to_owned()];
    for part in &phase.phase.ctes {
        sql.push(arg(part)?);
    }
    let comps = checkpoint.compensations.map(compensations::encode).transpose()?;
    if let WorkflowWrite::Insert(row) = checkpoint.workflow {
        let comps = comps.as_deref().unwrap_or("[]");
        sql.push(inline::positional(INSERT_WORKFLOW, &workflow_values(row, comps, checkpoint.leases_by_database))?);
        sql.push("SET @onceflow_held = 1".to_owned());
    }
    if !checkpoint.steps.is_empty() {
        let mut steps = INSERT_STEPS.to_owned();
        common::push_value_rows(&mut steps, checkpoint.steps.len(), super::STEP_PARAMS, None);
        steps.push_str(STEPS_ON_DUPLICATE);
        sql.push(inline::positional(&steps, &step_values(checkpoint.steps))?);
    }
    if let WorkflowWrite::Fence(f) = checkpoint.workflow {
        let release = inline::opt_int(f.update.release_until);
        let values = [
            inline::opt_text(f.update.state.map(|s| s.as_str())),
            inline::opt_text(f.update.output.as_deref()),
            inline::opt_text(f.update.error.as_deref()),
            release.clone(),
            release.clone(),
            release,
            f.now.to_string(),
            inline::opt_text(comps.as_deref()),
            inline::text(f.workflow_id),
            f.epoch.to_string(),
        ];
        sql.push(inline::positional(FENCE, &values)?);
        // Rows matched (sqlx connects with `CLIENT_FOUND_ROWS`): the row with our epoch exists.
        sql.push("SET @onceflow_held = (ROW_COUNT() = 1)".to_owned());
    }
    let workflow = inline::text(checkpoint.workflow_id());
    let now = phase.now.to_string();
    let mut outputs = Vec::with_capacity(phase.rows.len());
    for r in phase.rows {
        let when = arg(r.when.unwrap_or("TRUE"))?;
        let output = arg(r.output)?;
        sql.push(format!(
            "INSERT INTO workflow_steps (workflow_id, step_key, step_name, kind, status, attempts, output, error, \
             started_at, finished_at, seq) SELECT {workflow}, {}, {}, {}, {}, {}, ({output}), NULL, {now}, {}, {} \
             FROM DUAL WHERE ({when}) AND @onceflow_held{STEPS_ON_DUPLICATE}",
            inline::text(&r.key),
            inline::text(r.name),
            inline::text(r.kind.as_str()),
            inline::text(r.status.as_str()),
            r.attempts,
            if r.finished { now.as_str() } else { "NULL" },
            r.seq,
        ));
        // An intent's output is empty text: written, with no output.
        outputs.push(format!("CAST(CASE WHEN ({when}) THEN COALESCE(({output}), '') END AS CHAR)"));
    }
    let guard = match &phase.phase.guard {
        Some((guard, _)) => arg(guard)?,
        None => "TRUE".to_owned(),
    };
    let mut select =
        format!("SELECT CAST(COALESCE(@onceflow_held, 0) AS SIGNED), CAST(COALESCE(({guard}), 0) AS SIGNED)");
    for output in outputs {
        select.push_str(", ");
        select.push_str(&output);
    }
    sql.push(select);
    Ok(sql)
}

/// [`crate::store::Store::commit_in_one_call`] on MySQL, for a commit with a statement phase, on `conn` (a
/// connection the store holds: closed, which rolls back, should this future be dropped in between).
pub(super) async fn commit_in_one_call(
    mut conn: Writer<'_, sqlx::MySql>,
    checkpoint: &Checkpoint<'_>,
    phase: PhaseCommit<'_>,
) -> Result<Committed> {
    let text = statements(checkpoint, phase)?.join(";\n");
    conn.set_open(true);
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(text)).fetch_all(&mut *conn).await;
    let rows = match conn.check(rows) {
        Ok(rows) => rows,
        Err(e) => {
            // The text stops at its first error, leaving the transaction open (a connection whose rollback
            // fails too is closed, which rolls back).
            let _ = end(&mut conn, "ROLLBACK").await;
            return if duplicate(&e) { Ok(Committed::Duplicate) } else { Err(e.into()) };
        }
    };
    let Some(row) = rows.last() else {
        end(&mut conn, "ROLLBACK").await?;
        return Err(sqlx::Error::RowNotFound.into());
    };
    let (held, guard): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    let outcome = match (held, guard, checkpoint.workflow) {
        (0, _, WorkflowWrite::Insert(_)) => Committed::Duplicate,
        (0, _, WorkflowWrite::Fence(_)) => Committed::LeaseLost,
        (_, 0, _) => Committed::GuardFailed,
        _ => {
            let outputs = common::read_outputs(row, 2, phase.rows.len())?;
            end(&mut conn, "COMMIT").await?;
            return Ok(Committed::Done { notify: false, outputs });
        }
    };
    end(&mut conn, "ROLLBACK").await?;
    Ok(outcome)
}

/// Ends the commit's transaction with `sql` (`COMMIT` or `ROLLBACK`); the connection is then free again.
async fn end(conn: &mut Writer<'_, sqlx::MySql>, sql: &'static str) -> Result<()> {
    let done = sqlx::raw_sql(sql).execute(&mut **conn).await;
    conn.check(done)?;
    conn.set_open(false);
    Ok(())
}
