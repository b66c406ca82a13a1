//! Statement phases: consecutive transactional steps written as SQL the store sends together with their commit's
//! bookkeeping in one call — on Postgres one statement (one round trip, no `BEGIN`/`COMMIT`), on SQLite one
//! multi-statement call to the writer's thread — instead of a transaction of several.

use std::sync::{Arc, LazyLock};

use crate::error::Failure;
use crate::step::StepSpec;
use crate::store::{StepKind, StepStatus};

/// A value bound to a statement phase's SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlArg {
    /// `text`.
    Text(String),
    /// `bigint`.
    Int(i64),
}

/// One step a statement phase records. Its SQL is shared text: a caller that builds the same phase for every
/// workflow builds the text once and clones it (a reference count) per phase.
#[derive(Debug, Clone)]
pub struct PhaseStep {
    pub(crate) spec: StepSpec,
    pub(crate) output: Arc<str>,
    pub(crate) when: Option<Arc<str>>,
    pub(crate) intent: bool,
}

impl PhaseStep {
    /// Records `spec` with the step output given by the SQL expression `output` (JSON text, as serde writes the
    /// step's output type).
    pub fn new(spec: impl Into<StepSpec>, output: impl Into<Arc<str>>) -> Self {
        Self { spec: spec.into(), output: output.into(), when: None, intent: false }
    }

    /// Commits the intent of the external step `spec` that the body runs next (its first attempt's row, and
    /// its compensation), sparing that step a commit of its own. The phase returns no output for it.
    pub fn intent(spec: impl Into<StepSpec>) -> Self {
        // One text for every intent, so that phases with intents share their text (see `StatementPhase`).
        static NULL: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("NULL"));
        Self { spec: spec.into(), output: NULL.clone(), when: None, intent: true }
    }

    /// Records the step only when the SQL boolean expression `condition` holds (as a step the body would not
    /// have reached); otherwise its output comes back as `None` and no row is written.
    pub fn when(mut self, condition: impl Into<Arc<str>>) -> Self {
        self.when = Some(condition.into());
        self
    }
}

/// Transactional steps as one call: their SQL, the steps they record and a guard. Built by a store-specific
/// module, since the SQL is the backend's dialect: on Postgres data-modifying common table expressions of one
/// statement; on SQLite statements run in order inside the commit's transaction, which record what they did in
/// [`crate::store::SQLITE_PHASE_FLAGS`] for the expressions after them. Run by
/// [`crate::WorkflowContext::statement_phase`]. Its SQL is shared text (see [`PhaseStep`]).
#[derive(Debug, Clone)]
pub struct StatementPhase {
    pub(crate) ctes: Arc<[String]>,
    pub(crate) args: Vec<SqlArg>,
    pub(crate) steps: Vec<PhaseStep>,
    pub(crate) guard: Option<(Arc<str>, Failure)>,
}

impl StatementPhase {
    /// A phase of `ctes` (Postgres: each `name AS (…)`, run as one statement; SQLite: statements; parameters
    /// `$1…` over `args`) recording `steps` in order.
    pub fn new(ctes: impl Into<Arc<[String]>>, args: Vec<SqlArg>, steps: Vec<PhaseStep>) -> Self {
        Self { ctes: ctes.into(), args, steps, guard: None }
    }

    /// Unless the SQL boolean expression `condition` holds, the whole statement rolls back (nothing of the
    /// phase is written) and its first step fails terminally with `failure`.
    pub fn guard(mut self, condition: impl Into<Arc<str>>, failure: Failure) -> Self {
        self.guard = Some((condition.into(), failure));
        self
    }

    /// The step keys it records, in order.
    pub(crate) fn keys(&self, prefix: &str) -> Vec<String> {
        self.steps.iter().map(|s| format!("{prefix}{}", s.spec.key)).collect()
    }

    /// The failure of a guard that did not hold.
    pub(crate) fn guard_failure(&self) -> Failure {
        self.guard
            .as_ref()
            .map_or_else(|| Failure::new("guard_failed", "the phase's guard did not hold"), |(_, f)| f.clone())
    }
}

/// A phase step's row as the store writes it (the output comes from the statement).
#[derive(Debug, Clone)]
pub struct PhaseRow<'a> {
    /// Step key (with the context's prefix).
    pub key: String,
    /// Step name.
    pub name: &'a str,
    /// Step kind.
    pub kind: StepKind,
    /// Step status.
    pub status: StepStatus,
    /// Attempts, counting this one.
    pub attempts: i32,
    /// Output expression.
    pub output: &'a str,
    /// Whether the step finished (else its `finished_at` stays empty).
    pub finished: bool,
    /// Condition for writing it.
    pub when: Option<&'a str>,
    /// Its place in the order the workflow ran its steps ([`crate::store::StepRecord::seq`]).
    pub seq: i32,
}

/// A statement phase as one commit writes it.
#[derive(Debug, Clone, Copy)]
pub struct PhaseCommit<'a> {
    /// The phase.
    pub phase: &'a StatementPhase,
    /// Its steps' rows, in the phase's order.
    pub rows: &'a [PhaseRow<'a>],
    /// Now (ms): the steps' start and finish.
    pub now: i64,
}
