//! The OpenAPI 3.1 document, generated from the handlers' annotations and completed here with what is the same
//! for every operation, so that the document says what the server does (checked by schemathesis): errors are
//! `application/problem+json`; every operation may answer `401` (API keys), `503` (storage) and, with a JSON body,
//! `413` and `415`; identifiers, amounts and currencies carry the constraints the server checks.

use serde::Serialize;
use serde_json::{Value, json};
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
    /// invalid_state, unauthorized, forbidden, not_found, method_not_allowed, payload_too_large, unsupported_media_type,
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
        payments::list_payments,
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

/// `order_no` and `request_no`: 1–64 characters of `A-Z a-z 0-9 . _ : -`, other than `.` and `..` (see
/// `onceflow_payments::validate_key`), as a regular expression without look-ahead.
const KEY_PATTERN: &str =
    r"^([A-Za-z0-9_:-][A-Za-z0-9._:-]{0,63}|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,62}|\.\.[A-Za-z0-9._:-]{1,62})$";

/// An idempotency token as a client may send it: 1–128 characters of `A-Z a-z 0-9 _ -`.
const TOKEN_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

/// The served document: the generated one, completed (see the module docs).
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    let problem = json!({ "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } });
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else { continue };
            for (_method, op) in item.iter_mut() {
                complete_operation(path, op, &problem);
            }
        }
    }
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        for schema in schemas.values_mut() {
            constrain_properties(schema);
        }
    }
    doc
}

fn complete_operation(path: &str, op: &mut Value, problem: &Value) {
    let has_body = op.get("requestBody").is_some();
    let served = !matches!(path, "/healthz" | "/openapi.json" | "/metrics");
    if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
        for (status, response) in responses.iter_mut() {
            // Every error body is a problem (the original design's too: its `message` rides inside one).
            if (status.starts_with('4') || status.starts_with('5'))
                && let Some(content) = response.get_mut("content").and_then(Value::as_object_mut)
                && let Some(json) = content.remove("application/json")
            {
                content.insert("application/problem+json".to_owned(), json);
            }
        }
        let mut add = |status: &str, description: &str| {
            responses
                .entry(status.to_owned())
                .or_insert_with(|| json!({ "description": description, "content": problem }));
        };
        if served {
            add("401", "unauthorized: a missing or unknown API key (when keys are configured)");
            add("503", "unavailable: storage is unavailable; retry after Retry-After");
        }
        if has_body {
            add("400", "invalid_request");
            add("413", "payload_too_large");
            add("415", "unsupported_media_type: send the body as application/json");
        }
    }
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for param in params {
            let name = param.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            let schema = match name.as_str() {
                "order_no" | "request_no" => json!({ "type": "string", "pattern": KEY_PATTERN }),
                "Idempotency-Key" => {
                    // Or `token` in the body: the header is not required.
                    param["required"] = json!(false);
                    json!({ "type": "string", "pattern": TOKEN_PATTERN })
                }
                "state" => json!({ "type": "string", "enum": crate::routes::ops::WORKFLOW_STATES }),
                "limit" => json!({ "type": "integer", "format": "int64", "minimum": 1, "maximum": 1000 }),
                _ => continue,
            };
            param["schema"] = schema;
            if param.get("in").and_then(Value::as_str) == Some("query") {
                // A query value is one scalar: `limit=5`, never a list spread over several pairs.
                param["explode"] = json!(false);
            }
        }
    }
}

/// The constraints the server checks on request fields, by name.
fn constrain_properties(schema: &mut Value) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { return };
    for (name, prop) in props.iter_mut() {
        let Some(prop) = prop.as_object_mut() else { continue };
        match name.as_str() {
            "order_no" | "request_no" => {
                prop.insert("pattern".to_owned(), json!(KEY_PATTERN));
            }
            "currency" => {
                prop.insert("pattern".to_owned(), json!("^[A-Z]{3}$"));
            }
            "amount" => {
                prop.insert("minimum".to_owned(), json!(1));
            }
            // The idempotency token of the original design's body (and of `/v1/payments` when not a header).
            "token" => {
                prop.insert("pattern".to_owned(), json!(TOKEN_PATTERN));
            }
            _ => {}
        }
    }
}
