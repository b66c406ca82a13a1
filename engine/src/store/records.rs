//! The rows the store keeps, as Rust sees them (their statuses are in `status.rs`).
//!
//! Kept apart from the [`super::Store`] trait so that the trait's file reads as the contract alone.

use serde::Serialize;

use super::{CompensationStatus, StepKind, StepStatus, WorkflowState};

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
    /// Where it is.
    pub state: WorkflowState,
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
    /// The W3C `traceparent` of the span that started it (see [`crate::trace`]); `None` when traces are off.
    pub trace: Option<String>,
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
    /// Transactional or external.
    pub kind: StepKind,
    /// Where it is.
    pub status: StepStatus,
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
    /// Where the step stands in the order the workflow first ran its steps (0, 1, 2, …; gaps allowed): a phase's
    /// steps share their times, this does not. Set once, by the step's first row; `None` for rows written before
    /// it existed (migration 0055).
    pub seq: Option<i32>,
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
    /// Whether it has run.
    pub status: CompensationStatus,
}
