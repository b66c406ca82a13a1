//! What operators see of a workflow (contracts/http-api.md, Operations), over HTTP and on the terminal
//! (`onceflow workflows show`): times as RFC 3339; input, output and errors as the JSON values they hold; without
//! the idempotency token (an operator needs the workflow, not the credential) and without the lease's internals.
//! Typed, so that `/openapi.json` describes these bodies from the same types that write them.
//!
//! Fields are declared in alphabetical order: these bodies were first written with `json!`, whose maps keep their
//! keys sorted, and the bytes clients have seen stay the same. A field that does not apply to the state shown is
//! absent rather than null or stale: a finished workflow has no next attempt and no lease, a running one no
//! output, a step without an error no `error`.

use std::borrow::Cow;

use onceflow_engine::WorkflowView;
use onceflow_engine::store::{
    CompensationRecord, CompensationStatus, StepKind, StepRecord, StepStatus, WorkflowRecord, WorkflowState,
};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::routes::orders::rfc3339;

/// The schema of a workflow's `state` (the engine's [`WorkflowState`], under its name): one of
/// [`WorkflowState::ALL`]'s texts. Built from the engine's list (rather than restated) so that the document and
/// the server cannot disagree on it.
pub struct WorkflowStateSchema;

impl PartialSchema for WorkflowStateSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(WorkflowState::ALL.map(WorkflowState::as_str)))
            .description(Some(
                "running (or waiting to run), compensating, completed, failed (every compensation has run), \
                 compensation_failed (an operator must look) or cancelled.",
            ))
            .into()
    }
}

impl ToSchema for WorkflowStateSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("WorkflowState")
    }
}

/// A workflow (`GET /v1/workflows` lists them; retry and cancel answer the one they changed).
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowBody {
    /// When it was created (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Why it failed: the JSON value stored (an older plain message stays a string); absent while it has not. On a
    /// `completed` workflow, an exception for operators: a compensation could not undo its step and the workflow
    /// rolled forward instead (a payment's `kept_after_failed_refund`: the charge kept, the payment succeeded).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub error: Value,
    /// Its input; a payment's idempotency token is shown as `***`.
    pub input: Value,
    /// Incremented on every claim by a worker.
    pub lease_epoch: i64,
    /// When the current claim ends (RFC 3339); absent when no worker holds it.
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
    /// Its workflow type (payments: `payment`).
    pub name: String,
    /// Not run again before this time (RFC 3339); only while it is running or compensating.
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// Its output once completed, absent before. A payment's is the stored response, its `body` shown as JSON.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub output: Value,
    /// Where it is.
    #[schema(value_type = WorkflowStateSchema)]
    pub state: WorkflowState,
    /// When it last changed (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Its id (payments: `pay:<token>`).
    pub workflow_id: String,
}

/// A step of a workflow.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepBody {
    /// Attempts started so far.
    pub attempts: i32,
    /// The last error: the JSON value stored (a plain message stays a string); absent when there was none.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub error: Value,
    /// When it completed or failed (RFC 3339); absent while it has not.
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// `transactional` (inside the workflow's transaction) or `external` (a call outside the database).
    #[schema(value_type = String)]
    pub kind: StepKind,
    /// Its output once completed, absent before.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub output: Value,
    /// When its first attempt started (RFC 3339).
    #[schema(format = DateTime)]
    pub started_at: String,
    /// `started`, `unknown`, `retrying`, `completed` or `failed`.
    #[schema(value_type = String)]
    pub status: StepStatus,
    /// Unique within the workflow.
    pub step_key: String,
    /// What the step does (the same name may run under several keys).
    pub step_name: String,
}

/// A compensation registered before its forward step ran.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompensationBody {
    /// Which compensation of the workflow type runs.
    pub name: String,
    /// Registration order; compensations run in reverse.
    pub seq: i32,
    /// `registered`, `done` or `failed`.
    #[schema(value_type = String)]
    pub status: CompensationStatus,
    /// The forward step it undoes.
    pub step_key: String,
}

/// What an unfinished workflow waits for: the external step (a payment's: the channel's charge, or a
/// compensation's close and refund) whose outcome it has yet to learn, or that it tries again.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitingForBody {
    /// The step's attempts so far.
    pub attempts: i32,
    /// When the workflow tries again by itself (RFC 3339); an operator may ask now
    /// (`POST /v1/workflows/{workflow_id}/query-channel`).
    #[schema(format = DateTime)]
    pub next_attempt_at: String,
    /// Why it waits: what its last attempt learnt (a charge or refund `processing`, a timeout, an answer that did
    /// not match what was asked), or that a call is in flight.
    pub reason: String,
    /// When the step's first attempt started (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
    /// `started` (a call in flight), `unknown` (its outcome to be found out) or `retrying`.
    #[schema(value_type = String)]
    pub status: StepStatus,
    /// The step (a compensation's as `compensate/<seq>/<step>`).
    pub step_key: String,
    /// What the step does.
    pub step_name: String,
}

