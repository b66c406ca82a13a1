//! The column lists, bind orders and reopen plan MySQL still shares with the other backends, until it writes out
//! its own SQL too.

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

/// Columns of `workflow_steps`, in the order [`bind_steps`] binds them.
pub(crate) const STEP_COLUMNS: &str =
    "workflow_steps (workflow_id, step_key, step_name, kind, status, attempts, output, error, started_at, finished_at)";

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

/// Binds a workflow row in the column order of [`workflow_columns`].
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

/// Binds step rows in the column order of [`STEP_COLUMNS`].
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

pub(crate) use {bind_steps, bind_workflow};
