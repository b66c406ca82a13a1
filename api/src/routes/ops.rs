//! Operations: workflows (read, list, retry, cancel, query-channel), health, readiness, metrics, the OpenAPI
//! document.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use onceflow_engine::store::{Cursor, WorkflowFilter, WorkflowRecord, WorkflowState};
use onceflow_engine::{Woken, WorkflowView};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use onceflow_payments::PaymentStore;

use crate::error::ApiError;
use crate::routes::audit::{Reason, Subject, audited};
use crate::routes::views::{WorkflowBody, WorkflowDetail, WorkflowPage};
use crate::state::{AppState, Caller, may_scrape};
use crate::text::plain_opt;

/// How long a scrape waits for the database to answer `SELECT 1` before it reports it down.
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Filters of `GET /v1/workflows`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// running, compensating, completed, failed, compensation_failed or cancelled.
    pub state: Option<String>,
    /// The next page: the `next_cursor` of the previous one (exact, even for workflows created in the same
    /// millisecond). Takes precedence over `before`.
    #[param(pattern = r"^(0|[1-9][0-9]{0,17})\.([1-9a-f][0-9a-f]|0[1-9a-f]){0,255}$")]
    pub cursor: Option<String>,
    /// Only workflows created before this time (ms since the epoch): the `next_before` of the previous page.
    /// Kept for older clients: workflows sharing the millisecond of a page's last one are skipped; use `cursor`.
    pub before: Option<i64>,
    /// Page size (1–1000, default 50).
    pub limit: Option<i64>,
    /// Operators: only this tenant's workflows (a tenant key lists its own only, whatever it asks).
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub tenant: Option<String>,
    /// Only workflows of this type (`payment`, …).
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub name: Option<String>,
}

/// A cursor as clients see it: `<created_at>.<workflow id, hex>` (opaque to clients; documented by the pattern
/// of `cursor`).
fn encode_cursor(cursor: &Cursor) -> String {
    let id: String = cursor.workflow_id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{}.{id}", cursor.created_at)
}

/// A cursor in the shape `encode_cursor` writes; anything else is `None`. Every string of that shape is a
/// position in the list, whether or not this server wrote it: its id is read as text (bytes that are not UTF-8
/// as replacement characters), and a NUL byte, which no database takes in text, is refused.
fn decode_cursor(raw: &str) -> Option<Cursor> {
    let (created_at, hex) = raw.split_once('.')?;
    let digits_ok = created_at == "0" || (!created_at.starts_with('0') && (1..=18).contains(&created_at.len()));
    if !digits_ok || !created_at.bytes().all(|b| b.is_ascii_digit()) || !hex.len().is_multiple_of(2) || hex.len() > 510
    {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).filter(|h| !h.starts_with('+')).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    let bytes = bytes?;
    if bytes.contains(&0) || hex.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Some(Cursor { created_at: created_at.parse().ok()?, workflow_id: String::from_utf8_lossy(&bytes).into_owned() })
}

/// Whether `caller` may see `record`: operators (and the zero-configuration mode) every workflow; a tenant its
/// own, by the row's tenant — or, for a row written before it had one, the tenant named in its input.
fn visible(caller: &Caller, record: &WorkflowRecord) -> bool {
    let Some(tenant) = caller.tenant_scope() else { return true };
    match &record.tenant {
        Some(owner) => owner == tenant,
        None => serde_json::from_str::<serde_json::Value>(&record.input)
            .ok()
            .and_then(|v| v.get("tenant").and_then(|t| t.as_str()).map(|t| t == tenant))
            .unwrap_or(false),
    }
}

/// Retry, cancel and query-channel are for operators.
fn must_operate(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_operator() {
        Ok(())
    } else {
        Err(ApiError::forbidden("retry, cancel and query-channel take an operator key"))
    }
}

