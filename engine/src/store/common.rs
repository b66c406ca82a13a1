//! The Rust the backends share, with no SQL in it: what an operator action does to a workflow, what a one-call
//! commit's failed check means, and lists of placeholders. Each backend writes its own statements around them,
//! so that a decision is coded once while every query stays next to the code that binds it.

use super::{Committed, Reopen, WorkflowState, compensations};
use crate::error::{Error, Result};

/// The code a one-call commit raises when the phase's guard did not hold (Postgres: as the SQLSTATE of
/// `onceflow_check`; SQLite: as the message of an `onceflow_checks` trigger).
pub(crate) const CHECK_GUARD: &str = "OF001";
/// The code a one-call commit raises when its fence found another epoch.
pub(crate) const CHECK_FENCE: &str = "OF002";
/// The code a one-call commit raises when the workflow row it inserts exists.
pub(crate) const CHECK_INSERT: &str = "OF003";

/// The outcome of a one-call commit that raised `code`, if it is one of the checks'.
pub(crate) fn checked(code: &str) -> Option<Committed> {
    match code {
        CHECK_GUARD => Some(Committed::GuardFailed),
        CHECK_FENCE => Some(Committed::LeaseLost),
        CHECK_INSERT => Some(Committed::Duplicate),
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

/// The failed step rows an operator action deletes before the workflow runs again (each backend has the
/// `DELETE` of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// Every failed step row: the forward run starts again from the step that failed.
    FailedSteps,
    /// The failed compensation steps (`compensate/…`): the compensations run again.
    FailedCompensations,
}

/// What an operator action does to a workflow.
#[derive(Debug)]
pub(crate) struct ReopenPlan {
    /// The workflow's new state.
    pub(crate) state: WorkflowState,
    /// Whether its error is cleared.
    pub(crate) clear_error: bool,
    /// Step rows to delete first.
    pub(crate) cleanup: Option<Cleanup>,
    /// The new compensation list as stored, when it changes (failed ones registered again).
    pub(crate) compensations: Option<String>,
}

/// The plan of `how` for workflow `workflow_id`, read (locked, where the backend can) as `current`: its state
/// and its stored compensation list. [`Error::NotFound`] when there is no such workflow, `None` when its state
/// is not one of `from_states`.
pub(crate) fn reopen_plan(
    workflow_id: &str,
    current: Option<(WorkflowState, Option<String>)>,
    from_states: &[WorkflowState],
    how: Reopen,
) -> Result<Option<ReopenPlan>> {
    let Some((current, comps)) = current else {
        return Err(Error::NotFound(workflow_id.to_owned()));
    };
    if !from_states.contains(&current) {
        return Ok(None);
    }
    Ok(Some(match how {
        Reopen::Forward => ReopenPlan {
            state: WorkflowState::Running,
            clear_error: true,
            cleanup: Some(Cleanup::FailedSteps),
            compensations: None,
        },
        Reopen::Compensation => ReopenPlan {
            state: WorkflowState::Compensating,
            clear_error: false,
            cleanup: Some(Cleanup::FailedCompensations),
            compensations: Some(compensations::reset_failed(workflow_id, comps.as_deref())?),
        },
        Reopen::Cancel => {
            ReopenPlan { state: WorkflowState::Compensating, clear_error: false, cleanup: None, compensations: None }
        }
    }))
}

/// Appends `rows` tuples of `cols` parameters: numbered from `first` (`$n`, Postgres and SQLite), or positional
/// (`?`, MySQL) without it.
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

/// `migrator` without sqlx's own lock, for a backend that takes its migration lock itself (on the connection the
/// migrations then run on): sqlx's waits inside one statement (Postgres: deadlocking an index built
/// `CONCURRENTLY`), or is not taken at all (MariaDB answers `GET_LOCK(…, -1)` with `NULL`).
pub(crate) fn without_lock(migrator: &'static sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Borrowed(&*migrator.migrations),
        ignore_missing: migrator.ignore_missing,
        locking: false,
        no_tx: migrator.no_tx,
        table_name: migrator.table_name.clone(),
        create_schemas: migrator.create_schemas.clone(),
    }
}

/// `state IN ('completed', 'failed', 'cancelled')`: the condition the retention's SQL writes out in each backend's
/// `gc.rs`, built from [`WorkflowState::DELETABLE`] for their tests to check it against.
#[cfg(test)]
pub(crate) fn deletable_states_in() -> String {
    let states: Vec<String> = WorkflowState::DELETABLE.iter().map(|s| format!("'{s}'")).collect();
    format!("state IN ({})", states.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_rows_number_parameters_in_order() {
        let mut sql = String::new();
        push_value_rows(&mut sql, 2, 3, Some(4));
        assert_eq!(sql, "($4, $5, $6), ($7, $8, $9)");
        sql.clear();
        push_value_rows(&mut sql, 2, 2, None);
        assert_eq!(sql, "(?, ?), (?, ?)");
    }

    #[test]
    fn a_reopen_needs_the_workflow_in_an_allowed_state() {
        let failed = WorkflowState::Failed;
        let found = || Some((failed, None));
        assert!(matches!(reopen_plan("w", None, &[failed], Reopen::Forward), Err(Error::NotFound(_))));
        assert!(reopen_plan("w", found(), &[WorkflowState::Running], Reopen::Forward).unwrap().is_none());
        let plan = reopen_plan("w", found(), &[failed], Reopen::Compensation).unwrap().unwrap();
        assert_eq!((plan.state, plan.cleanup), (WorkflowState::Compensating, Some(Cleanup::FailedCompensations)));
        assert_eq!(plan.compensations.as_deref(), Some("[]"));
    }
}
