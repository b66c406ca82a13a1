//! One error type for the HTTP API: an explicit status per case, written as problem+json (RFC 9457). Bodies
//! of 5xx answers never carry internal text; the cause is logged once, here.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// A problem (RFC 9457), the shape of every error.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:onceflow:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// This occurrence.
    pub detail: String,
    /// Stable, machine-readable: invalid_request, idempotency_key_missing, idempotency_key_invalid,
    /// idempotency_key_mismatch, token_not_found, order_not_found, order_conflict, order_not_payable,
    /// amount_mismatch, request_no_conflict, payment_declined, payment_not_found, payment_not_refundable,
    /// refund_exceeds_payment, refund_no_conflict, refund_failed, refund_not_found, workflow_not_found,
    /// invalid_state, event_not_found, endpoint_not_found, endpoint_disabled, endpoint_limit, webhook_url_refused,
    /// cursor_expired, notification_unverified, reconciliation_not_found, unauthorized, forbidden, not_found,
    /// method_not_allowed, payload_too_large, request_timeout, unsupported_media_type, unavailable, internal.
    pub code: String,
    /// With `payment_declined`: the channel's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
}

/// An error answered as `application/problem+json` with a stable `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// Short summary.
    pub title: &'static str,
    /// What happened in this case (never internal text on 5xx).
    pub detail: String,
}

impl ApiError {
    /// An error with these parts.
    pub fn new(status: StatusCode, code: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self { status, code, title, detail: detail.into() }
    }

    /// `400 invalid_request`.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", "Invalid request", detail)
    }

    /// `403 forbidden`: the caller's role may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// `404` with a code.
    pub fn not_found(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, "Not found", detail)
    }

    /// `503 unavailable`, logging the cause with its chain of sources.
    pub fn unavailable(cause: &dyn std::error::Error) -> Self {
        tracing::error!(error = %chain(cause), "storage unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            "storage is unavailable; retry later",
        )
    }

    /// `500 internal`, logging the cause with its chain of sources.
    pub fn internal(cause: &dyn std::error::Error) -> Self {
        tracing::error!(error = %chain(cause), "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", "an internal error occurred")
    }
}

/// `e` and every source under it, `: `-separated, for the log (each message once).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        // An error that shows its source in its own message (`database error: {0}`) is not repeated.
        let message = s.to_string();
        if !text.ends_with(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = s.source();
    }
    text
}

/// A JSON body answered with a content type and optional extra headers.
pub(crate) fn json_response(status: StatusCode, body: String, problem: bool) -> Response {
    let content_type = if problem { "application/problem+json" } else { "application/json" };
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = onceflow_payments::problem(self.status.as_u16(), self.code, self.title, &self.detail);
        let mut response = json_response(self.status, body, true);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<onceflow_payments::Error> for ApiError {
    fn from(e: onceflow_payments::Error) -> Self {
        match e {
            onceflow_payments::Error::Invalid(invalid) => Self::invalid(invalid.to_string()),
            onceflow_payments::Error::OrderConflict(order_no) => Self::new(
                StatusCode::CONFLICT,
                "order_conflict",
                "Order conflict",
                format!("order {order_no} exists with other fields"),
            ),
            other => Self::unavailable(&other),
        }
    }
}

impl From<onceflow_engine::Error> for ApiError {
    fn from(e: onceflow_engine::Error) -> Self {
        match e {
            onceflow_engine::Error::NotFound(id) => Self::not_found("workflow_not_found", format!("no workflow {id}")),
            onceflow_engine::Error::InvalidState { state, reason, .. } => Self::new(
                StatusCode::CONFLICT,
                "invalid_state",
                "Invalid state",
                format!("the workflow is {state}: {reason}"),
            ),
            e @ onceflow_engine::Error::Database(_) => Self::unavailable(&e),
            other => Self::internal(&other),
        }
    }
}

impl From<onceflow_payments::events::EventError> for ApiError {
    fn from(e: onceflow_payments::events::EventError) -> Self {
        use onceflow_payments::events::EventError;
        match e {
            EventError::EndpointNotFound(_) => Self::not_found("endpoint_not_found", e.to_string()),
            EventError::EventNotFound(_) => Self::not_found("event_not_found", e.to_string()),
            EventError::UrlRefused(refusal) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "webhook_url_refused",
                "Webhook URL refused",
                format!("{refusal} (rule: {})", refusal.rule()),
            ),
            EventError::CursorExpired => Self::new(StatusCode::GONE, "cursor_expired", "Cursor expired", e.to_string()),
            EventError::TooManyEndpoints => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "endpoint_limit", "Too many endpoints", e.to_string())
            }
            EventError::EndpointDisabled(_) => {
                Self::new(StatusCode::CONFLICT, "endpoint_disabled", "Endpoint disabled", e.to_string())
            }
            other => Self::unavailable(&other),
        }
    }
}
