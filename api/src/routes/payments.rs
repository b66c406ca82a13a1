//! `POST /v1/payments` (with `Idempotency-Key`), `GET /v1/payments/{request_no}` and `GET /v1/payments?order_no=`.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use onceflow_payments::{Currency, OrderNo, PayResponse, PaymentBody, PaymentRequest, PaymentStore, RequestNo, Token};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, json_response};
use crate::extract::unsupported_media_type;
use crate::state::{AppState, Tenant};

/// Longest `Prefer: wait=N` honoured, in seconds.
const MAX_WAIT_SECS: u64 = 60;

/// A [`PaymentRequest`] as `POST /v1/payments` receives it (the document's `PaymentRequest`), checked field by
/// field as it is read. The idempotency token goes in the `Idempotency-Key` header (or, for the original
/// design's clients, in `token`).
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = PaymentRequest)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequestBody {
    /// The order to pay.
    pub order_no: OrderNo,
    /// Minor units; must equal the order's.
    #[serde(deserialize_with = "crate::extract::integral")]
    #[schema(minimum = 1)]
    pub amount: i64,
    /// ISO 4217; must equal the order's.
    pub currency: Currency,
    /// The payment's number; derived from the token when absent.
    #[serde(default)]
    pub request_no: Option<RequestNo>,
    /// The idempotency token, when not sent as `Idempotency-Key` (checked only when it is the one used).
    #[serde(default)]
    #[schema(value_type = Option<Token>)]
    pub token: Option<String>,
}

/// The body's `token` alone, read from a body that is otherwise invalid: a request's token is checked before its
/// fields, wherever it is sent.
#[derive(Deserialize)]
struct TokenOnly {
    #[serde(default)]
    token: Option<String>,
}

pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()).is_some_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
    })
}

/// The wait asked for by `Prefer: wait=N` (seconds), else the server's default.
pub(crate) fn wait_of(headers: &HeaderMap, default: Duration) -> Duration {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .find_map(|p| p.trim().strip_prefix("wait=").and_then(|n| n.trim().parse::<u64>().ok()))
        .map_or(default, |secs| Duration::from_secs(secs.min(MAX_WAIT_SECS)))
}

/// The token of a payment request: the header, else the body's `token`.
pub(crate) fn token_of(headers: &HeaderMap, body_token: Option<&str>) -> Result<Token, ApiError> {
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
    Token::parse(raw).map_err(|_| key_invalid())
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
#[utoipa::path(post, path = "/v1/payments", request_body = PaymentRequestBody, tag = "payments",
    params(
        ("Idempotency-Key" = String, Header, description = "Token from POST /v1/tokens: 1-128 characters of A-Z a-z 0-9 _ -"),
        ("Prefer" = Option<String>, Header, description = "wait=N: seconds to wait for a final result (max 60)"),
    ),
    responses(
        (status = 201, description = "Charged", body = PaymentBody),
        (status = 202, description = "Not final within the wait window (Location: /v1/payments/{request_no})", body = PaymentBody),
        (status = 400, description = "idempotency_key_missing, idempotency_key_invalid or invalid_request", body = crate::error::Problem),
        (status = 401, description = "unauthorized", body = crate::error::Problem),
        (status = 402, description = "payment_declined (with decline_code); stored and replayed", body = crate::error::Problem),
        (status = 404, description = "token_not_found or order_not_found", body = crate::error::Problem),
        (status = 409, description = "order_not_payable or request_no_conflict; stored", body = crate::error::Problem),
        (status = 413, description = "payload_too_large", body = crate::error::Problem),
        (status = 415, description = "unsupported_media_type", body = crate::error::Problem),
        (status = 422, description = "idempotency_key_mismatch, or amount_mismatch (stored)", body = crate::error::Problem),
        (status = 503, description = "unavailable (Retry-After); not stored", body = crate::error::Problem),
    ))]
pub async fn pay<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !is_json(&headers) {
        return Err(unsupported_media_type());
    }
    let parsed: Result<PaymentRequestBody, _> = serde_json::from_slice(&body);
    let body_token = match &parsed {
        Ok(request) => request.token.clone(),
        Err(_) => serde_json::from_slice::<TokenOnly>(&body).ok().and_then(|b| b.token),
    };
    let token = token_of(&headers, body_token.as_deref())?;
    let request = parsed.map_err(|e| ApiError::invalid(format!("invalid body: {e}")))?;
    let pay = PaymentRequest::new(request.order_no, request.amount, request.currency, request.request_no)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let wait = wait_of(&headers, state.wait);
    let response = state.payments.pay(&tenant, &token, "/v1/payments", &pay, wait).await?;
    Ok(pay_response(response))
}

/// One payment of the caller's tenant, in its current status.
#[utoipa::path(get, path = "/v1/payments/{request_no}", tag = "payments",
    params(("request_no" = String, Path, description = "The payment's number")),
    responses(
        (status = 200, description = "The payment", body = PaymentBody),
        (status = 404, description = "payment_not_found", body = crate::error::Problem),
    ))]
pub async fn get_payment<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(request_no): Path<String>,
) -> Result<Json<PaymentBody>, ApiError> {
    let missing = || ApiError::not_found("payment_not_found", format!("payment {request_no} does not exist"));
    // A number that is not valid names no payment.
    let Ok(number) = RequestNo::parse(request_no.as_str()) else { return Err(missing()) };
    let Some(p) = state.payments.payment(&tenant, &number).await? else { return Err(missing()) };
    Ok(Json(p.view()))
}

/// The query of `GET /v1/payments`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PaymentsQuery {
    /// The order whose payments to list.
    // Required, but read as optional so that its absence is answered as a problem (400 invalid_request).
    #[param(required = true)]
    pub order_no: Option<String>,
}

/// Every payment attempt of an order (`GET /v1/payments?order_no=`).
#[derive(Debug, Serialize, ToSchema)]
pub struct PaymentList {
    /// Newest first; empty for an order without payments (or not the caller's).
    pub payments: Vec<PaymentBody>,
}

/// Every payment attempt of one of the caller's orders, newest first (what support asks first).
#[utoipa::path(get, path = "/v1/payments", tag = "payments", params(PaymentsQuery),
    responses(
        (status = 200, description = "The order's payments, newest first; none for an order without payments (or not the tenant's)", body = PaymentList),
        (status = 400, description = "invalid_request: order_no missing or invalid", body = crate::error::Problem),
        (status = 403, description = "forbidden: an operator key (payments are a tenant's)", body = crate::error::Problem),
    ))]
pub async fn list_payments<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    query: Result<Query<PaymentsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PaymentList>, ApiError> {
    // A query it cannot read is a problem too, as every error is.
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let raw = q.order_no.ok_or_else(|| ApiError::invalid("order_no is required"))?;
    let order_no = OrderNo::parse(raw).map_err(|e| ApiError::invalid(e.to_string()))?;
    let payments = state.payments.payments_of_order(&tenant, &order_no).await?.iter().map(|p| p.view()).collect();
    Ok(Json(PaymentList { payments }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_waits_parse() {
        let mut h = HeaderMap::new();
        h.insert("prefer", HeaderValue::from_static("respond-async, wait=3"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(3));
        h.insert("prefer", HeaderValue::from_static("wait=999"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(60));
    }
}
