//! An SQLite commit as one multi-statement call to the writer's thread (one hand-off instead of one per
//! statement): the bookkeeping within a step's transaction, or a whole commit inside a group commit.

use std::sync::LazyLock;

use sqlx::Row;

use super::rows::{self, SqliteQuery};
use super::{PHASE_FLAGS, SqliteStore};
use crate::error::Result;
use crate::phase::{PhaseCommit, PhaseRow, SqlArg};
use crate::store::shapes::{self, Statements};
use crate::store::{Checkpoint, Committed, Conn, WorkflowWrite, common, compensations};

/// The checkpoint's statements, parameters numbered from `$first` across all of them in the order
/// [`bind_checkpoint`] binds: the workflow insert with its compensations (`RETURNING 1 AS inserted`), or else
/// the fence with the compensations if they changed (`RETURNING notify`), as the first statement or the last,
/// around the step upserts; and the next free parameter number.
fn checkpoint_statements(c: &Checkpoint<'_>, first: usize) -> (Vec<String>, usize) {
    let mut parts = Vec::new();
    let mut next = first;
    if c.is_first() {
        parts.push(rows::insert_workflow_sql(next) + " RETURNING 1 AS inserted");
        next += rows::WORKFLOW_PARAMS;
    }
    if !c.steps.is_empty() {
        parts.push(rows::upsert_steps_sql(c.steps.len(), next));
        next += c.steps.len() * rows::STEP_PARAMS;
    }
    if !c.is_first() {
        parts.push(rows::fence_sql(next));
        next += rows::FENCE_PARAMS;
    }
    (parts, next)
}

