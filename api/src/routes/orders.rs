//! `POST /v1/orders`, `GET /v1/orders/{order_no}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use onceflow_payments::{Currency, OrderNo, OrderStatus, PaymentStore};

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::{AppState, Tenant};

/// A new order.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    /// Unique per tenant: 1–64 characters of `A-Z a-z 0-9 . _ : -`.
    pub order_no: OrderNo,
    /// Minor units, > 0.
    #[serde(deserialize_with = "crate::extract::integral")]
    #[schema(minimum = 1)]
    pub amount: i64,
    /// ISO 4217 (three upper-case letters).
    pub currency: Currency,
}

/// An order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OrderBody {
    /// Unique per tenant.
    pub order_no: OrderNo,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: Currency,
    /// Where the order is.
    pub status: OrderStatus,
    /// Incremented by every status change.
    pub version: i64,
    /// RFC 3339.
    pub updated_at: String,
}

impl From<onceflow_payments::Order> for OrderBody {
    fn from(o: onceflow_payments::Order) -> Self {
        Self {
            order_no: o.order_no,
            amount: o.amount,
            currency: o.currency,
            status: o.status,
            version: o.version,
            updated_at: rfc3339(o.updated_at),
        }
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
pub(crate) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Creates an order; the same `order_no` with the same fields returns it with `200`.
#[utoipa::path(post, path = "/v1/orders", request_body = CreateOrder, tag = "orders",
    responses(
        (status = 201, description = "Created", body = OrderBody),
        (status = 200, description = "Existed with the same fields", body = OrderBody),
        (status = 400, description = "invalid_request", body = crate::error::Problem),
        (status = 409, description = "order_conflict", body = crate::error::Problem),
        (status = 503, description = "unavailable", body = crate::error::Problem),
    ))]
pub async fn create_order<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<CreateOrder>,
) -> Result<(StatusCode, Json<OrderBody>), ApiError> {
    let (order, created) = state.payments.create_order(&tenant, &body.order_no, body.amount, &body.currency).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(order.into())))
}

/// One order of the caller's tenant.
#[utoipa::path(get, path = "/v1/orders/{order_no}", tag = "orders",
    params(("order_no" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "The order", body = OrderBody),
        (status = 404, description = "order_not_found", body = crate::error::Problem),
    ))]
pub async fn get_order<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(order_no): Path<String>,
) -> Result<Json<OrderBody>, ApiError> {
    let missing = || ApiError::not_found("order_not_found", format!("order {order_no} does not exist"));
    // A number that is not valid names no order.
    let Ok(number) = OrderNo::parse(order_no.as_str()) else { return Err(missing()) };
    match state.payments.order(&tenant, &number).await? {
        Some(order) => Ok(Json(order.into())),
        None => Err(missing()),
    }
}
