//! The HTTP API's routes, their error shapes for unknown routes and methods, and the layers around them.

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
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
mod host;
pub mod notifications;
pub mod ops;
pub mod orders;
mod paths;
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
    // Without keys, only loopback names (`routes/host.rs`); with keys, each client proves itself.
    let loopback_only = matches!(state.auth, crate::state::Auth::SingleTenant);
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
        // Before the body is read: a path that names nothing, a host that is not ours.
        .layer(middleware::from_fn(paths::name_something))
        .layer(middleware::from_fn(move |req: Request, next: Next| async move {
            if loopback_only { host::loopback_only(req, next).await } else { next.run(req).await }
        }))
        .layer(middleware::map_response(close_unauthenticated))
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

/// A client without a valid key (`401`) or naming another host (`421`) keeps no connection: it is answered with
/// `Connection: close`. Held idle between cheap refused requests, such connections pushed legitimate clients'
/// out when the server made room for new ones (`server.rs`).
async fn close_unauthenticated(mut response: Response) -> Response {
    if matches!(response.status(), StatusCode::UNAUTHORIZED | StatusCode::MISDIRECTED_REQUEST) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
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

/// The request counter's `method` label: the methods HTTP defines, every other one `other`. Labels are kept for
/// the life of the process, and a method is whatever a client sends before any key is checked: labelled as
/// sent, each invented method (200,000 characters, say) was a new series for good.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// An error answered by axum itself in `text/plain` (a path or query its extractors could not read), as a
/// problem like every other error; `None` for every other response.
fn plain_error_as_problem(response: &Response) -> Option<Response> {
    let status = response.status();
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return None;
    }
    let error = match status {
        StatusCode::NOT_FOUND => ApiError::not_found("not_found", "no such resource"),
        StatusCode::PAYLOAD_TOO_LARGE => crate::extract::payload_too_large(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => crate::extract::unsupported_media_type(),
        s if s.is_client_error() => {
            ApiError::new(s, "invalid_request", "Invalid request", "the request could not be read")
        }
        s => ApiError::new(s, "internal", "Internal error", "an internal error occurred"),
    };
    Some(axum::response::IntoResponse::into_response(error))
}

/// Counts requests by method, route and status and times them; a body over the limit, and any error axum
/// answered in plain text, is answered as a problem.
async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(req.method());
    let started = std::time::Instant::now();
    let mut response = next.run(req).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE
        && response.headers().get(axum::http::header::CONTENT_TYPE).is_none_or(|v| v != "application/problem+json")
    {
        response = axum::response::IntoResponse::into_response(crate::extract::payload_too_large());
    }
    if let Some(problem) = plain_error_as_problem(&response) {
        response = problem;
    }
    let elapsed: Duration = started.elapsed();
    let status = response.status().as_u16().to_string();
    metrics::counter!("onceflow_http_requests_total", "method" => method, "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("onceflow_http_request_duration_seconds", "route" => route).record(elapsed.as_secs_f64());
    response
}
