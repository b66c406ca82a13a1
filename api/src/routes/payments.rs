//! `POST /v1/payments` (with `Idempotency-Key`), `GET /v1/payments/{request_no}` and `GET /v1/payments?order_no=`.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use onceflow_payments::{
    Currency, OrderNo, PayResponse, PaymentBody, PaymentCursor, PaymentRequest, PaymentStore, RequestNo, Token,
};
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

/// Payments a page of `GET /v1/payments` holds when the request does not say.
const DEFAULT_PAGE: i64 = 100;
/// The most a page of `GET /v1/payments` holds.
const MAX_PAGE: i64 = 1000;

/// The query of `GET /v1/payments`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PaymentsQuery {
    /// The order whose payments to list.
    // Required, but read as optional so that its absence is answered as a problem (400 invalid_request).
    #[param(required = true)]
    pub order_no: Option<String>,
    /// The next page: the `next_cursor` of the previous one.
    #[param(pattern = r"^(0|[1-9][0-9]{0,17})\.[A-Za-z0-9._:-]{1,64}$")]
    pub cursor: Option<String>,
    /// Page size (1–1000, default 100).
    pub limit: Option<i64>,
}

/// A page of an order's payment attempts (`GET /v1/payments?order_no=`).
#[derive(Debug, Serialize, ToSchema)]
pub struct PaymentList {
    /// Newest first; empty for an order without payments (or not the caller's).
    pub payments: Vec<PaymentBody>,
    /// The next page's `cursor`; null on the last page (an answer without it, as older versions gave, is every
    /// payment).
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// A cursor as clients see it: `<created_at>.<request_no>` (opaque to clients; documented by the pattern of
/// `cursor`).
fn encode_cursor(cursor: &PaymentCursor) -> String {
    format!("{}.{}", cursor.created_at, cursor.request_no)
}

/// A cursor in the shape `encode_cursor` writes (the pattern of `cursor`); anything else is `None`. Every string of
/// that shape is a position in the list, whether or not this server wrote it (`.` and `..` too, which name no
/// payment).
fn decode_cursor(raw: &str) -> Option<PaymentCursor> {
    let (created_at, request_no) = raw.split_once('.')?;
    let digits_ok = created_at == "0" || (!created_at.starts_with('0') && (1..=18).contains(&created_at.len()));
    let number_ok = (1..=64).contains(&request_no.len())
        && request_no.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if !digits_ok || !created_at.bytes().all(|b| b.is_ascii_digit()) || !number_ok {
        return None;
    }
    Some(PaymentCursor { created_at: created_at.parse().ok()?, request_no: request_no.to_owned() })
}

/// The payment attempts of one of the caller's orders, newest first (what support asks first), a page at a time:
/// `next_cursor` is set only when more follow. Every refused attempt is a record kept for good, so an order may
/// have any number of them.
#[utoipa::path(get, path = "/v1/payments", tag = "payments", params(PaymentsQuery),
    responses(
        (status = 200, description = "A page of the order's payments, newest first; none for an order without payments (or not the tenant's)", body = PaymentList),
        (status = 400, description = "invalid_request: order_no missing or invalid, a limit out of range, a cursor this server did not give", body = crate::error::Problem),
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
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let after = match &q.cursor {
        Some(raw) => {
            Some(decode_cursor(raw).ok_or_else(|| ApiError::invalid("cursor is not a next_cursor of this API"))?)
        }
        None => None,
    };
    // One row more than the page says whether another page follows, so that no empty page carries a cursor.
    let mut page = state.payments.payments_of_order_page(&tenant, &order_no, after.as_ref(), limit + 1).await?;
    let more = page.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    page.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_cursor = page
        .last()
        .filter(|_| more)
        .map(|p| encode_cursor(&PaymentCursor { created_at: p.created_at, request_no: p.request_no.to_string() }));
    Ok(Json(PaymentList { payments: page.iter().map(|p| p.view()).collect(), next_cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_odd_ones_are_refused() {
        let cursor = PaymentCursor { created_at: 1_700_000_000_000, request_no: "R.1:a-b".into() };
        assert_eq!(decode_cursor(&encode_cursor(&cursor)), Some(cursor));
        for bad in ["", ".", "1.", ".R", "01.R", "-1.R", "x.R", "1.R 1", "1.R/1", "1234567890123456789.R"] {
            assert_eq!(decode_cursor(bad), None, "{bad}");
        }
        // Any position the pattern allows, even one no payment can have.
        assert_eq!(decode_cursor("0..").map(|c| c.request_no), Some(".".to_owned()));
        assert_eq!(decode_cursor(&format!("5.{}", "R".repeat(65))), None);
    }

    #[test]
    fn keys_and_waits_parse() {
        let mut h = HeaderMap::new();
        h.insert("prefer", HeaderValue::from_static("respond-async, wait=3"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(3));
        h.insert("prefer", HeaderValue::from_static("wait=999"));
        assert_eq!(wait_of(&h, Duration::from_secs(10)), Duration::from_secs(60));
    }
}
