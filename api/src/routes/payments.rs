//! `POST /v1/payments` (with `Idempotency-Key`) and `GET /v1/payments/{request_no}`.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use onceflow_payments::{PayRequest, PayResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, json_response};
use crate::extract::unsupported_media_type;
use crate::state::{AppState, Tenant};

/// Longest `Prefer: wait=N` honoured, in seconds.
const MAX_WAIT_SECS: u64 = 60;

/// A payment request. The idempotency token goes in the `Idempotency-Key` header (or, for the original
/// design's clients, in `token`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {
    /// The order to pay.
    pub order_no: String,
    /// Minor units; must equal the order's.
    #[serde(deserialize_with = "crate::extract::integral")]
    pub amount: i64,
    /// ISO 4217; must equal the order's.
    pub currency: String,
    /// The payment's number; derived from the token when absent.
    #[serde(default)]
    pub request_no: Option<String>,
    /// The idempotency token, when not sent as `Idempotency-Key`.
    #[serde(default)]
    pub token: Option<String>,
}

/// A payment.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PaymentBody {
    /// The payment's number.
    pub request_no: String,
    /// The order.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// `processing`, `succeeded`, `declined` or `failed`.
    pub status: String,
    /// The channel's charge id, once charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// Why the channel declined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// The workflow that runs the payment (`GET /v1/workflows/{workflow_id}`); on `GET` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
}

/// Checks an `Idempotency-Key`: 1–128 characters of `A-Z a-z 0-9 _ -`.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()).is_some_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
    })
}

/// The wait asked for by `Prefer: wait=N` (seconds), else the server's default.
fn wait_of(headers: &HeaderMap, default: Duration) -> Duration {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .find_map(|p| p.trim().strip_prefix("wait=").and_then(|n| n.trim().parse::<u64>().ok()))
        .map_or(default, |secs| Duration::from_secs(secs.min(MAX_WAIT_SECS)))
}

/// The token of a payment request: the header, else the body's `token`.
pub(crate) fn token_of(headers: &HeaderMap, body_token: Option<&str>) -> Result<String, ApiError> {
    let raw = match headers.get("idempotency-key") {
        Some(v) => v.to_str().map_err(|_| key_invalid())?.to_owned(),
        None => body_token.map(str::to_owned).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "idempotency_key_missing",
                "Idempotency key missing",
                "send the token from POST /v1/tokens as the Idempotency-Key header",
            )
        })?,
    };
    if valid_key(&raw) { Ok(raw) } else { Err(key_invalid()) }
}

fn key_invalid() -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "idempotency_key_invalid",
        "Idempotency key invalid",
        "the Idempotency-Key must be 1-128 characters of A-Z a-z 0-9 _ -",
    )
}

/// Writes a payment answer: problem+json for errors, `Idempotent-Replayed` and `Location` when they apply.
pub(crate) fn pay_response(r: PayResponse) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, r.body, r.status >= 400);
    if r.replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if let Some(location) = r.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// Pays an order, exactly once per token, whatever happens.
#[utoipa::path(post, path = "/v1/payments", request_body = PaymentRequest, tag = "payments",
    params(
        ("Idempotency-Key" = String, Header, description = "Token from POST /v1/tokens: 1-128 characters of A-Z a-z 0-9 _ -"),
        ("Prefer" = Option<String>, Header, description = "wait=N: seconds to wait for a final result (max 60)"),
    ),
    responses(
        (status = 201, description = "Charged", body = PaymentBody),
        (status = 202, description = "Not final within the wait window (Location: /v1/payments/{request_no})", body = PaymentBody),
        (status = 400, description = "idempotency_key_missing, idempotency_key_invalid or invalid_request", body = crate::openapi::Problem),
        (status = 401, description = "unauthorized", body = crate::openapi::Problem),
        (status = 402, description = "payment_declined (with decline_code); stored and replayed", body = crate::openapi::Problem),
        (status = 404, description = "token_not_found or order_not_found", body = crate::openapi::Problem),
        (status = 409, description = "order_not_payable or request_no_conflict; stored", body = crate::openapi::Problem),
        (status = 413, description = "payload_too_large", body = crate::openapi::Problem),
        (status = 415, description = "unsupported_media_type", body = crate::openapi::Problem),
        (status = 422, description = "idempotency_key_mismatch, or amount_mismatch (stored)", body = crate::openapi::Problem),
        (status = 503, description = "unavailable (Retry-After); not stored", body = crate::openapi::Problem),
    ))]
pub async fn pay(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !is_json(&headers) {
        return Err(unsupported_media_type());
    }
    let parsed: Result<PaymentRequest, _> = serde_json::from_slice(&body);
    let token = token_of(&headers, parsed.as_ref().ok().and_then(|r| r.token.as_deref()))?;
    let request = parsed.map_err(|e| ApiError::invalid(format!("invalid body: {e}")))?;
    let pay = PayRequest {
        order_no: request.order_no,
        amount: request.amount,
        currency: request.currency,
        request_no: request.request_no,
    };
    let wait = wait_of(&headers, state.wait);
    let response = state.backend.pay(&tenant, &token, "/v1/payments", &pay, wait).await?;
    Ok(pay_response(response))
}

/// One payment of the caller's tenant, in its current status.
#[utoipa::path(get, path = "/v1/payments/{request_no}", tag = "payments",
    params(("request_no" = String, Path, description = "The payment's number")),
    responses(
        (status = 200, description = "The payment", body = PaymentBody),
        (status = 404, description = "payment_not_found", body = crate::openapi::Problem),
    ))]
pub async fn get_payment(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(request_no): Path<String>,
) -> Result<Json<PaymentBody>, ApiError> {
    let Some(p) = state.backend.payment(&tenant, &request_no).await? else {
        return Err(ApiError::not_found("payment_not_found", format!("payment {request_no} does not exist")));
    };
    Ok(Json(PaymentBody {
        request_no: p.request_no,
        order_no: p.order_no,
        amount: p.amount,
        currency: p.currency,
        status: p.status,
        charge_id: p.charge_id,
        decline_code: p.decline_code,
        workflow_id: Some(onceflow_payments::payment_workflow_id(&p.token)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_waits_parse() {
        assert!(valid_key("tok_abc-DEF_123"));
        assert!(!valid_key(""));
        assert!(!valid_key("tok abc"));
        assert!(!valid_key(&"a".repeat(129)));
        let mut h = HeaderMap::new();
        h.insert("prefer", HeaderValue::from_static("respond-async, wait=3"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(3));
        h.insert("prefer", HeaderValue::from_static("wait=999"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(60));
    }
}
