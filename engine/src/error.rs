//! What can go wrong, and what the engine does next in each case.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Errors of the engine's own machinery: the database, a conflict, an unknown workflow.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration could not be applied.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A workflow with this id exists with another input.
    #[error("workflow {workflow_id} already exists with a different input")]
    Conflict {
        /// The id that was started twice.
        workflow_id: String,
    },
    /// No workflow type of this name is registered in this engine.
    #[error("no workflow type named {0} is registered")]
    UnknownWorkflowType(String),
    /// No workflow with this id exists.
    #[error("workflow {0} not found")]
    NotFound(String),
    /// The operator action does not apply to the workflow in its current state.
    #[error("workflow {workflow_id} is {state}: {reason}")]
    InvalidState {
        /// The workflow concerned.
        workflow_id: String,
        /// Its current state.
        state: String,
        /// Why the action does not apply.
        reason: &'static str,
    },
    /// A value could not be turned into JSON or back.
    #[error("serialization error: {0}")]
    Serde(#[from] serde_json::Error),
    /// A workflow's run stopped before it was recorded (a lost lease, an unexpected interrupt).
    #[error("the workflow run stopped: {0}")]
    Interrupted(String),
    /// The workflow's first phase did not hold its guard, so nothing of the workflow was recorded: the start
    /// was refused with this failure (see [`crate::phase::StatementPhase::guard`]).
    #[error("the start was refused: {0}")]
    Refused(Failure),
    /// The store cannot do what was asked of it (a statement phase on a backend without them).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The engine is shutting down and accepts no new work.
    #[error("the engine is shutting down")]
    ShuttingDown,
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a step's attempt failed, which decides what happens next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// Nothing happened that matters; the step may run again after the retry policy's wait.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The step can never succeed; the workflow fails and its compensations run.
    #[error("terminal: {0}")]
    Terminal(Failure),
    /// The effect may or may not have happened (a timeout, a lost reply). The next attempt is told so and must
    /// find out what happened before acting again.
    #[error("unknown outcome: {0}")]
    UnknownOutcome(String),
    /// The effect was asked for and the outside is still deciding it (a charge the channel answers
    /// `processing`): an unknown outcome that is waited out on the step's pending schedule
    /// ([`crate::StepSpec::pending_retry`]), which may grow long, never given up. The outside is expected to
    /// say when it decides (an event delivered from outside, which wakes the workflow at once:
    /// [`crate::Engine::wake`]); the next attempt finds out what happened before acting again.
    #[error("pending: {0}")]
    Pending(String),
    /// The database failed inside a transactional step; treated as retryable.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl StepError {
    /// A terminal failure with a machine-readable code and a message.
    pub fn terminal(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Terminal(Failure::new(code, message))
    }
}

/// The failure code of an operator's cancel.
pub const CANCELLED_CODE: &str = "cancelled";

/// A terminal failure: a stable code, a message for people and optional details for programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Failure {
    /// Stable, machine-readable code.
    pub code: String,
    /// What happened, for people.
    pub message: String,
    /// Anything a program needs to act on the failure.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

impl Failure {
    /// A failure without details.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), details: Value::Null }
    }

    /// The same failure carrying `details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

/// Why a workflow body stopped before returning its output.
///
/// Only [`Interrupt::Failed`] is a failure of the workflow; the other variants are control flow the engine
/// handles (a persisted wait, a lost lease, a shutdown) and a body should pass them on with `?`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Interrupt {
    /// A step failed terminally: the compensations run and the workflow ends `failed`.
    #[error("{0}")]
    Failed(Failure),
    /// A step waits for a retry long enough that the wait was persisted and the workflow released.
    #[error("suspended until {until_ms}")]
    Suspended {
        /// When the workflow becomes runnable again (milliseconds since the epoch).
        until_ms: i64,
    },
    /// A transactional step failed transiently and its transaction was rolled back: the engine replays the
    /// body from the last commit after this many milliseconds.
    #[error("retry in {delay_ms} ms")]
    Retry {
        /// The wait before the replay.
        delay_ms: u64,
    },
    /// The workflow id was recorded first by another start: this run stops, and its caller attaches to the
    /// recorded instance.
    #[error("the workflow was started elsewhere first")]
    Duplicate,
    /// The workflow must not start: returned by a body before the workflow's first commit (or raised by the
    /// guard of a statement phase that is that commit), it rolls the open phase back, nothing of the workflow is
    /// recorded, and the start is [`Error::Refused`]. After the first commit it fails the workflow like
    /// [`Interrupt::Failed`].
    #[error("refused: {0}")]
    Refused(Failure),
    /// Another worker holds the workflow now; this worker must stop touching it.
    #[error("the lease was lost")]
    LeaseLost,
    /// The engine is shutting down; the workflow was released for another worker.
    #[error("shut down")]
    Shutdown,
    /// A step was met under a key whose stored step has another name or kind: the code no longer matches
    /// the workflow's history. The workflow is parked `failed` for an operator, without compensation.
    #[error("step {step_key}: stored as {stored}, now run as {now}")]
    StepMismatch {
        /// The step key.
        step_key: String,
        /// Name and kind recorded in the database.
        stored: String,
        /// Name and kind the code ran it with.
        now: String,
    },
    /// The database failed; the workflow is released and retried later.
    #[error(transparent)]
    Engine(#[from] Error),
    /// Returned by a compensation that cannot undo its forward step's effect and ends the workflow by rolling it
    /// forward instead: the compensations after it do not run, the phase it left open (its own transactional
    /// steps, which made the effect the workflow's result) commits with the workflow's end, and the workflow ends
    /// `completed` with `output`, keeping `exception` (what could not be undone, and why it was kept) as its
    /// error, for operators. Only from [`crate::Workflow::compensate`]; a body that returns it completes alike.
    #[error("rolled forward: {exception}")]
    RolledForward {
        /// The workflow's output, as its body would have returned it.
        output: Value,
        /// Why the workflow rolled forward, kept as its error.
        exception: Failure,
    },
}

/// `f` as stored in a workflow's or step's `error` column.
pub(crate) fn failure_json(f: &Failure) -> String {
    serde_json::to_string(f).unwrap_or_else(|_| format!("{{\"code\":\"{}\"}}", f.code))
}

/// A stored `error` column read back as a failure (a plain message becomes one coded `failed`).
pub(crate) fn parse_failure(error: Option<&str>) -> Failure {
    error
        .and_then(|e| serde_json::from_str(e).ok())
        .unwrap_or_else(|| Failure::new("failed", error.unwrap_or("failed").to_owned()))
}

/// The wait before replaying a phase undone by a transient database error (times the replays so far).
pub(crate) const TRANSIENT_RETRY_MS: u64 = 10;

/// Whether a database error only means "run the transaction again": a deadlock or a lock-wait timeout
/// (MySQL 1213, 1205), a serialization failure or deadlock (Postgres 40001, 40P01), a busy SQLite database.
/// The database rolled the transaction back (or the caller will), so nothing of it happened.
pub fn is_transient(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1205 | 1213);
    }
    matches!(db.code().as_deref(), Some("40001" | "40P01" | "5" | "6" | "517"))
}

impl From<sqlx::Error> for Interrupt {
    fn from(e: sqlx::Error) -> Self {
        Self::Engine(Error::Database(e))
    }
}

impl From<Failure> for Interrupt {
    fn from(f: Failure) -> Self {
        Self::Failed(f)
    }
}