/// Binds a checkpoint for [`checkpoint_statements`].
fn bind_checkpoint<'q>(q: SqliteQuery<'q>, c: &Checkpoint<'_>) -> Result<SqliteQuery<'q>> {
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

/// [`crate::store::Store::persist`] on SQLite: one multi-statement query (one trip to the connection's worker
/// thread instead of up to four); its rows tell whether the insert happened (`inserted`) and the fence's
/// `notify`.
pub(super) async fn persist(conn: &mut Conn<SqliteStore>, checkpoint: &Checkpoint<'_>) -> Result<Committed> {
    // Never empty: there is the insert or the fence.
    let (parts, _) = checkpoint_statements(checkpoint, 1);
    let q = bind_checkpoint(sqlx::query(sqlx::AssertSqlSafe(parts.join("; "))), checkpoint)?;
    let rows = q.fetch_all(&mut *conn).await?;
    Ok(match checkpoint.workflow {
        WorkflowWrite::Insert(_) if !rows.iter().any(|r| r.try_get::<i64, _>("inserted").is_ok()) => {
            Committed::Duplicate
        }
        WorkflowWrite::Insert(_) => Committed::done(),
        WorkflowWrite::Fence(_) => match rows.iter().find_map(|r| r.try_get::<bool, _>("notify").ok()) {
            Some(notify) => Committed::Done { notify, outputs: Vec::new() },
            None => Committed::LeaseLost,
        },
    })
}

/// Parameters per phase step row of [`phase_values`].
const PHASE_ROW_PARAMS: usize = 7;

/// The `VALUES` rows of a statement phase's step rows, columns `column1…column9` (key, name, kind, status,
/// attempts, output, finished, keep, seq): parameters from `next` (advanced past them) in the order of
/// [`bind_statement`], the output and the condition inline.
fn phase_values(rows: &[PhaseRow<'_>], next: &mut usize) -> String {
    let mut values = Vec::new();
    for r in rows {
        let p = *next;
        values.push(format!(
            "(${}, ${}, ${}, ${}, ${}, ({}), ${}, {}, ${})",
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

/// A statement phase's outputs: per step row, its output as text (empty for none) where its condition held.
fn phase_outputs(rows: &[PhaseRow<'_>]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("CASE WHEN ({}) THEN COALESCE(({}), '') END", r.when.unwrap_or("TRUE"), r.output))
        .collect()
}

/// Binds a one-call commit: the phase's arguments, the checkpoint, the workflow id and the phase's `now`, then
/// each step row's parameters (see [`phase_values`]).
fn bind_statement<'q>(
    q: SqliteQuery<'q>,
    checkpoint: &Checkpoint<'_>,
    phase: Option<PhaseCommit<'_>>,
) -> Result<SqliteQuery<'q>> {
    let mut q = q;
    for arg in phase.map_or(&[][..], |p| &p.phase.args[..]) {
        q = match arg {
            SqlArg::Text(t) => q.bind(t),
            SqlArg::Int(i) => q.bind(*i),
        };
    }
    let mut q = bind_checkpoint(q, checkpoint)?;
    q = q.bind(checkpoint.workflow_id()).bind(phase.map_or(0, |p| p.now));
    for r in phase.map_or(&[][..], |p| p.rows) {
        q = q.bind(&r.key).bind(r.name).bind(r.kind).bind(r.status).bind(r.attempts).bind(r.finished).bind(r.seq);
    }
    Ok(q)
}

/// The one-call commit's SQL (see [`commit_in_one_call`]): the phase's statements, the bookkeeping's with their
/// checks, the phase's step rows, the guard's check, and a final `SELECT` of the outputs. It depends on the
/// phase's text and the checkpoint's form only (see `store/shapes.rs`).
fn statement_sql(checkpoint: &Checkpoint<'_>, phase: Option<PhaseCommit<'_>>) -> String {
    let args = phase.map_or(0, |p| p.phase.args.len());
    let (parts, mut next) = checkpoint_statements(checkpoint, args + 1);
    let check =
        |ok: &str, code: &str| format!("INSERT INTO onceflow_checks SELECT '{code}' WHERE NOT COALESCE({ok}, 0)");
    let mut sql = Vec::new();
    if let Some(p) = phase {
        sql.push(format!("DELETE FROM {PHASE_FLAGS}"));
        sql.extend(p.phase.ctes.iter().cloned());
    }
    let last = parts.len().saturating_sub(1);
    for (i, part) in parts.into_iter().enumerate() {
        sql.push(part);
        // Each check right after its statement, which `changes()` counts.
        match checkpoint.workflow {
            WorkflowWrite::Insert(_) if i == 0 => sql.push(check("changes() = 1", common::CHECK_INSERT)),
            WorkflowWrite::Fence(_) if i == last => sql.push(check("changes() = 1", common::CHECK_FENCE)),
            _ => {}
        }
    }
    let (workflow, now) = (next, next + 1);
    next += 2;
    let rows = phase.map_or(&[][..], |p| p.rows);
    if !rows.is_empty() {
        sql.push(format!(
            "INSERT INTO {} SELECT ${workflow}, column1, column2, column3, column4, column5, column6, NULL, \
             ${now}, CASE WHEN column7 THEN ${now} END, column9 FROM (VALUES {}) WHERE column8{}",
            rows::STEP_COLUMNS,
            phase_values(rows, &mut next),
            rows::STEPS_ON_CONFLICT
        ));
    }
    if let Some((guard, _)) = phase.and_then(|p| p.phase.guard.as_ref()) {
        sql.push(check(&format!("({guard})"), common::CHECK_GUARD));
    }
    if !rows.is_empty() {
        // An intent's output is empty text: written, with no output.
        sql.push(format!("SELECT {}", phase_outputs(rows).join(", ")));
    }
    sql.join(";\n")
}

/// [`crate::store::Store::commit_in_one_call`] on SQLite: one multi-statement call to the writer's thread inside
/// a group commit (see `GroupCommit`), the phase's statements, the bookkeeping, the phase's step rows and the
/// outputs ([`statement_sql`], built once per shape), where a transaction of closure steps costs a hand-off per
/// statement and the writer waits through each. A check that fails (fence, insert, guard) inserts its code into
/// `onceflow_checks`, whose triggers raise it (migration 0004), and the commit is undone alone.
pub(super) async fn commit_in_one_call(
    store: &SqliteStore,
    checkpoint: &Checkpoint<'_>,
    phase: Option<PhaseCommit<'_>>,
) -> Result<Option<Committed>> {
    static STATEMENTS: LazyLock<Statements> = LazyLock::new(Statements::default);
    let sql = shapes::statement(&STATEMENTS, checkpoint, phase, false, || statement_sql(checkpoint, phase));
    let rows = phase.map_or(&[][..], |p| p.rows);
    let q = bind_statement(sqlx::query(sqlx::AssertSqlSafe(sql)), checkpoint, phase)?;
    match store.group.commit(q).await {
        Ok(found) => {
            let outputs = match found.last() {
                Some(row) if !rows.is_empty() => common::read_outputs(row, 0, rows.len())?,
                _ => Vec::new(),
            };
            Ok(Some(Committed::Done { notify: false, outputs }))
        }
        Err(sqlx::Error::Database(e)) => match common::checked(e.message()) {
            Some(outcome) => Ok(Some(outcome)),
            None => Err(sqlx::Error::Database(e).into()),
        },
        Err(e) => Err(e.into()),
    }
}
