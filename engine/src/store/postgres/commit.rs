//! A Postgres commit as one statement: the phase's CTEs, the bookkeeping's (workflow insert, step rows, fence)
//! and a final `SELECT`, so that a commit costs one round trip and no `BEGIN` or `COMMIT`.

use std::sync::LazyLock;

use sqlx::Row;

use super::args::{Bind, Texts};
use super::rows;
use super::{NOTIFY_CHANNEL, PgStore, group};
use crate::error::Result;
use crate::phase::{PhaseCommit, PhaseRow, SqlArg};
use crate::store::shapes::{self, Statements};
use crate::store::{Checkpoint, Committed, Conn, WorkflowWrite, common, compensations};

/// The checkpoint's parts, each to become CTE `w0`, `w1`, … of one statement, parameters numbered from `$first`
/// in the order [`bind_checkpoint`] binds: the workflow insert with its compensations (`RETURNING 1 AS
/// inserted`), or else the fence with the compensations if they changed (`RETURNING notify`), as the first
/// part or the last, around the step rows; and the next free parameter number.
///
/// A workflow's first commit (see [`Checkpoint::is_first`]) writes its step rows as plain inserts made only if
/// the insert `w0` wrote the row: a workflow that did not exist has none of them, so nothing can conflict.
fn checkpoint_parts(c: &Checkpoint<'_>, first: usize) -> (Vec<String>, usize) {
    let mut parts = Vec::new();
    let mut next = first;
    if c.is_first() {
        parts.push(rows::insert_workflow_sql(next) + " RETURNING 1 AS inserted");
        next += rows::WORKFLOW_PARAMS;
    }
    if !c.steps.is_empty() {
        parts.push(rows::write_steps_sql(c.steps.len(), next, c.is_first().then_some("w0")));
        next += c.steps.len() * rows::STEP_PARAMS;
    }
    if !c.is_first() {
        parts.push(rows::fence_sql(next));
        next += rows::FENCE_PARAMS;
    }
    (parts, next)
}

/// Binds a checkpoint for [`checkpoint_parts`].
fn bind_checkpoint<B: Bind>(q: B, c: &Checkpoint<'_>) -> Result<B> {
    let comps = c.compensations.map(compensations::encode).transpose()?;
    Ok(match c.workflow {
        WorkflowWrite::Insert(row) => {
            let q = rows::bind_workflow(q, row, comps.unwrap_or_else(|| "[]".to_owned()), c.leases_by_database);
            rows::bind_steps(q, c.steps)
        }
        WorkflowWrite::Fence(f) => {
            let q = rows::bind_steps(q, c.steps);
            rows::bind_fence(q, f.workflow_id, f.epoch, f.update, f.now, comps)
        }
    })
}

/// [`Store::persist`] on Postgres: the workflow insert (first commit) and the step rows ride as data-modifying
/// CTEs of the fence, or of a final check that the insert happened.
pub(super) async fn persist(conn: &mut Conn<PgStore>, checkpoint: &Checkpoint<'_>) -> Result<Committed> {
    let (mut parts, _) = checkpoint_parts(checkpoint, 1);
    if checkpoint.is_first() {
        // `w0` is the insert: whether it wrote the row.
        parts.push("SELECT EXISTS (SELECT 1 FROM w0)".to_owned());
    }
    // Never empty: there is the fence, or the final check of the insert.
    let Some(last) = parts.pop() else { return Ok(Committed::done()) };
    let mut sql = String::new();
    for (i, part) in parts.iter().enumerate() {
        sql.push_str(if i == 0 { "WITH " } else { ", " });
        sql.push_str(&format!("w{i} AS ({part})"));
    }
    sql.push(' ');
    sql.push_str(&last);
    // The statement returns one boolean or nothing: the fence's `notify`, or whether the insert happened.
    let q = bind_checkpoint(sqlx::query(sqlx::AssertSqlSafe(sql)), checkpoint)?;
    let found: Option<bool> = q.try_map(|row: sqlx::postgres::PgRow| row.try_get(0)).fetch_optional(&mut *conn).await?;
    Ok(match (checkpoint.workflow, found) {
        (WorkflowWrite::Insert(_), Some(false)) => Committed::Duplicate,
        (WorkflowWrite::Insert(_), _) => Committed::done(),
        (WorkflowWrite::Fence(_), None) => Committed::LeaseLost,
        (WorkflowWrite::Fence(_), Some(notify)) => Committed::Done { notify, outputs: Vec::new() },
    })
}

