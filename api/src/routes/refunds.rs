//! `POST /v1/payments/{request_no}/refunds` (with `Idempotency-Key`), `GET /v1/payments/{request_no}/refunds` and
//! `GET /v1/refunds/{refund_no}`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use onceflow_payments::{NewRefund, PaymentStore, RefundBody, RefundNo, RequestNo};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::extract::unsupported_media_type;
use crate::routes::payments::{is_json, pay_response, token_of, wait_of};
use crate::state::{AppState, Tenant};

/// A [`NewRefund`] as `POST /v1/payments/{request_no}/refunds` receives it (the document's `RefundRequest`),
/// checked field by field as it is read.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = RefundRequest)]
#[serde(deny_unknown_fields)]
pub struct RefundRequestBody {
    /// Minor units: all of what is left to refund, or a part of it.
    #[serde(deserialize_with = "crate::extract::integral")]
    #[schema(minimum = 1)]
    pub amount: i64,
    /// The refund's number, unique per tenant forever; derived from the token when absent.
    #[serde(default)]
    pub refund_no: Option<RefundNo>,
    /// Why, in the merchant's words (at most 500 characters, no control characters but line breaks and tabs).
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$")]
    pub reason: Option<String>,
}

/// Every refund of a payment (`GET /v1/payments/{request_no}/refunds`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundList {
    /// Newest first; empty for a payment without refunds.
    pub refunds: Vec<RefundBody>,
}

fn payment_not_found(request_no: &str) -> ApiError {
    ApiError::not_found("payment_not_found", format!("payment {request_no} does not exist"))
}

/// Refunds a succeeded payment, all of it or a part, exactly once per token, whatever happens.
#[utoipa::path(post, path = "/v1/payments/{request_no}/refunds", request_body = RefundRequestBody, tag = "refunds",
    params(
        ("request_no" = String, Path, description = "The payment to refund"),
        ("Idempotency-Key" = String, Header, description = "Token from POST /v1/tokens: 1-128 characters of A-Z a-z 0-9 _ -"),
        ("Prefer" = Option<String>, Header, description = "wait=N: seconds to wait for a final result (max 60)"),
    ),
    responses(
        (status = 201, description = "Refunded", body = RefundBody),
        (status = 202, description = "Not final within the wait window (Location: /v1/refunds/{refund_no})", body = RefundBody),
        (status = 400, description = "idempotency_key_missing, idempotency_key_invalid or invalid_request", body = crate::error::Problem),
        (status = 404, description = "token_not_found or payment_not_found (also another tenant's)", body = crate::error::Problem),
        (status = 409, description = "payment_not_refundable, refund_exceeds_payment (with refundable) or refund_no_conflict; stored", body = crate::error::Problem),
        (status = 422, description = "idempotency_key_mismatch, or refund_failed (stored): the channel failed or refused it, and the amount is refundable again", body = crate::error::Problem),
    ))]
pub async fn refund<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(request_no): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !is_json(&headers) {
        return Err(unsupported_media_type());
    }
    let token = token_of(&headers, None)?;
    let request: RefundRequestBody =
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))?;
    let refund = NewRefund::new(request.amount, request.refund_no, request.reason)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    // A number that is not valid names no payment.
    let Ok(number) = RequestNo::parse(request_no.as_str()) else { return Err(payment_not_found(&request_no)) };
    let wait = wait_of(&headers, state.wait);
    let response = state.payments.refund(&tenant, &token, &number, &refund, wait).await?;
    Ok(pay_response(response))
}

/// One refund of the caller's tenant, in its current status, with the workflow that runs it.
#[utoipa::path(get, path = "/v1/refunds/{refund_no}", tag = "refunds",
    params(("refund_no" = String, Path, description = "The refund's number")),
    responses(
        (status = 200, description = "The refund", body = RefundBody),
        (status = 404, description = "refund_not_found (also another tenant's)", body = crate::error::Problem),
    ))]
pub async fn get_refund<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(refund_no): Path<String>,
) -> Result<Json<RefundBody>, ApiError> {
    let missing = || ApiError::not_found("refund_not_found", format!("refund {refund_no} does not exist"));
    let Ok(number) = RefundNo::parse(refund_no.as_str()) else { return Err(missing()) };
    let Some(r) = state.payments.refund_record(&tenant, &number).await? else { return Err(missing()) };
    Ok(Json(r.view()))
}

/// Every refund of one of the caller's payments, newest first.
#[utoipa::path(get, path = "/v1/payments/{request_no}/refunds", tag = "refunds",
    params(("request_no" = String, Path, description = "The payment")),
    responses(
        (status = 200, description = "The payment's refunds, newest first", body = RefundList),
        (status = 404, description = "payment_not_found (also another tenant's)", body = crate::error::Problem),
    ))]
pub async fn list_refunds<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(request_no): Path<String>,
) -> Result<Json<RefundList>, ApiError> {
    let Ok(number) = RequestNo::parse(request_no.as_str()) else { return Err(payment_not_found(&request_no)) };
    let Some(refunds) = state.payments.refunds_of_payment(&tenant, &number).await? else {
        return Err(payment_not_found(&request_no));
    };
    Ok(Json(RefundList { refunds: refunds.iter().map(|r| r.view()).collect() }))
}