async fn visible_view<S: PaymentStore>(
    state: &AppState<S>,
    caller: &Caller,
    id: &str,
) -> Result<WorkflowView, ApiError> {
    // Another tenant's workflow is not found, as one that does not exist, and as fast: its id says nothing.
    match state.payments.engine().workflow_if(id, |w| visible(caller, w)).await? {
        Some(view) => Ok(view),
        _ => Err(ApiError::not_found("workflow_not_found", format!("no workflow {id}"))),
    }
}

/// A workflow, its state and every step with key, status, attempts and timings.
#[utoipa::path(get, path = "/v1/workflows/{workflow_id}", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow (payments: pay:<token>)")),
    responses(
        (status = 200, description = "The workflow with its steps and compensations", body = WorkflowDetail),
        (status = 404, description = "workflow_not_found (also another tenant's, for a tenant key)", body = crate::error::Problem),
    ))]
pub async fn get_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<WorkflowDetail>, ApiError> {
    let mut detail = WorkflowDetail::from(visible_view(&state, &caller, &id).await?).seen_by(&caller);
    detail.audit = crate::routes::audit::of_workflow(&state, &caller, &id).await?;
    Ok(Json(detail))
}

/// What an operator action on workflow `id` is about, for its audit entry: the workflow and its tenant.
async fn action_on<S: PaymentStore>(state: &AppState<S>, id: &str) -> Result<Subject, ApiError> {
    let Some(record) = state.payments.engine().store().workflow(id).await? else {
        return Err(ApiError::not_found("workflow_not_found", format!("no workflow {id}")));
    };
    let tenant = record.tenant.clone().or_else(|| {
        let input = serde_json::from_str::<serde_json::Value>(&record.input).ok()?;
        input.get("tenant")?.as_str().map(str::to_owned)
    });
    Ok(Subject { workflow_id: Some(record.workflow_id), other: None, tenant })
}

/// A page of workflows, newest first (by creation time, then workflow id): a tenant key's own, an operator's
/// of every tenant. `next_cursor` (and `next_before`) are set only when more workflows follow.
#[utoipa::path(get, path = "/v1/workflows", tag = "operations", params(ListQuery),
    responses(
        (status = 200, description = "A page of workflows, newest first", body = WorkflowPage),
        (status = 400, description = "invalid_request: an unknown state, a limit out of range, a cursor this server did not give, a control character in tenant or name", body = crate::error::Problem),
    ))]
pub async fn list_workflows<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<WorkflowPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let wanted = q.state.as_deref().map(str::parse::<WorkflowState>).transpose().map_err(|_| {
        ApiError::invalid(format!("state must be one of {}", WorkflowState::ALL.map(WorkflowState::as_str).join(", ")))
    })?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let after = match (&q.cursor, q.before) {
        (Some(raw), _) => {
            Some(decode_cursor(raw).ok_or_else(|| ApiError::invalid("cursor is not a next_cursor of this API"))?)
        }
        (None, Some(before)) => Some(Cursor::before_time(before)),
        (None, None) => None,
    };
    let tenant = caller.tenant_scope().or(plain_opt("tenant", q.tenant.as_deref())?);
    let name = plain_opt("name", q.name.as_deref())?;
    let filter = WorkflowFilter { tenant, state: wanted, after: after.as_ref(), name };
    // One row more than the page says whether another page follows, so that no empty page carries a cursor.
    let mut page = state.payments.engine().list(filter, limit + 1).await?;
    let more = page.len() as i64 > limit;
    page.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next = page.last().filter(|_| more).map(Cursor::after);
    let next_before = next.as_ref().map(|c| c.created_at);
    let next_cursor = next.as_ref().map(encode_cursor);
    let workflows = page.into_iter().map(|w| WorkflowBody::from(w).seen_by(&caller)).collect();
    Ok(Json(WorkflowPage { next_before, next_cursor, workflows }))
}

