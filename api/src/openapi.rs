//! The OpenAPI 3.1 document, generated from the handlers' annotations.

use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use crate::routes::{compat, ops, orders, payments, tokens};

/// A problem (RFC 9457), the shape of every error.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:onceflow:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// This occurrence.
    pub detail: String,
    /// Stable, machine-readable: invalid_request, idempotency_key_missing, idempotency_key_invalid,
    /// idempotency_key_mismatch, token_not_found, order_not_found, order_conflict, order_not_payable,
    /// amount_mismatch, request_no_conflict, payment_declined, payment_not_found, workflow_not_found,
    /// invalid_state, unauthorized, not_found, method_not_allowed, payload_too_large, unsupported_media_type,
    /// unavailable, internal.
    pub code: String,
    /// With `payment_declined`: the channel's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
}

/// The API's document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "onceflow",
        description = "Payments that never charge twice: orders, idempotency tokens, payments, operations."
    ),
    paths(
        orders::create_order,
        orders::get_order,
        tokens::issue_token,
        payments::pay,
        payments::get_payment,
        compat::legacy_token,
        compat::legacy_pay,
        ops::list_workflows,
        ops::get_workflow,
        ops::retry_workflow,
        ops::cancel_workflow,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        ops::openapi,
    ),
    components(schemas(Problem))
)]
pub struct ApiDoc;
