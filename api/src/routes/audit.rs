//! The audit log of operator actions (contracts/http-api.md, Operations): the reason an action takes, the
//! wrapper that records an action before it runs and its answer after, and `GET /v1/audit`.
//!
//! Every action route — retry, cancel, query-channel (`ops.rs`) and an event's redelivery (`events.rs`) —
//! reads its body with [`ActionJson`] (JSON only, from this server's own pages) and calls [`audited`] around
//! what it does.

use std::future::Future;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use onceflow_engine::AuditAction;
use onceflow_engine::store::AuditRecord;
use onceflow_payments::PaymentStore;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::extract::{payload_too_large, unsupported_media_type};
use crate::routes::orders::rfc3339;
use crate::state::{AppState, Caller};
use crate::text::plain_opt;

/// Longest reason kept, in characters.
pub const MAX_REASON: usize = 500;

/// The optional body of an operator action.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// Why (at most 500 characters, no control characters but line breaks and tabs): kept in the audit log with
    /// the action.
    #[schema(max_length = 500, pattern = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$")]
    pub reason: Option<String>,
}

/// An operator action's optional JSON body, asked for by this server's own page or by a client that is no
/// browser. Without keys (loopback, no key to prove anything) a page of any other site could otherwise make the
/// browser post an action to the service (a form's or a `no-cors` fetch's request needs no permission): so an
/// action is taken only when
///
/// - a body, when it has one, says `Content-Type: application/json`, which no page of another origin can send
///   without the browser asking this server first, and this server allows no other origin (`415` otherwise); a
///   request without a body (the contract's retry or cancel as a plain `POST`) carries nothing a form could
///   forge, and a browser's cross-site one is refused by the next rule;
/// - its `Sec-Fetch-Site`, when the browser sends one, is `same-origin` or `none` (`same-site` is refused too: a
///   page on another port of `localhost` is the same site), and its `Origin`, when sent, is this server's own:
///   the host it was asked for (`Host`, or behind a proxy `X-Forwarded-Host`) (`403` otherwise).
///
/// No body (or `null`) is `T::default()`.
pub struct ActionJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for ActionJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        from_this_site(&req)?;
        let json = is_json(req.headers());
        let body = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                payload_too_large()
            } else {
                ApiError::invalid("the body could not be read")
            }
        })?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        if !json {
            return Err(unsupported_media_type());
        }
        // `null` is no body too (the document's body is optional, which JSON Schema says as nullable).
        let parsed: Option<T> =
            serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))?;
        Ok(Self(parsed.unwrap_or_default()))
    }
}

/// `403` for a request a browser sent for a page of another origin (see [`ActionJson`]).
fn from_this_site(req: &Request) -> Result<(), ApiError> {
    let refused = || ApiError::forbidden("operator actions are taken only for this server's own pages");
    if let Some(site) = req.headers().get("sec-fetch-site") {
        let site = site.to_str().unwrap_or_default().trim().to_ascii_lowercase();
        if site != "same-origin" && site != "none" {
            return Err(refused());
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().map_err(|_| refused())?.trim();
        let authority =
            origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")).ok_or_else(refused)?;
        // HTTP/2 names the host in the request target, HTTP/1.1 in `Host`.
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_owned))
            .ok_or_else(refused)?;
        // Behind a proxy that names the upstream in `Host`, the name the browser used is in `X-Forwarded-Host`: a
        // header no page of another origin can set on a request it sends unasked.
        let forwarded = req
            .headers()
            .get("x-forwarded-host")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(str::trim);
        if !authority.eq_ignore_ascii_case(&host) && !forwarded.is_some_and(|f| authority.eq_ignore_ascii_case(f)) {
            return Err(refused());
        }
    }
    Ok(())
}

/// An action's reason as given: at most [`MAX_REASON`] characters, no control character but line breaks and
/// tabs (`400`); blank is none.
pub fn reason(given: Option<String>) -> Result<Option<String>, ApiError> {
    match given {
        Some(reason) if reason.chars().count() > MAX_REASON => {
            Err(ApiError::invalid(format!("reason must be at most {MAX_REASON} characters")))
        }
        Some(reason) => {
            crate::text::reason(&reason)?;
            Ok(Some(reason).filter(|r| !r.trim().is_empty()))
        }
        None => Ok(None),
    }
}

