//! Operations: workflows, health, readiness, metrics, the OpenAPI document.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use onceflow_engine::WorkflowView;
use onceflow_engine::store::{Cursor, StepRecord, WorkflowFilter, WorkflowRecord};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use onceflow_payments::PaymentStore;

use crate::error::ApiError;
use crate::state::{AppState, Auth, Tenant};

pub(crate) const WORKFLOW_STATES: [&str; 6] =
    ["running", "compensating", "completed", "failed", "compensation_failed", "cancelled"];

/// Filters of `GET /v1/workflows`.
#[derive(Debug, Deserialize, IntoParams)]
pub struct ListQuery {
    /// running, compensating, completed, failed, compensation_failed or cancelled.
    pub state: Option<String>,
    /// Only workflows created before this time (ms since the epoch): the next page.
    pub before: Option<i64>,
    /// Page size (1–1000, default 50).
    pub limit: Option<i64>,
}

/// A workflow belongs to the tenant named in its input; with a single tenant every workflow is visible.
fn visible<S: PaymentStore>(state: &AppState<S>, tenant: &str, record: &WorkflowRecord) -> bool {
    match state.auth {
        Auth::SingleTenant => true,
        Auth::Keys(_) => serde_json::from_str::<serde_json::Value>(&record.input)
            .ok()
            .and_then(|v| v.get("tenant").and_then(|t| t.as_str()).map(|t| t == tenant))
            .unwrap_or(false),
    }
}

/// A stored JSON column as the JSON value it holds (a plain message, as older errors are, stays a string).
fn json_value(stored: Option<&str>) -> serde_json::Value {
    stored.map_or(serde_json::Value::Null, |s| serde_json::from_str(s).unwrap_or_else(|_| json!(s)))
}

/// A time of the store (ms since the epoch) as RFC 3339.
fn time(ms: i64) -> serde_json::Value {
    json!(crate::routes::orders::rfc3339(ms))
}

/// A workflow as operators see it (contracts/http-api.md): times as RFC 3339, input, output and error as JSON
/// values; without the idempotency token (an operator needs the workflow, not the credential) and without the
/// lease's internals.
pub(crate) fn redacted(record: WorkflowRecord) -> serde_json::Value {
    let mut input = json_value(Some(&record.input));
    if input.get("token").is_some() {
        input["token"] = json!("***");
    }
    let mut output = json_value(record.output.as_deref());
    // A payment's output is the response stored byte for byte, its body as text: shown as the JSON it is.
    if let Some(body) = output.get("body").and_then(|b| b.as_str()).and_then(|b| serde_json::from_str(b).ok()) {
        output["body"] = body;
    }
    json!({
        "workflow_id": record.workflow_id,
        "name": record.name,
        "state": record.state,
        "input": input,
        "output": output,
        "error": json_value(record.error.as_deref()),
        "lease_expires_at": record.lease_expires_at.map(time),
        "lease_epoch": record.lease_epoch,
        "next_attempt_at": time(record.next_attempt_at),
        "created_at": time(record.created_at),
        "updated_at": time(record.updated_at),
    })
}

/// A step as operators see it: times as RFC 3339, output and error as JSON values.
pub(crate) fn step_view(step: StepRecord) -> serde_json::Value {
    json!({
        "step_key": step.step_key,
        "step_name": step.step_name,
        "kind": step.kind,
        "status": step.status,
        "attempts": step.attempts,
        "output": json_value(step.output.as_deref()),
        "error": json_value(step.error.as_deref()),
        "started_at": time(step.started_at),
        "finished_at": step.finished_at.map(time),
    })
}

async fn visible_view<S: PaymentStore>(state: &AppState<S>, tenant: &str, id: &str) -> Result<WorkflowView, ApiError> {
    match state.payments.engine().workflow(id).await? {
        Some(view) if visible(state, tenant, &view.workflow) => Ok(view),
        _ => Err(ApiError::not_found("workflow_not_found", format!("no workflow {id}"))),
    }
}

/// A workflow, its state and every step with key, status, attempts and timings.
#[utoipa::path(get, path = "/v1/workflows/{workflow_id}", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow (payments: pay:<token>)")),
    responses(
        (status = 200, description = "The workflow with its steps and compensations"),
        (status = 404, description = "workflow_not_found", body = crate::openapi::Problem),
    ))]
