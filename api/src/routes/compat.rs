//! The original design's routes: `POST /tokens` and `POST /pay`, with the same guarantees underneath.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use onceflow_payments::{OrderNo, PaymentRequest, PaymentStore, RequestNo, Token};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::payments::token_of;
use crate::state::{AppState, Tenant};

/// The original service's token answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LegacyToken {
    /// The idempotency token.
    pub token: String,
}

/// A [`onceflow_payments::PaymentRequest`] as the original service's `/pay` receives it (the document's
/// `LegacyPay`; the currency is the order's).
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = LegacyPay)]
pub struct LegacyPayBody {
    /// The idempotency token.
    #[schema(value_type = Token)]
    pub token: String,
    /// The order.
    #[schema(value_type = OrderNo)]
    pub order_no: String,
    /// The payment's number.
    #[serde(default)]
    #[schema(value_type = Option<RequestNo>)]
    pub request_no: Option<String>,
    /// Minor units.
    #[serde(deserialize_with = "crate::extract::integral")]
    #[schema(minimum = 1)]
    pub amount: i64,
}

/// The original service's success answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LegacyPaid {
    /// The order.
    pub order_no: String,
    /// The payment's number.
    pub request_no: String,
    /// `PAID` (or `PROCESSING` when not final yet).
    pub status: String,
}

/// The original service's error answer: a problem (RFC 9457) that also carries `message`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LegacyError {
    /// What went wrong (the original service's field; equals `detail`).
    pub message: String,
    /// Stable, machine-readable code, as on `/v1/payments`.
    pub code: String,
    /// HTTP status.
    pub status: u16,
}

/// Issues a token (original design).
#[utoipa::path(post, path = "/tokens", tag = "original design",
    responses((status = 200, description = "Issued", body = LegacyToken)))]
pub async fn legacy_token<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
) -> Result<Json<LegacyToken>, ApiError> {
    Ok(Json(LegacyToken { token: state.payments.issue_token(&tenant).await?.token.into() }))
}

/// Pays an order (original design): `200 {"order_no", "request_no", "status": "PAID"}`; errors carry the
/// original `{"message"}` inside a problem+json body, with the same status and code as `/v1/payments`.
#[utoipa::path(post, path = "/pay", request_body = LegacyPayBody, tag = "original design",
    responses(
        (status = 200, description = "Paid", body = LegacyPaid),
        (status = 202, description = "Not final yet", body = LegacyPaid),
        (status = 400, description = "Invalid request", body = LegacyError),
        (status = 402, description = "Declined", body = LegacyError),
        (status = 404, description = "Unknown token or order", body = LegacyError),
        (status = 409, description = "Conflict: order not payable, request number in use", body = LegacyError),
        (status = 422, description = "Token reused for another request, or amount mismatch", body = LegacyError),
    ))]
pub async fn legacy_pay<S: PaymentStore>(
    State(state): State<AppState<S>>,
    tenant: Result<Tenant, ApiError>,
    body: Result<ApiJson<LegacyPayBody>, ApiError>,
) -> Response {
    // Every error of this route carries the original `message`, a rejected body or key included.
    let paid = match (tenant, body) {
        (Ok(Tenant(tenant)), Ok(ApiJson(body))) => pay(&state, &tenant, body).await,
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    paid.unwrap_or_else(|e| {
        let status = e.status;
        let problem = onceflow_payments::problem(status.as_u16(), e.code, e.title, &e.detail);
        let mut response = legacy_error(status, &problem);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    })
}

async fn pay<S: PaymentStore>(state: &AppState<S>, tenant: &str, body: LegacyPayBody) -> Result<Response, ApiError> {
    let tenant = tenant.to_owned();
    // As the original service checked: the token, then the order (a number that is not valid names none), then
    // the rest of the request.
    let token = token_of(&HeaderMap::new(), Some(&body.token))?;
    let order = match OrderNo::parse(body.order_no.as_str()) {
        Ok(number) => state.payments.order(&tenant, &number).await?,
        Err(_) => None,
    };
    let Some(order) = order else {
        let detail = format!("order {} does not exist", body.order_no);
        let problem = onceflow_payments::problem(404, "order_not_found", "Order not found", &detail);
        return Ok(legacy_error(StatusCode::NOT_FOUND, &problem));
    };
    let invalid = |e: onceflow_payments::InvalidField| ApiError::invalid(e.to_string());
    let request_no = body.request_no.map(RequestNo::parse).transpose().map_err(invalid)?;
    let request = PaymentRequest::new(order.order_no, body.amount, order.currency, request_no).map_err(invalid)?;
    let answer = state.payments.pay(&tenant, &token, "/pay", &request, state.wait).await?;
    let v1: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
    let text = |k: &str| v1.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let response = match answer.status {
        201 | 202 => {
            let status = if answer.status == 201 { "PAID" } else { "PROCESSING" };
            let code = if answer.status == 201 { StatusCode::OK } else { StatusCode::ACCEPTED };
            let paid = LegacyPaid { order_no: text("order_no"), request_no: text("request_no"), status: status.into() };
            (code, Json(paid)).into_response()
        }
        status => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Ok(with_replay(legacy_error(code, &answer.body), answer.replayed));
        }
    };
    Ok(with_replay(response, answer.replayed))
}

/// The original service's `{"message"}` error, kept as a member of a problem+json body (RFC 9457 allows
/// extension members), so old clients and problem-aware ones both read it.
fn legacy_error(status: StatusCode, problem_body: &str) -> Response {
    let mut problem: serde_json::Value = serde_json::from_str(problem_body).unwrap_or_else(|_| json!({}));
    let message = problem.get("detail").and_then(|d| d.as_str()).unwrap_or("request failed").to_owned();
    problem["message"] = json!(message);
    crate::error::json_response(status, problem.to_string(), true)
}

fn with_replay(mut response: Response, replayed: bool) -> Response {
    if replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}
