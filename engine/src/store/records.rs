//! The rows the store keeps, as Rust sees them, and the values their text columns take.
//!
//! Kept apart from the [`super::Store`] trait so that the trait's file reads as the contract alone.

use serde::Serialize;

/// Workflow states as stored.
pub mod state {
    /// Running forward, or waiting to run (see `next_attempt_at` and the lease).
    pub const RUNNING: &str = "running";
    /// A step failed terminally (or the workflow was cancelled); compensations are running.
    pub const COMPENSATING: &str = "compensating";
    /// Finished with an output.
    pub const COMPLETED: &str = "completed";
    /// Failed; every registered compensation has run.
    pub const FAILED: &str = "failed";
    /// Failed, and a compensation could not finish: an operator must look.
    pub const COMPENSATION_FAILED: &str = "compensation_failed";
    /// Cancelled by an operator; every registered compensation has run.
    pub const CANCELLED: &str = "cancelled";

    /// Every state a workflow can be in.
    pub const ALL: [&str; 6] = [RUNNING, COMPENSATING, COMPLETED, FAILED, COMPENSATION_FAILED, CANCELLED];

    /// Whether a workflow in `state` will not change again without an operator.
    pub fn is_final(state: &str) -> bool {
        !matches!(state, RUNNING | COMPENSATING)
    }

    /// The states whose workflows the retention pass deletes once their history retention has passed since
    /// they ended (`updated_at`). Not `compensation_failed`: such a workflow waits for an operator (a refund
    /// that did not happen, say), so it is unfinished work and is kept until an operator's retry ends it.
    /// Nor a `failed` one with a compensation still `registered`: a step mismatch stops a workflow without
    /// undoing anything (a payment's order stays `paying`, its charge unresolved), and it too waits for an
    /// operator's retry. Any other `failed` one may still be retried by an operator while it is kept: the
    /// retention is that window.
    pub const DELETABLE: [&str; 3] = [COMPLETED, FAILED, CANCELLED];
}

/// What a retention batch deleted of the engine's tables (or, counting, would delete).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Deleted {
    /// Workflow rows.
    pub workflows: u64,
    /// Their step rows.
    pub steps: u64,
}

/// A workflow instance as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct WorkflowRecord {
    /// Caller-chosen id, the idempotency key of the start.
    pub workflow_id: String,
    /// Registered workflow type.
    pub name: String,
    /// Input as JSON text.
    pub input: String,
    /// SHA-256 of the input, hex.
    pub input_hash: String,
    /// One of [`state`]'s constants.
    pub state: String,
    /// Output as JSON text, once completed.
    pub output: Option<String>,
    /// The failure as JSON text, once failed.
    pub error: Option<String>,
    /// Worker holding the lease.
    pub lease_owner: Option<String>,
    /// When the lease ends (ms since the epoch).
    pub lease_expires_at: Option<i64>,
    /// Incremented on every claim; every commit checks it.
    pub lease_epoch: i64,
    /// Not runnable before this time (ms since the epoch).
    pub next_attempt_at: i64,
    /// A waiter in another process asked to be notified when the workflow ends.
    pub notify: bool,
    /// Creation time (ms since the epoch).
    pub created_at: i64,
    /// Time of the last change (ms since the epoch).
    pub updated_at: i64,
    /// Whose workflow it is ([`crate::Workflow::tenant`]), written once by its insert: lists filter on it in the
    /// query. `None` for a workflow type without tenants, and for rows inserted before the column existed
    /// (migration 0011) or by an older binary.
    pub tenant: Option<String>,
}

/// Step kinds as stored.
pub mod kind {
    /// Runs inside the workflow's transaction.
    pub const TRANSACTIONAL: &str = "transactional";
    /// A call outside the database: intent committed before, outcome after.
    pub const EXTERNAL: &str = "external";
}

/// Step statuses as stored.
pub mod step_status {
    /// Intent committed, no outcome yet: if met on resume, the outcome is unknown.
    pub const STARTED: &str = "started";
    /// The last attempt's outcome is unknown; the next attempt must resolve it.
    pub const UNKNOWN: &str = "unknown";
    /// The last attempt failed retryably; the next attempt waits for `next_attempt_at`.
    pub const RETRYING: &str = "retrying";
    /// Finished with an output.
    pub const COMPLETED: &str = "completed";
    /// Failed terminally.
    pub const FAILED: &str = "failed";
}

/// One step of a workflow as stored, unique on `(workflow_id, step_key)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct StepRecord {
    /// The workflow.
    pub workflow_id: String,
    /// Unique within the workflow.
    pub step_key: String,
    /// What the step does (the same name may run under several keys).
    pub step_name: String,
    /// One of [`kind`]'s constants.
    pub kind: String,
    /// One of [`step_status`]'s constants.
    pub status: String,
    /// Attempts started so far.
    pub attempts: i32,
    /// Output as JSON text, once completed.
    pub output: Option<String>,
    /// The last error as JSON text or message.
    pub error: Option<String>,
    /// When the first attempt started (ms since the epoch).
    pub started_at: i64,
    /// When the step completed or failed (ms since the epoch).
    pub finished_at: Option<i64>,
}

/// Compensation statuses as stored.
pub mod compensation_status {
    /// Registered; runs if the workflow fails.
    pub const REGISTERED: &str = "registered";
    /// Has run to completion.
    pub const DONE: &str = "done";
    /// Failed terminally.
    pub const FAILED: &str = "failed";
}

/// A compensation registered before its forward step ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct CompensationRecord {
    /// The workflow.
    pub workflow_id: String,
    /// Registration order; compensations run in reverse.
    pub seq: i32,
    /// The forward step it undoes.
    pub step_key: String,
    /// Which compensation of the workflow type to run.
    pub name: String,
    /// Its input as JSON text.
    pub input: String,
    /// One of [`compensation_status`]'s constants.
    pub status: String,
}
