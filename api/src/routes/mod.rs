//! The HTTP API's routes, their error shapes for unknown routes and methods, and the layers around them.

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use onceflow_payments::PaymentStore;

use crate::state::AppState;

pub mod audit;
mod body;
pub mod compat;
pub mod events;
pub mod notifications;
pub mod ops;
pub mod orders;
pub mod payments;
pub mod reconciliations;
pub mod refunds;
pub mod search;
pub mod tokens;
pub mod unresolved;
pub mod views;
pub mod webhooks;
pub mod whoami;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

/// The HTTP API's routes over `state`, with `more` (what the modules above the routes serve: the document, the
/// console) merged in, inside the same layers.
pub(crate) fn app<S: PaymentStore>(state: AppState<S>, more: Router<AppState<S>>) -> Router {
    crate::metrics::install();
    let request_id = HeaderName::from_static("x-request-id");
    let body_read_timeout = state.body_read_timeout;
    Router::new()
        .route("/v1/orders", post(orders::create_order::<S>))
        .route("/v1/orders/{order_no}", get(orders::get_order::<S>))
        .route("/v1/tokens", post(tokens::issue_token::<S>))
        .route("/v1/payments", post(payments::pay::<S>).get(payments::list_payments::<S>))
        .route("/v1/payments/{request_no}", get(payments::get_payment::<S>))
        .route("/v1/payments/{request_no}/refunds", post(refunds::refund::<S>).get(refunds::list_refunds::<S>))
        .route("/v1/refunds/{refund_no}", get(refunds::get_refund::<S>))
        .route("/tokens", post(compat::legacy_token::<S>))
        .route("/pay", post(compat::legacy_pay::<S>))
        .route("/v1/workflows", get(ops::list_workflows::<S>))
        .route("/v1/workflows/{workflow_id}", get(ops::get_workflow::<S>))
        .route("/v1/workflows/{workflow_id}/retry", post(ops::retry_workflow::<S>))
        .route("/v1/workflows/{workflow_id}/cancel", post(ops::cancel_workflow::<S>))
        .route("/v1/events", get(events::list_events::<S>))
        .route("/v1/events/{event_id}", get(events::get_event::<S>))
        .route("/v1/events/{event_id}/redeliver", post(events::redeliver::<S>))
        .route("/v1/webhook-endpoints", post(webhooks::create_endpoint::<S>).get(webhooks::list_endpoints::<S>))
        .route(
            "/v1/webhook-endpoints/{endpoint_id}",
            get(webhooks::get_endpoint::<S>)
                .patch(webhooks::update_endpoint::<S>)
                .delete(webhooks::delete_endpoint::<S>),
        )
        .route("/v1/webhook-endpoints/{endpoint_id}/rotate-secret", post(webhooks::rotate_secret::<S>))
        .route("/v1/webhook-endpoints/{endpoint_id}/deliveries", get(webhooks::list_attempts::<S>))
        .route("/v1/channel/notifications", post(notifications::take::<S>))
        .route("/v1/reconciliations", get(reconciliations::list::<S>))
        .route("/v1/audit", get(audit::list_audit::<S>))
        .route("/v1/search", get(search::search::<S>))
        .route("/v1/unresolved", get(unresolved::unresolved::<S>))
        .route("/v1/whoami", get(whoami::whoami))
        .route("/v1/workflows/{workflow_id}/query-channel", post(ops::query_channel::<S>))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz::<S>))
        .route("/metrics", get(ops::metrics::<S>))
        .merge(more)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Innermost: a body is read (within its time) before any route sees it, inside the request id, the trace
        // and the request count, which then cover a `408` too.
        .layer(middleware::from_fn(move |req: Request, next: Next| body::read_within(body_read_timeout, req, next)))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(track))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
            let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
            let span =
                tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id);
            // A caller's W3C trace context: this request, and the workflow it starts, join that trace.
            let parent = req.headers().get("traceparent").and_then(|v| v.to_str().ok());
            onceflow_engine::trace::adopt(&span, parent);
            span
        }))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "Method not allowed",
        "this route does not take that method",
    )
}

/// Counts requests by route and status and times them; a body over the limit is answered as a problem.
async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().to_string();
    let started = std::time::Instant::now();
    let mut response = next.run(req).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE
        && response.headers().get(axum::http::header::CONTENT_TYPE).is_none_or(|v| v != "application/problem+json")
    {
        response = axum::response::IntoResponse::into_response(crate::extract::payload_too_large());
    }
    let elapsed: Duration = started.elapsed();
    let status = response.status().as_u16().to_string();
    metrics::counter!("onceflow_http_requests_total", "method" => method, "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("onceflow_http_request_duration_seconds", "route" => route).record(elapsed.as_secs_f64());
    response
}
