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
use crate::state::Caller;

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
    /// Its registered compensations; none once it has completed without an exception and without running any
    /// (they never will).
    pub compensations: Vec<CompensationBody>,
    /// Its steps, in the order they ran (a phase's steps share their times; the order is the one they ran in).
    pub steps: Vec<StepBody>,
    /// What it waits for, while it is running or compensating and waits on a call; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<WaitingForBody>,
    /// The workflow.
    pub workflow: WorkflowBody,
}

/// Why a workflow waits on a step (its `status`, `attempts` and last `error`), in words: what its last attempt
/// learnt, and whether a call is in flight.
fn reason(status: StepStatus, attempts: i32, error: Value) -> String {
    let learnt = match error {
        Value::Null => None,
        Value::String(message) => Some(message),
        error => Some(error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned)),
    };
    match (status, learnt) {
        (StepStatus::Started, Some(learnt)) => format!("{learnt} (asked again: attempt {attempts} in flight)"),
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

/// How a tenant sees a workflow (issue 35): stable codes and generic details, never what the channel or the
/// infrastructure said — a step's error may name the channel's URL (`error sending request for url (…)`) or a
/// database's host, and a refused charge keeps the channel's raw body in the step's output. Operators (and the
/// zero-configuration mode) see everything. Allow-lists rather than deny-lists, so that what a new step stores
/// is hidden from tenants until it is known to be theirs.
mod tenant_view {
    use serde_json::{Map, Value, json};

    /// The strings of an external step's output a tenant sees, by key: identifiers and codes.
    const SHOWN: &[&str] = &[
        "charge_id",
        "refund_id",
        "decline_code",
        "code",
        "status",
        "currency",
        "order_no",
        "request_no",
        "refund_no",
        "merchant_request_no",
        "merchant_refund_no",
    ];

    /// What replaces what a tenant does not see.
    const HIDDEN: &str = "***";

    /// A stored error as a tenant sees it. A failure (`{code, message, details}`) keeps its code, and as message
    /// the detail of the answer it carries (which its client was given) or a generic one. A plain message keeps
    /// its leading words when they are only that (`unknown outcome: channel unreachable`, never the URL after
    /// them), else a generic one.
    pub(super) fn error(stored: Value) -> Value {
        match stored {
            Value::Null => Value::Null,
            Value::Object(failure) => {
                let code = failure.get("code").and_then(Value::as_str).filter(|c| is_code(c)).unwrap_or("failed");
                let answered = failure
                    .get("details")
                    .and_then(|d| d.get("answer"))
                    .and_then(|a| a.get("detail"))
                    .and_then(Value::as_str);
                json!({ "code": code, "message": answered.unwrap_or(GENERIC) })
            }
            Value::String(message) => Value::String(words(&message).unwrap_or_else(|| GENERIC.to_owned())),
            _ => Value::String(GENERIC.to_owned()),
        }
    }

    /// The generic message of an error a tenant does not see.
    const GENERIC: &str = "details are shown to operators";

    /// The leading `: `-separated parts of `message` (at most two) that are plain lower-case words.
    fn words(message: &str) -> Option<String> {
        let shown: Vec<&str> = message.split(": ").take(2).take_while(|part| is_words(part)).collect();
        (!shown.is_empty()).then(|| shown.join(": "))
    }

    fn is_words(part: &str) -> bool {
        (1..=40).contains(&part.len())
            && part.starts_with(|c: char| c.is_ascii_lowercase())
            && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b' ')
    }

    fn is_code(text: &str) -> bool {
        (1..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    }

    /// An external step's output as a tenant sees it: its shape (keys, variant names) and numbers stay; strings
    /// stay only under [`SHOWN`] keys and when they are identifier-like.
    pub(super) fn output(stored: Value) -> Value {
        match stored {
            // A unit variant (`"Refunded"`).
            Value::String(s) if is_code(&s) => Value::String(s),
            Value::String(_) => Value::String(HIDDEN.to_owned()),
            Value::Object(map) => Value::Object(object(map)),
            other => scrub(other, false),
        }
    }

    fn object(map: Map<String, Value>) -> Map<String, Value> {
        map.into_iter()
            .map(|(key, value)| {
                let shown = SHOWN.contains(&key.as_str());
                let value = match value {
                    Value::Object(inner) => Value::Object(object(inner)),
                    other => scrub(other, shown),
                };
                (key, value)
            })
            .collect()
    }

    /// A value under a key: strings shown only where `shown` and identifier-like.
    fn scrub(value: Value, shown: bool) -> Value {
        match value {
            Value::String(s) if shown && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()) => Value::String(s),
            Value::String(_) => Value::String(HIDDEN.to_owned()),
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::Object(inner) => Value::Object(object(inner)),
                        other => scrub(other, shown),
                    })
                    .collect(),
            ),
            Value::Object(inner) => Value::Object(object(inner)),
            other => other,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn errors_keep_codes_and_plain_words_only() {
            let url = json!("unknown outcome: channel unreachable: error sending request for url (http://10.0.0.1/x)");
            assert_eq!(error(url), json!("unknown outcome: channel unreachable"));
            assert_eq!(error(json!("error sending request for url (http://h/)")), json!(GENERIC));
            assert_eq!(error(json!("refused by the channel (422): {\"ip\": \"10.0.0.1\"}")), json!(GENERIC));
            assert_eq!(error(json!("unknown outcome: close answered {\"a\":1}")), json!("unknown outcome"));
            let summary = json!("unknown outcome: channel answered 503");
            assert_eq!(error(summary.clone()), summary);
            assert_eq!(
                error(json!("database error: password authentication failed for user x")),
                json!("database error")
            );
            let failure = json!({"code": "retries_exhausted", "message": "step x: database error: host db.internal", "details": {"x": 1}});
            assert_eq!(error(failure), json!({"code": "retries_exhausted", "message": GENERIC}));
            let answered = json!({"code": "channel_refused", "message": "m", "details": {"answer": {"detail": "refused; nothing charged"}}});
            assert_eq!(error(answered), json!({"code": "channel_refused", "message": "refused; nothing charged"}));
            assert_eq!(error(Value::Null), Value::Null);
        }

        #[test]
        fn outputs_keep_shape_and_identifiers() {
            let refused =
                json!({"Refused": {"status": 422, "body": "{\"acquirer\":\"10.20.30.40\"}", "after_unknown": false}});
            assert_eq!(output(refused), json!({"Refused": {"status": 422, "body": HIDDEN, "after_unknown": false}}));
            let charged = json!({"Charged": {"charge_id": "ch_1"}});
            assert_eq!(output(charged.clone()), charged);
            assert_eq!(output(json!("Refunded")), json!("Refunded"));
            assert_eq!(output(json!("http://10.0.0.1")), json!(HIDDEN));
            assert_eq!(output(json!({"code": "a b c"})), json!({"code": HIDDEN}));
            assert_eq!(output(json!({"list": ["x", 1]})), json!({"list": [HIDDEN, 1]}));
        }
    }
}