/// Parameters per phase step row of [`phase_values`].
const PHASE_ROW_PARAMS: usize = 7;

/// The `VALUES` rows of a statement phase's step rows, columns `v (k, n, kind, status, a, o, fin, keep, seq)`:
/// parameters from `next` (advanced past them) in the order of [`bind_statement`], the output and the
/// condition inline.
fn phase_values(rows: &[PhaseRow<'_>], next: &mut usize) -> String {
    let mut values = Vec::new();
    for r in rows {
        let p = *next;
        values.push(format!(
            "(${}::text, ${}::text, ${}::text, ${}::text, ${}::int, ({})::text, ${}::boolean, {}, ${}::int)",
            p,
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            r.output,
            p + 5,
            r.when.map_or_else(|| "TRUE".to_owned(), |w| format!("({w})")),
            p + 6,
        ));
        *next += PHASE_ROW_PARAMS;
    }
    values.join(", ")
}

/// Binds a one-statement commit: the phase's arguments, the checkpoint, the workflow id and the phase's `now`,
/// then each step row's parameters (see [`phase_values`]).
fn bind_statement<B: Bind>(
    q: B,
    checkpoint: &Checkpoint<'_>,
    phase: Option<PhaseCommit<'_>>,
    notify: bool,
) -> Result<B> {
    let mut q = q;
    for arg in phase.map_or(&[][..], |p| &p.phase.args[..]) {
        q = match arg {
            SqlArg::Text(t) => q.arg(t),
            SqlArg::Int(i) => q.arg(*i),
        };
    }
    let mut q = bind_checkpoint(q, checkpoint)?;
    q = q.arg(checkpoint.workflow_id()).arg(phase.map_or(0, |p| p.now));
    for r in phase.map_or(&[][..], |p| p.rows) {
        q = q.arg(&r.key).arg(r.name).arg(r.kind).arg(r.status).arg(r.attempts).arg(r.finished).arg(r.seq);
    }
    if notify {
        q = q.arg(NOTIFY_CHANNEL);
    }
    Ok(q)
}

/// How a one-statement commit answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// One column per check and output, sent alone.
    Alone,
    /// The same columns as one `text[]`, as a member of a group commit's batch (`group.rs`).
    Batched,
}

