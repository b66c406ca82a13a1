//! The mock channel over HTTP, as `onceflow mock-channel` serves it.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::mock::{Fault, MockChannel};
use super::{ChargeRequest, Closed, RefundRequest};

/// `?merchant_id=` of a `GET`, or the body of a close.
#[derive(serde::Deserialize)]
struct Merchant {
    merchant_id: Option<String>,
}

impl Merchant {
    /// The merchant named, if one is.
    fn id(self) -> Option<String> {
        self.merchant_id.filter(|m| !m.is_empty())
    }
}

/// The routes of `contracts/channel.md`, plus `GET /v1/ledger` (everything the channel did, for tests).
pub fn mock_channel_router(channel: MockChannel) -> Router {
    Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/charges/{merchant_request_no}", get(query))
        .route("/v1/charges/{merchant_request_no}/close", post(close))
        .route("/v1/refunds", post(refund))
        .route("/v1/refunds/{merchant_refund_no}", get(query_refund))
        .route("/v1/statements/{date}", get(statement))
        .route("/v1/ledger", get(ledger))
        .with_state(channel)
}

fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(json!({ "error": message }))).into_response()
}

async fn charge(State(channel): State<MockChannel>, Json(request): Json<ChargeRequest>) -> Response {
    let (answer, fault) = channel.handle_charge(&request).await;
    match fault {
        Some(Fault::ErrorBefore | Fault::ErrorAfter) => return error(500, "internal error"),
        Some(Fault::Slow) => tokio::time::sleep(Duration::from_millis(channel.config().slow_ms)).await,
        None => {}
    }
    match answer {
        Ok(charge) => Json(charge).into_response(),
        Err((status, message)) => error(status, &message),
    }
}

async fn query(
    State(channel): State<MockChannel>,
    Path(merchant_request_no): Path<String>,
    Query(merchant): Query<Merchant>,
) -> Response {
    let Some(merchant_id) = merchant.id() else {
        return error(400, "merchant_id is required");
    };
    match channel.handle_query(&merchant_id, &merchant_request_no).await {
        Some(charge) => Json(charge).into_response(),
        None => error(404, "not_found"),
    }
}

async fn close(
    State(channel): State<MockChannel>,
    Path(merchant_request_no): Path<String>,
    Json(merchant): Json<Merchant>,
) -> Response {
    let Some(merchant_id) = merchant.id() else {
        return error(400, "merchant_id is required");
    };
    match channel.handle_close(&merchant_id, &merchant_request_no).await {
        Closed::Closed => {
            Json(json!({ "merchant_request_no": merchant_request_no, "status": "closed" })).into_response()
        }
        Closed::Charged(charge) => {
            (StatusCode::CONFLICT, Json(json!({ "error": "charged", "charge": charge }))).into_response()
        }
    }
}

async fn refund(State(channel): State<MockChannel>, Json(request): Json<RefundRequest>) -> Response {
    match channel.handle_refund(&request).await {
        (_, true) => error(500, "internal error"),
        (Ok(refund), false) => Json(refund).into_response(),
        (Err((status, message)), false) => error(status, &message),
    }
}

async fn query_refund(
    State(channel): State<MockChannel>,
    Path(merchant_refund_no): Path<String>,
    Query(merchant): Query<Merchant>,
) -> Response {
    let Some(merchant_id) = merchant.id() else {
        return error(400, "merchant_id is required");
    };
    match channel.handle_refund_query(&merchant_id, &merchant_refund_no).await {
        Some(refund) => Json(refund).into_response(),
        None => error(404, "not_found"),
    }
}

async fn ledger(State(channel): State<MockChannel>) -> Response {
    Json(channel.ledger()).into_response()
}

/// `GET /v1/statements/{date}?merchant_id=`: NDJSON, streamed line by line, `Statement-Complete` for a past
/// day; `404` for a day after today.
async fn statement(
    State(channel): State<MockChannel>,
    Path(date): Path<String>,
    Query(merchant): Query<Merchant>,
) -> Response {
    let Some(merchant_id) = merchant.id() else {
        return error(400, "merchant_id is required");
    };
    let Ok(day) = chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d") else {
        return error(400, "date must be YYYY-MM-DD");
    };
    let Some(statement) = channel.statement_of(&merchant_id, day) else {
        return error(404, "not_found");
    };
    let complete = if statement.complete { "true" } else { "false" };
    // Sent as it is read, a few hundred lines to a chunk.
    let chunks = futures_util::stream::unfold(Some(statement), |statement| async move {
        let mut statement = statement?;
        let mut chunk = Vec::new();
        for _ in 0..256 {
            match statement.next_line().await {
                Ok(Some(line)) => {
                    chunk.extend(serde_json::to_vec(&line).unwrap_or_default());
                    chunk.push(b'\n');
                }
                _ => return (!chunk.is_empty()).then_some((Ok::<_, std::convert::Infallible>(chunk), None)),
            }
        }
        Some((Ok(chunk), Some(statement)))
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .header("statement-complete", complete)
        .body(axum::body::Body::from_stream(chunks))
        .unwrap_or_else(|_| error(500, "internal error"))
}