/// A workflow with its steps, in the order they ran, and its compensations (`GET /v1/workflows/{id}`).
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowDetail {
    /// The operator actions taken on it, oldest first (the audit log: kept after its history is deleted).
    pub audit: Vec<crate::routes::audit::AuditBody>,
    /// Its registered compensations.
    pub compensations: Vec<CompensationBody>,
    /// Its steps, in the order they ran (a phase's steps share their times; the order is the one they ran in).
    pub steps: Vec<StepBody>,
    /// What it waits for, while it is running or compensating and waits on a call; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<WaitingForBody>,
    /// The workflow.
    pub workflow: WorkflowBody,
}

/// Why a workflow waits on `step`, in words: what its last attempt learnt, and whether a call is in flight.
fn reason(step: &StepRecord) -> String {
    let learnt = match json_value(step.error.as_deref()) {
        Value::Null => None,
        Value::String(message) => Some(message),
        error => Some(error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned)),
    };
    match (step.status, learnt) {
        (StepStatus::Started, Some(learnt)) => format!("{learnt} (asked again: attempt {} in flight)", step.attempts),
        (StepStatus::Started, None) => "a call is in flight (or the process making it stopped): its outcome is \
                                        found out before anything is done again"
            .to_owned(),
        (_, Some(learnt)) => learnt,
        (_, None) => "its last attempt's outcome is to be found out".to_owned(),
    }
}

/// A page of workflows, newest first (`GET /v1/workflows`).
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowPage {
    /// The next page's `before` (ms since the epoch), for older clients; null on the last page.
    #[schema(required = true)]
    pub next_before: Option<i64>,
    /// The next page's `cursor`; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    /// This page's workflows.
    pub workflows: Vec<WorkflowBody>,
}

/// A stored JSON column as the JSON value it holds (a plain message, as older errors are, stays a string).
fn json_value(stored: Option<&str>) -> Value {
    stored.map_or(Value::Null, |s| serde_json::from_str(s).unwrap_or_else(|_| json!(s)))
}

impl From<WorkflowRecord> for WorkflowBody {
    fn from(record: WorkflowRecord) -> Self {
        let mut input = json_value(Some(&record.input));
        if input.get("token").is_some() {
            input["token"] = json!("***");
        }
        let mut output = json_value(record.output.as_deref());
        // A payment's output is the response stored byte for byte, its body as text: shown as the JSON it is.
        if let Some(body) = output.get("body").and_then(|b| b.as_str()).and_then(|b| serde_json::from_str(b).ok()) {
            output["body"] = body;
        }
        Self {
            created_at: rfc3339(record.created_at),
            error: json_value(record.error.as_deref()),
            input,
            lease_epoch: record.lease_epoch,
            lease_expires_at: record.lease_expires_at.map(rfc3339),
            name: record.name,
            next_attempt_at: (!record.state.is_final()).then(|| rfc3339(record.next_attempt_at)),
            output,
            state: record.state,
            updated_at: rfc3339(record.updated_at),
            workflow_id: record.workflow_id,
        }
    }
}

impl From<StepRecord> for StepBody {
    fn from(step: StepRecord) -> Self {
        Self {
            attempts: step.attempts,
            error: json_value(step.error.as_deref()),
            finished_at: step.finished_at.map(rfc3339),
            kind: step.kind,
            output: json_value(step.output.as_deref()),
            started_at: rfc3339(step.started_at),
            status: step.status,
            step_key: step.step_key,
            step_name: step.step_name,
        }
    }
}

impl From<CompensationRecord> for CompensationBody {
    fn from(c: CompensationRecord) -> Self {
        Self { name: c.name, seq: c.seq, status: c.status, step_key: c.step_key }
    }
}

impl From<WorkflowView> for WorkflowDetail {
    fn from(view: WorkflowView) -> Self {
        let waiting_for = view.waiting_for().map(|step| WaitingForBody {
            attempts: step.attempts,
            next_attempt_at: rfc3339(view.workflow.next_attempt_at),
            reason: reason(step),
            since: rfc3339(step.started_at),
            status: step.status,
            step_key: step.step_key.clone(),
            step_name: step.step_name.clone(),
        });
        Self {
            audit: Vec::new(),
            compensations: view.compensations.into_iter().map(CompensationBody::from).collect(),
            steps: view.steps.into_iter().map(StepBody::from).collect(),
            waiting_for,
            workflow: view.workflow.into(),
        }
    }
}