/// The one-statement commit's SQL (see [`commit_in_one_call`]): the phase's CTEs, the bookkeeping's CTEs, the
/// phase's step rows, and a final `SELECT` of the checks, then the notification's count (`notify`), then the
/// phase's outputs. It depends on the phase's text and the checkpoint's form only (see `shapes.rs`).
fn statement_sql(checkpoint: &Checkpoint<'_>, phase: Option<PhaseCommit<'_>>, notify: bool, form: Form) -> String {
    let args = phase.map_or(0, |p| p.phase.args.len());
    let (parts, mut next) = checkpoint_parts(checkpoint, args + 1);
    // The phase's CTEs are shared text, the bookkeeping's are this commit's.
    let mut ctes: Vec<String> = parts.iter().enumerate().map(|(i, part)| format!("w{i} AS ({part})")).collect();
    // The bookkeeping's own check: the fence (the last part) matched, or else the insert (the first) happened.
    let (held, code) = match checkpoint.workflow {
        WorkflowWrite::Insert(_) => ("EXISTS (SELECT 1 FROM w0)".to_owned(), common::CHECK_INSERT),
        WorkflowWrite::Fence(_) => (format!("EXISTS (SELECT 1 FROM w{})", parts.len() - 1), common::CHECK_FENCE),
    };
    let (workflow, now) = (next, next + 1);
    next += 2;
    let rows = phase.map_or(&[][..], |p| p.rows);
    // The phase's outputs are read back from the step rows written (a row not written reads NULL; an intent's
    // empty text means written, with no output), so the statement evaluates each output once.
    let mut outputs = Vec::new();
    if !rows.is_empty() {
        let first_key = next;
        let values = phase_values(rows, &mut next);
        ctes.push(format!(
            "ws AS (INSERT INTO {} SELECT ${workflow}::text, v.k, v.n, v.kind, v.status, v.a, v.o, NULL, \
             ${now}::bigint, CASE WHEN v.fin THEN ${now}::bigint END, v.seq \
             FROM (VALUES {}) v (k, n, kind, status, a, o, fin, keep, seq) WHERE v.keep{} RETURNING step_key, output)",
            rows::STEP_COLUMNS,
            values,
            // A workflow's first commit finds no step rows (see `checkpoint_parts`).
            if checkpoint.is_first() { " AND EXISTS (SELECT 1 FROM w0)" } else { rows::STEPS_ON_CONFLICT }
        ));
        outputs = (0..rows.len())
            .map(|i| {
                let key = first_key + PHASE_ROW_PARAMS * i;
                format!("max(CASE WHEN step_key = ${key} THEN COALESCE(output, '') END)")
            })
            .collect();
    }
    if notify {
        ctes.push(format!(
            "n AS (SELECT pg_notify(${next}::text, ${workflow}::text) FROM w{} WHERE notify)",
            parts.len() - 1
        ));
    }
    // The bookkeeping's check first: a phase of a workflow that exists already (or is no longer ours) is a
    // duplicate start (or a lost lease), whatever its guard says.
    let guard = phase.and_then(|p| p.phase.guard.as_ref()).map_or("TRUE", |(g, _)| &**g);
    let shared = phase.map_or(&[][..], |p| &p.phase.ctes[..]);
    let all: Vec<&str> = shared.iter().chain(&ctes).map(String::as_str).collect();
    let mut columns = vec![
        format!("onceflow_check({held}, '{code}')"),
        format!("onceflow_check({guard}, '{}')", common::CHECK_GUARD),
    ];
    if notify {
        columns.push("(SELECT count(*) FROM n)".to_owned());
    }
    let from = (!outputs.is_empty()).then(|| {
        let named: Vec<String> = outputs.iter().enumerate().map(|(i, o)| format!("{o} AS o{i}")).collect();
        format!(" FROM (SELECT {} FROM ws) o", named.join(", "))
    });
    columns.extend((0..outputs.len()).map(|i| format!("o.o{i}")));
    let select = match form {
        Form::Alone => columns.join(", "),
        // One `text[]`, as `onceflow_batch` takes every member's answer (each column's text, in the same order).
        Form::Batched => {
            let texts: Vec<String> = columns.iter().map(|c| format!("({c})::text")).collect();
            format!("ARRAY[{}]", texts.join(", "))
        }
    };
    format!("WITH {} SELECT {select}{}", all.join(", "), from.unwrap_or_default())
}

/// [`Store::commit_in_one_call`] on Postgres: one statement in autocommit ([`statement_sql`], built once per
/// shape: `store/shapes.rs`), whose `onceflow_check` calls raise (rolling everything back) when the guard, the fence or the insert
/// did not hold.
pub(super) async fn commit_in_one_call(
    store: &PgStore,
    checkpoint: &Checkpoint<'_>,
    phase: Option<PhaseCommit<'_>>,
    finished: bool,
) -> Result<Option<Committed>> {
    let notify = finished && !checkpoint.is_first();
    static STATEMENTS: LazyLock<Statements> = LazyLock::new(Statements::default);
    let sql = shapes::statement(&STATEMENTS, checkpoint, phase, notify, || {
        statement_sql(checkpoint, phase, notify, Form::Alone)
    });
    let q = bind_statement(sqlx::query(sqlx::AssertSqlSafe(sql)), checkpoint, phase, notify)?;
    // Its form as a member of a batch, made only if it queues for one.
    let batched = || {
        static BATCHED: LazyLock<Statements> = LazyLock::new(Statements::default);
        let sql = shapes::statement(&BATCHED, checkpoint, phase, notify, || {
            statement_sql(checkpoint, phase, notify, Form::Batched)
        });
        Ok(group::Batched { sql, args: bind_statement(Texts::default(), checkpoint, phase, notify)? })
    };
    // The outputs follow the two checks and the notification's count.
    let outputs = (if notify { 3 } else { 2 }, phase.map_or(0, |p| p.rows.len()));
    Ok(Some(match group::commit(store, group::Statement::new(q, outputs)?, batched).await? {
        Ok(outputs) => Committed::Done { notify: false, outputs },
        Err(refused) => refused,
    }))
}