pub async fn get_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let view = visible_view(&state, &tenant, &id).await?;
    Ok(Json(json!({
        "workflow": redacted(view.workflow),
        "steps": view.steps.into_iter().map(step_view).collect::<Vec<_>>(),
        "compensations": view.compensations.into_iter().map(|c| json!({
            "seq": c.seq, "step_key": c.step_key, "name": c.name, "status": c.status,
        })).collect::<Vec<_>>(),
    })))
}

/// A page of workflows, newest first.
#[utoipa::path(get, path = "/v1/workflows", tag = "operations", params(ListQuery),
    responses((status = 200, description = "{\"workflows\": [...], \"next_before\": ms or null}")))]
pub async fn list_workflows<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Query(q): Query<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(s) = &q.state
        && !WORKFLOW_STATES.contains(&s.as_str())
    {
        return Err(ApiError::invalid(format!("state must be one of {}", WORKFLOW_STATES.join(", "))));
    }
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let before = q.before.map(Cursor::before_time);
    let filter = WorkflowFilter { state: q.state.as_deref(), after: before.as_ref(), ..Default::default() };
    let page = state.payments.engine().list(filter, limit).await?;
    let next_before = (page.len() as i64 == limit).then(|| page.last().map(|w| w.created_at)).flatten();
    let workflows: Vec<_> = page.into_iter().filter(|w| visible(&state, &tenant, w)).map(redacted).collect();
    Ok(Json(json!({ "workflows": workflows, "next_before": next_before })))
}

/// Retries a failed workflow (compensation_failed: its compensations; failed with nothing compensated: forward).
#[utoipa::path(post, path = "/v1/workflows/{workflow_id}/retry", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow")),
    responses(
        (status = 200, description = "Reopened"),
        (status = 404, description = "workflow_not_found", body = crate::openapi::Problem),
        (status = 409, description = "invalid_state", body = crate::openapi::Problem),
    ))]
pub async fn retry_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    visible_view(&state, &tenant, &id).await?;
    Ok(Json(redacted(state.payments.engine().retry(&id).await?)))
}

/// Cancels a running workflow: any current run is fenced out and the compensations run.
#[utoipa::path(post, path = "/v1/workflows/{workflow_id}/cancel", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow")),
    responses(
        (status = 200, description = "Cancelling"),
        (status = 404, description = "workflow_not_found", body = crate::openapi::Problem),
        (status = 409, description = "invalid_state", body = crate::openapi::Problem),
    ))]
pub async fn cancel_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    visible_view(&state, &tenant, &id).await?;
    Ok(Json(redacted(state.payments.engine().cancel(&id).await?)))
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Up")))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// The database is reachable.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready"), (status = 503, description = "unavailable", body = crate::openapi::Problem)))]
pub async fn readyz<S: PaymentStore>(State(state): State<AppState<S>>) -> Response {
    if state.payments.engine().ready().await {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            "the database is unreachable",
        )
        .into_response()
    }
}

/// Prometheus metrics: requests by route and status, latency histograms, workflows by state, channel calls by
/// outcome, unresolved payments (how many, the oldest one's age).
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format")))]
pub async fn metrics<S: PaymentStore>(State(state): State<AppState<S>>) -> Response {
    let counts = match state.payments.engine().workflow_counts() {
        Some(counts) => counts.by_state,
        None => state.payments.engine().refresh_counts().await.map(|c| c.by_state).unwrap_or_default(),
    };
    for (workflow_state, count) in counts {
        metrics::gauge!("onceflow_workflows", "state" => workflow_state).set(count as f64);
    }
    if let Ok((count, oldest)) = state.payments.engine().store().unresolved().await {
        let age_ms = oldest.map_or(0, |created_at| (chrono::Utc::now().timestamp_millis() - created_at).max(0));
        metrics::gauge!("onceflow_unresolved_payments").set(count as f64);
        metrics::gauge!("onceflow_unresolved_payment_oldest_seconds").set(age_ms as f64 / 1000.0);
    }
    let body = crate::metrics::render();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3.1")))]
pub async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}