/// Retries a failed workflow (compensation_failed: its compensations; failed with nothing compensated: forward).
#[utoipa::path(post, path = "/v1/workflows/{workflow_id}/retry", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow")),
    request_body(content = Option<crate::routes::audit::ActionBody>, description = "Optional: why (kept in the audit log)"),
    responses(
        (status = 200, description = "Reopened", body = WorkflowBody),
        (status = 403, description = "forbidden: a tenant key (retry is for operators), or a browser's request for another site's page", body = crate::error::Problem),
        (status = 400, description = "invalid_request: a body that is not {\"reason\"}, a reason too long or with control characters", body = crate::error::Problem),
        (status = 415, description = "unsupported_media_type: not asked for as application/json (even without a body)", body = crate::error::Problem),
        (status = 404, description = "workflow_not_found", body = crate::error::Problem),
        (status = 409, description = "invalid_state", body = crate::error::Problem),
    ))]
pub async fn retry_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
    Reason(reason): Reason,
) -> Result<Json<WorkflowBody>, ApiError> {
    must_operate(&caller)?;
    let subject = action_on(&state, &id).await?;
    let engine = state.payments.engine().clone();
    let act = async move { Ok(engine.retry(&id).await?) };
    let done = audited(&state, &caller, "retry", subject, reason, act, 200, |w| format!("now {}", w.state)).await?;
    Ok(Json(done.into()))
}

/// Cancels a running workflow: any current run is fenced out and the compensations run.
#[utoipa::path(post, path = "/v1/workflows/{workflow_id}/cancel", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow")),
    request_body(content = Option<crate::routes::audit::ActionBody>, description = "Optional: why (kept in the audit log)"),
    responses(
        (status = 200, description = "Cancelling", body = WorkflowBody),
        (status = 403, description = "forbidden: a tenant key (cancel is for operators), or a browser's request for another site's page", body = crate::error::Problem),
        (status = 400, description = "invalid_request: a body that is not {\"reason\"}, a reason too long or with control characters", body = crate::error::Problem),
        (status = 415, description = "unsupported_media_type: not asked for as application/json (even without a body)", body = crate::error::Problem),
        (status = 404, description = "workflow_not_found", body = crate::error::Problem),
        (status = 409, description = "invalid_state", body = crate::error::Problem),
    ))]
pub async fn cancel_workflow<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
    Reason(reason): Reason,
) -> Result<Json<WorkflowBody>, ApiError> {
    must_operate(&caller)?;
    let subject = action_on(&state, &id).await?;
    let engine = state.payments.engine().clone();
    let act = async move { Ok(engine.cancel(&id).await?) };
    let done = audited(&state, &caller, "cancel", subject, reason, act, 200, |w| format!("now {}", w.state)).await?;
    Ok(Json(done.into()))
}

/// How long `query-channel` waits for the workflow to end after waking it, so that a channel that has settled
/// is seen settled in the answer.
const QUERY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The answer of `query-channel`: what the wake did, and the workflow as it is after it.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueryChannelBody {
    /// The reason given, if any.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// `claimed` (this process asks the channel now), `running` (the run here asks now, cutting its wait short)
    /// or `held_elsewhere` (another live process runs it, and asks within its next attempt).
    #[schema(value_type = String)]
    pub woken: Woken,
    /// The workflow a moment later (up to 2 s, until it ends): ended if the channel's answer settled it.
    pub workflow: WorkflowDetail,
}

