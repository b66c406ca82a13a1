//! The audit log of operator actions (contracts/http-api.md, Operations): the reason an action takes, the
//! wrapper that records an action before it runs and its answer after, and `GET /v1/audit`.
//!
//! Every action route calls [`audited`] around what it does: retry and cancel here; the channel query and an
//! event's redelivery the same way.

use std::future::Future;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{HeaderMap, header};
use onceflow_engine::AuditAction;
use onceflow_engine::store::AuditRecord;
use onceflow_payments::PaymentStore;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::extract::unsupported_media_type;
use crate::routes::orders::rfc3339;
use crate::state::{AppState, Caller};

/// Longest reason kept, in characters.
pub const MAX_REASON: usize = 500;

/// The optional body of an operator action.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// Why (at most 500 characters): kept in the audit log with the action.
    #[schema(max_length = 500)]
    pub reason: Option<String>,
}

/// An action's reason, read from its optional JSON body (`{"reason": "…"}`; no body: none).
pub struct Reason(pub Option<String>);

impl<S: Send + Sync> FromRequest<S> for Reason {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(req.headers());
        let body =
            Bytes::from_request(req, state).await.map_err(|_| ApiError::invalid("the body could not be read"))?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(None));
        }
        if !json {
            return Err(unsupported_media_type());
        }
        // `null` is no body too (the document's body is optional, which JSON Schema says as nullable).
        let parsed: Option<ActionBody> =
            serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))?;
        match parsed.unwrap_or_default().reason {
            Some(reason) if reason.chars().count() > MAX_REASON => {
                Err(ApiError::invalid(format!("reason must be at most {MAX_REASON} characters")))
            }
            reason => Ok(Self(reason.filter(|r| !r.trim().is_empty()))),
        }
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()).is_some_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
    })
}

/// Who `caller` is, as the audit log names them.
pub fn actor(caller: &Caller) -> String {
    match caller {
        Caller::Local => "local".to_owned(),
        Caller::Operator(name) => name.clone(),
        Caller::Tenant(tenant) => format!("tenant:{tenant}"),
    }
}

/// What an action is about: its workflow (and the tenant it belongs to), or something else it names.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// The workflow acted on.
    pub workflow_id: Option<String>,
    /// Another thing it names (an event's id).
    pub other: Option<String>,
    /// Whose it is.
    pub tenant: Option<String>,
}

/// Runs the operator action `act` on the record: an audit entry is written first (an action that cannot be
/// recorded is not taken: `503`), then completed with the answer — `said` in words on success, the problem's
/// status, code and detail on refusal. An entry left without an answer means the process died midway.
pub async fn audited<S: PaymentStore, T>(
    state: &AppState<S>,
    caller: &Caller,
    action: &str,
    subject: Subject,
    reason: Option<String>,
    act: impl Future<Output = Result<T, ApiError>>,
    said: impl FnOnce(&T) -> String,
) -> Result<T, ApiError> {
    let engine = state.payments.engine();
    let entry = AuditAction {
        actor: actor(caller),
        action: action.to_owned(),
        workflow_id: subject.workflow_id,
        subject: subject.other,
        tenant: subject.tenant,
        reason,
    };
    let id = engine.audit_begin(entry).await?;
    let answer = act.await;
    let (status, result) = match &answer {
        Ok(done) => (200, said(done)),
        Err(e) => (e.status.as_u16(), format!("{}: {}", e.code, e.detail)),
    };
    if let Err(e) = engine.audit_end(&id, status, &result).await {
        // The action happened: its answer stands; the entry shows none (as after a crash).
        tracing::warn!(audit_id = %id, error = %e, "could not record an operator action's answer");
    }
    answer
}

/// One operator action as the audit log keeps it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditBody {
    /// What: retry, cancel, query_channel, redeliver.
    pub action: String,
    /// Who: an operator key's name, `local` (no keys configured), `cli:<user>` (the terminal).
    pub actor: String,
    /// When it was asked for (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    /// The entry's id.
    pub id: String,
    /// Why, as the operator said; absent when no reason was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What came of it; absent while it runs, or when its process died before it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The answer's HTTP status; absent as `result` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<i32>,
    /// What else it names (an event's id for a redelivery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Whose workflow or event it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The workflow acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
}

impl From<AuditRecord> for AuditBody {
    fn from(r: AuditRecord) -> Self {
        Self {
            action: r.action,
            actor: r.actor,
            at: rfc3339(r.at),
            id: r.id,
            reason: r.reason,
            result: r.result,
            status: r.status,
            subject: r.subject,
            tenant: r.tenant,
            workflow_id: r.workflow_id,
        }
    }
}

/// The query of `GET /v1/audit`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// One workflow's entries, oldest first (kept after its history is deleted); absent: the newest entries.
    pub workflow_id: Option<String>,
    /// Operators: only this tenant's entries (a tenant key always reads its own only).
    pub tenant: Option<String>,
    /// How many (1–1000, default 100).
    pub limit: Option<i64>,
}

/// Audit entries (`GET /v1/audit`).
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditList {
    /// A workflow's entries oldest first; without `workflow_id`, the newest first.
    pub audit: Vec<AuditBody>,
}

/// The audit log of operator actions: a workflow's entries (kept after its history is deleted), or the newest.
/// A tenant key reads the entries of its own tenant's workflows and events only.
#[utoipa::path(get, path = "/v1/audit", tag = "operations", params(AuditQuery),
    responses(
        (status = 200, description = "Audit entries", body = AuditList),
        (status = 400, description = "invalid_request: a limit out of range", body = crate::error::Problem),
    ))]
pub async fn list_audit<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<AuditList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=onceflow_engine::MAX_AUDIT).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let tenant = caller.tenant_scope().map(str::to_owned).or(q.tenant);
    let entries = state.payments.engine().audit(q.workflow_id.as_deref(), tenant.as_deref(), limit).await?;
    Ok(Json(AuditList { audit: entries.into_iter().map(AuditBody::from).collect() }))
}

/// A workflow's audit entries as its view shows them, oldest first (for a tenant key, its own tenant's).
pub async fn of_workflow<S: PaymentStore>(
    state: &AppState<S>,
    caller: &Caller,
    workflow_id: &str,
) -> Result<Vec<AuditBody>, ApiError> {
    let entries =
        state.payments.engine().audit(Some(workflow_id), caller.tenant_scope(), onceflow_engine::MAX_AUDIT).await?;
    Ok(entries.into_iter().map(AuditBody::from).collect())
}
