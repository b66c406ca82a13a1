//! `POST /v1/tokens`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use onceflow_payments::PaymentStore;

use crate::error::ApiError;
use crate::routes::orders::rfc3339;
use crate::state::{AppState, Tenant};

/// A new idempotency token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenBody {
    /// Send it as `Idempotency-Key`.
    pub token: String,
    /// RFC 3339; an unused token expires then.
    pub expires_at: String,
}

/// Issues an idempotency token (≥ 128 random bits) for the caller's tenant.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens",
    responses(
        (status = 201, description = "Issued", body = TokenBody),
        (status = 503, description = "unavailable", body = crate::error::Problem),
    ))]
pub async fn issue_token<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
) -> Result<(StatusCode, Json<TokenBody>), ApiError> {
    let issued = state.payments.issue_token(&tenant).await?;
    Ok((StatusCode::CREATED, Json(TokenBody { token: issued.token.into(), expires_at: rfc3339(issued.expires_at) })))
}