/// Asks the channel now about what the workflow waits for — a payment's charge whose outcome is unknown or
/// `processing`, a compensation's close and refund — and settles it from the answer: the workflow's next attempt
/// is made at once (`Engine::wake`) rather than at its `next_attempt_at`. Operators only.
#[utoipa::path(post, path = "/v1/workflows/{workflow_id}/query-channel", tag = "operations",
    params(("workflow_id" = String, Path, description = "The workflow")),
    request_body(content = Option<crate::routes::audit::ActionBody>, description = "Optional: why (kept in the audit log)"),
    responses(
        (status = 200, description = "Woken; the workflow a moment later", body = QueryChannelBody),
        (status = 403, description = "forbidden: a tenant key (query-channel is for operators), or a browser's request for another site's page", body = crate::error::Problem),
        (status = 400, description = "invalid_request: a body that is not {\"reason\"}, a reason too long or with control characters", body = crate::error::Problem),
        (status = 415, description = "unsupported_media_type: not asked for as application/json (even without a body)", body = crate::error::Problem),
        (status = 404, description = "workflow_not_found", body = crate::error::Problem),
        (status = 409, description = "invalid_state: the workflow waits on no call (it ended, or is between steps)", body = crate::error::Problem),
    ))]
pub async fn query_channel<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
    Reason(reason): Reason,
) -> Result<Json<QueryChannelBody>, ApiError> {
    must_operate(&caller)?;
    let view = visible_view(&state, &caller, &id).await?;
    if view.waiting_for().is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_state",
            "Invalid state",
            format!("the workflow is {}: it waits on no call to ask about", view.workflow.state),
        ));
    }
    let subject = action_on(&state, &id).await?;
    let (engine, seen_by, shown) = (state.payments.engine().clone(), caller.clone(), reason.clone());
    let act = async move {
        let woken = engine.wake(&id).await?;
        engine.wait(&id, QUERY_WAIT).await?;
        let view = engine
            .workflow_if(&id, |w| visible(&seen_by, w))
            .await?
            .ok_or_else(|| ApiError::not_found("workflow_not_found", format!("no workflow {id}")))?;
        Ok(QueryChannelBody { reason: shown, woken, workflow: view.into() })
    };
    let said = |b: &QueryChannelBody| format!("woken ({}); now {}", woken_word(b.woken), b.workflow.workflow.state);
    let done = audited(&state, &caller, "query_channel", subject, reason, act, 200, said).await?;
    Ok(Json(done))
}

