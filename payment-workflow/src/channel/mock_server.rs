//! The mock channel over HTTP, as `onceflow mock-channel` serves it.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::mock::{Fault, MockChannel};
use super::{ChargeRequest, RefundRequest};

/// The routes of `contracts/channel.md`, plus `GET /v1/ledger` (everything the channel did, for tests).
pub fn mock_channel_router(channel: MockChannel) -> Router {
    Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/charges/{merchant_request_no}", get(query))
        .route("/v1/refunds", post(refund))
        .route("/v1/refunds/{merchant_refund_no}", get(query_refund))
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

async fn query(State(channel): State<MockChannel>, Path(merchant_request_no): Path<String>) -> Response {
    match channel.handle_query(&merchant_request_no).await {
        Some(charge) => Json(charge).into_response(),
        None => error(404, "not_found"),
    }
}

async fn refund(State(channel): State<MockChannel>, Json(request): Json<RefundRequest>) -> Response {
    match channel.handle_refund(&request).await {
        Ok(refund) => Json(refund).into_response(),
        Err((status, message)) => error(status, &message),
    }
}

async fn query_refund(State(channel): State<MockChannel>, Path(merchant_refund_no): Path<String>) -> Response {
    match channel.handle_refund_query(&merchant_refund_no).await {
        Some(refund) => Json(refund).into_response(),
        None => error(404, "not_found"),
    }
}

async fn ledger(State(channel): State<MockChannel>) -> Response {
    Json(channel.ledger()).into_response()
}