impl WorkflowBody {
    /// What `caller` may see of it: a tenant, the stable codes and generic details of its error (see
    /// `tenant_view`); everyone else, all of it.
    pub fn seen_by(mut self, caller: &Caller) -> Self {
        if caller.tenant_scope().is_some() {
            self.error = tenant_view::error(std::mem::take(&mut self.error));
        }
        self
    }
}

impl WorkflowDetail {
    /// What `caller` may see of it: a tenant, the stable codes and generic details of every error and only the
    /// identifiers and codes of what external steps (the channel's calls) returned (see `tenant_view`);
    /// everyone else, all of it.
    pub fn seen_by(mut self, caller: &Caller) -> Self {
        if caller.tenant_scope().is_some() {
            self.workflow = self.workflow.seen_by(caller);
            for step in &mut self.steps {
                step.error = tenant_view::error(std::mem::take(&mut step.error));
                if step.kind == StepKind::External {
                    step.output = tenant_view::output(std::mem::take(&mut step.output));
                }
            }
            // The reason is told from the step's error: a tenant's, from what it sees of that error.
            if let Some(wait) = &mut self.waiting_for {
                let error = self.steps.iter().find(|s| s.step_key == wait.step_key).map(|s| s.error.clone());
                wait.reason = reason(wait.status, wait.attempts, error.unwrap_or(Value::Null));
            }
        }
        self
    }
}

impl From<WorkflowView> for WorkflowDetail {
    fn from(view: WorkflowView) -> Self {
        let waiting_for = view.waiting_for().map(|step| WaitingForBody {
            attempts: step.attempts,
            next_attempt_at: rfc3339(view.workflow.next_attempt_at),
            reason: reason(step.status, step.attempts, json_value(step.error.as_deref())),
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