/// What a wake did, in the words of `woken`.
fn woken_word(woken: Woken) -> &'static str {
    match woken {
        Woken::Running => "running",
        Woken::Claimed => "claimed",
        Woken::HeldElsewhere => "held_elsewhere",
    }
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Up")))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// The database is reachable. A service charging the in-process mock channel says so (`channel`, `warning`).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready"), (status = 503, description = "unavailable", body = crate::error::Problem)))]
pub async fn readyz<S: PaymentStore>(State(state): State<AppState<S>>) -> Response {
    if state.payments.engine().ready().await {
        if state.mock_channel {
            return Json(json!({ "status": "ready", "channel": "mock", "warning": crate::run::MOCK_WARNING }))
                .into_response();
        }
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

/// Prometheus metrics: requests by route and status, latency histograms, whether the database answers, workflows
/// by state (counted in the background, with the time of the count), channel calls by outcome, unresolved
/// payments and refunds (how many, the oldest one's age), refunds by outcome. With keys configured, for operator keys
/// only.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format"),
    (status = 401, description = "unauthorized: no operator key (when keys are configured)", body = crate::error::Problem),
    (status = 403, description = "forbidden: a tenant key (when keys are configured)", body = crate::error::Problem),
))]
pub async fn metrics<S: PaymentStore>(State(state): State<AppState<S>>, headers: HeaderMap) -> Response {
    if let Err(refused) = may_scrape(&state, &headers) {
        return refused.into_response();
    }
    let engine = state.payments.engine();
    // One trivial query, bounded: a scrape while the database is down says so, quickly, instead of zeros.
    let up = matches!(tokio::time::timeout(PING_TIMEOUT, engine.ready()).await, Ok(true));
    // The engine's counts, read from memory (no scan of the workflow table per scrape; see
    // onceflow_engine's `counts.rs`). Written into the body rather than the process's recorder: they are this
    // service's, read now.
    let mut counts = engine.workflow_counts();
    // A process's first scrape has started its first count: worth waiting for, briefly, that once.
    let deadline = tokio::time::Instant::now() + PING_TIMEOUT;
    while up && counts.is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        counts = engine.workflow_counts();
    }
    let figures = database_figures(up, counts) + &group_commit_figures(engine.store().group_commit_counts());
    if up && let Ok((count, oldest)) = engine.store().unresolved().await {
        let age_ms = oldest.map_or(0, |created_at| (chrono::Utc::now().timestamp_millis() - created_at).max(0));
        metrics::gauge!("onceflow_unresolved_payments").set(count as f64);
        metrics::gauge!("onceflow_unresolved_payment_oldest_seconds").set(age_ms as f64 / 1000.0);
    }
    // Refunds beside payments: asked of the channel, their outcome unknown or processing.
    if up && let Ok((count, oldest)) = engine.store().unresolved_refunds().await {
        let age_ms = oldest.map_or(0, |created_at| (chrono::Utc::now().timestamp_millis() - created_at).max(0));
        metrics::gauge!("onceflow_unresolved_refunds").set(count as f64);
        metrics::gauge!("onceflow_unresolved_refund_oldest_seconds").set(age_ms as f64 / 1000.0);
    }
    let body = crate::metrics::render() + &figures;
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// `onceflow_database_up`, and the workflows by state with the time they were counted (absent until a first
/// count succeeded: absent, not zero), in Prometheus text format.
fn database_figures(up: bool, counts: Option<onceflow_engine::WorkflowCounts>) -> String {
    use std::fmt::Write;
    let mut text =
        String::from("# HELP onceflow_database_up Whether the database answered this scrape (1) or not (0)\n");
    let _ = writeln!(text, "# TYPE onceflow_database_up gauge\nonceflow_database_up {}", u8::from(up));
    if let Some(counts) = counts {
        text.push_str("# HELP onceflow_workflows Workflows by state, as last counted (see the timestamp)\n");
        text.push_str("# TYPE onceflow_workflows gauge\n");
        for (state, count) in &counts.by_state {
            let _ = writeln!(text, "onceflow_workflows{{state=\"{state}\"}} {count}");
        }
        text.push_str("# HELP onceflow_workflows_counted_timestamp_seconds When onceflow_workflows was counted\n");
        text.push_str("# TYPE onceflow_workflows_counted_timestamp_seconds gauge\n");
        let _ = writeln!(text, "onceflow_workflows_counted_timestamp_seconds {}", counts.counted_at as f64 / 1000.0);
    }
    text
}

/// The group commit's batches and the commits they held, since the process started (Postgres).
fn group_commit_figures((batches, members): (u64, u64)) -> String {
    format!(
        "# HELP onceflow_commit_batches_total Batches of commits sent in one transaction (group commit)\n\
         # TYPE onceflow_commit_batches_total counter\nonceflow_commit_batches_total {batches}\n\
         # HELP onceflow_commit_batched_total Commits answered by a batch (the rest went alone)\n\
         # TYPE onceflow_commit_batched_total counter\nonceflow_commit_batched_total {members}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_odd_ones_are_refused() {
        let cursor = Cursor { created_at: 1_700_000_000_000, workflow_id: "pay:ab.c".into() };
        assert_eq!(decode_cursor(&encode_cursor(&cursor)), Some(cursor));
        let empty = Cursor { created_at: 0, workflow_id: String::new() };
        assert_eq!(decode_cursor(&encode_cursor(&empty)), Some(empty));
        for bad in ["", ".", "x.61", "01.61", "-1.61", "1.6", "1.00", "1.6G", "1.+6", "1.6A", "1234567890123456789.61"]
        {
            assert_eq!(decode_cursor(bad), None, "{bad}");
        }
        // Any id the shape allows is a position, even one that is not UTF-8.
        assert_eq!(decode_cursor("5.ff").map(|c| c.workflow_id), Some("\u{fffd}".to_owned()));
    }
}