/// An action's reason, read from its optional JSON body (`{"reason": "…"}`; no body: none), as [`ActionJson`]
/// reads it.
pub struct Reason(pub Option<String>);

impl<S: Send + Sync> FromRequest<S> for Reason {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let ActionJson(body) = ActionJson::<ActionBody>::from_request(req, state).await?;
        Ok(Self(reason(body.reason)?))
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
/// recorded is not taken: `503`), then completed with the answer — `said` in words on success (with `status`),
/// the problem's status, code and detail on refusal. The action and the entry's completion run in a task of
/// their own: a client that goes away mid-action (its request's future dropped) stops neither, so the action is
/// taken to its end and on the record. An entry left without an answer means the process died midway.
#[allow(clippy::too_many_arguments)]
pub async fn audited<S: PaymentStore, T: Send + 'static>(
    state: &AppState<S>,
    caller: &Caller,
    action: &str,
    subject: Subject,
    reason: Option<String>,
    act: impl Future<Output = Result<T, ApiError>> + Send + 'static,
    status: u16,
    said: impl FnOnce(&T) -> String + Send + 'static,
) -> Result<T, ApiError> {
    let engine = state.payments.engine().clone();
    let entry = AuditAction {
        actor: actor(caller),
        action: action.to_owned(),
        workflow_id: subject.workflow_id,
        subject: subject.other,
        tenant: subject.tenant,
        reason,
    };
    let id = engine.audit_begin(entry).await?;
    let task = tokio::spawn(async move {
        let answer = act.await;
        let (status, result) = match &answer {
            Ok(done) => (status, said(done)),
            Err(e) => (e.status.as_u16(), format!("{}: {}", e.code, e.detail)),
        };
        if let Err(e) = engine.audit_end(&id, status, &result).await {
            // The action happened: its answer stands; the entry shows none (as after a crash).
            tracing::warn!(audit_id = %id, error = %e, "could not record an operator action's answer");
        }
        answer
    });
    task.await.map_err(|e| ApiError::internal(&e))?
}

/// One operator action as the audit log keeps it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditBody {
    /// What: retry, cancel, query_channel, redeliver.
    pub action: String,
    /// Who: an operator key's name, `local` (no keys configured), `cli:<user>` (the terminal), `tenant:<name>`
    /// (a tenant's own redelivery). Operators only: absent for a tenant key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// When it was asked for (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    /// The entry's id.
    pub id: String,
    /// Why, as the operator said; absent when no reason was given, and for a tenant key.
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

impl AuditBody {
    /// The entry as `caller` may read it: a tenant key sees what was done to its own, and what came of it, but
    /// not who did it nor why (an operator's name and words are the operators').
    pub fn seen_by(mut self, caller: &Caller) -> Self {
        if caller.tenant_scope().is_some() {
            self.actor = None;
            self.reason = None;
        }
        self
    }
}

impl From<AuditRecord> for AuditBody {
    fn from(r: AuditRecord) -> Self {
        Self {
            action: r.action,
            actor: Some(r.actor),
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
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub workflow_id: Option<String>,
    /// Operators: only this tenant's entries (a tenant key always reads its own only).
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
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
        (status = 400, description = "invalid_request: a limit out of range, a control character in workflow_id or tenant", body = crate::error::Problem),
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
    let workflow_id = plain_opt("workflow_id", q.workflow_id.as_deref())?;
    let tenant = caller.tenant_scope().or(plain_opt("tenant", q.tenant.as_deref())?);
    let entries = state.payments.engine().audit(workflow_id, tenant, limit).await?;
    Ok(Json(AuditList { audit: entries.into_iter().map(|e| AuditBody::from(e).seen_by(&caller)).collect() }))
}

/// A workflow's audit entries as its view shows them, oldest first (for a tenant key, its own tenant's).
pub async fn of_workflow<S: PaymentStore>(
    state: &AppState<S>,
    caller: &Caller,
    workflow_id: &str,
) -> Result<Vec<AuditBody>, ApiError> {
    let entries =
        state.payments.engine().audit(Some(workflow_id), caller.tenant_scope(), onceflow_engine::MAX_AUDIT).await?;
    Ok(entries.into_iter().map(|e| AuditBody::from(e).seen_by(caller)).collect())
}
