//! `POST /v1/channel/notifications`: the channel's signed notifications (`contracts/http-api.md`, Channel
//! notifications). No API key: the `Channel-Signature` authenticates, against the secret of the merchant the
//! body names. Answered `204` only once the notification is durably recorded.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use onceflow_payments::{ChannelAccounts, NotTaken, PaymentStore, Taken, deliver_word, take_notification};

use crate::error::ApiError;
use crate::state::AppState;

/// A notification as the channel sends it (`contracts/channel.md`, Notifications).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ChannelNotification {
    /// The channel's id of the notification (the same on every resend).
    id: String,
    /// `charge.succeeded`, `charge.declined`, `refund.succeeded` or `refund.failed`.
    #[schema(rename = "type")]
    kind: String,
    /// RFC 3339.
    created_at: String,
    /// The channel merchant it is for.
    merchant_id: String,
    /// The charge or refund, as a query answers it.
    #[schema(value_type = Object)]
    data: serde_json::Value,
}

/// The one answer to anything that does not verify: the same whatever was wrong, so it tells a prober nothing.
fn unverified() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "notification_unverified",
        "Notification unverified",
        "the notification's signature could not be verified",
    )
}

/// Takes a notification from the channel: verified (HMAC-SHA256 of `t.body` with the merchant's secret, `t`
/// within 5 minutes), recorded once by its id, `204` once durable; a repeat is `204` and changes nothing.
#[utoipa::path(post, path = "/v1/channel/notifications", tag = "channel",
    request_body(content = ChannelNotification, content_type = "application/json"),
    params(("Channel-Signature" = String, Header, description = "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"t.body\")>; several v1= during a rotation")),
    responses(
        (status = 204, description = "Recorded (or recorded before: a repeat changes nothing)"),
        (status = 400, description = "invalid_request: verified, but not a notification of the protocol", body = crate::error::Problem),
        (status = 401, description = "notification_unverified: a bad or missing signature, an unknown merchant, or a time outside the tolerance; nothing recorded", body = crate::error::Problem),
    ),
    security(()))]
pub async fn take<S: PaymentStore>(
    State(state): State<AppState<S>>,
    accounts: Option<Extension<Arc<ChannelAccounts>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let accounts = accounts.map(|Extension(a)| a).unwrap_or_default();
    let signature = headers.get("channel-signature").and_then(|v| v.to_str().ok());
    let store = state.payments.engine().store();
    let now = state.payments.engine().now_ms();
    match take_notification(store, &accounts, signature, &body, now).await {
        Ok(Ok(Taken::Recorded(word))) => {
            // Durable now: answered at once, and delivered to what holds its number (the workflow waiting on the
            // channel is woken and settles from it); a delivery that fails here is made by the next pass.
            let engine = state.payments.engine().clone();
            tokio::spawn(async move {
                if let Err(e) = deliver_word(&engine, &word).await {
                    tracing::warn!(error = %e, id = %word.notification_id, "could not deliver the channel's word yet");
                }
            });
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Ok(Ok(Taken::Duplicate)) => Ok(StatusCode::NO_CONTENT.into_response()),
        Ok(Err(NotTaken::Unverified(why))) => {
            tracing::info!(why, "channel notification refused: unverified");
            Err(unverified())
        }
        Ok(Err(NotTaken::Invalid(why))) => Err(ApiError::invalid(why)),
        Err(e) => Err(ApiError::unavailable(&e)),
    }
}
