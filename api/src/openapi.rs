//! The OpenAPI 3.1 document, generated from the handlers' annotations and completed here with what is the same
//! for every operation, so that the document says what the server does (checked by schemathesis): errors are
//! `application/problem+json`; every operation may answer `401` (API keys), `503` (storage), with a query or a JSON
//! body `400`, and with a JSON body `413` and `415`; parameters are where the server reads them; identifiers,
//! amounts and currencies carry the constraints the server checks.

use axum::Json;
use axum::Router;
use axum::routing::get;
use serde_json::{Value, json};
use utoipa::{OpenApi, ToSchema};

use onceflow_payments::{KEY_PATTERN, PaymentStore, TOKEN_PATTERN};

use crate::error::Problem;
use crate::routes::views::WorkflowStateSchema;
use crate::routes::{
    audit, compat, events, notifications, ops, orders, payments, reconciliations, refunds, search, tokens, unresolved,
    webhooks, whoami,
};
use crate::state::AppState;

/// The API's document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "onceflow",
        description = "Payments that never charge twice: orders, idempotency tokens, payments, refunds, operations."
    ),
    paths(
        orders::create_order,
        orders::get_order,
        tokens::issue_token,
        payments::pay,
        payments::get_payment,
        payments::list_payments,
        refunds::refund,
        refunds::list_refunds,
        refunds::get_refund,
        compat::legacy_token,
        compat::legacy_pay,
        ops::list_workflows,
        ops::get_workflow,
        ops::retry_workflow,
        ops::cancel_workflow,
        audit::list_audit,
        search::search,
        unresolved::unresolved,
        whoami::whoami,
        ops::query_channel,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        events::list_events,
        events::get_event,
        events::redeliver,
        webhooks::create_endpoint,
        webhooks::list_endpoints,
        webhooks::get_endpoint,
        webhooks::update_endpoint,
        webhooks::delete_endpoint,
        webhooks::rotate_secret,
        webhooks::list_attempts,
        notifications::take,
        reconciliations::list,
        openapi,
    ),
    components(schemas(Problem))
)]
pub struct ApiDoc;

/// The route that serves the document: here, above the routes it describes, so that no route needs this module.
pub(crate) fn routes<S: PaymentStore>() -> Router<AppState<S>> {
    Router::new().route("/openapi.json", get(openapi))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3.1")))]
pub async fn openapi() -> Json<Value> {
    Json(document())
}

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
    doc
}

fn complete_operation(path: &str, op: &mut Value, problem: &Value) {
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for param in params {
            complete_parameter(path, param);
        }
    }
    let has_body = op.get("requestBody").is_some();
    let has_query = op["parameters"].as_array().is_some_and(|params| params.iter().any(|p| p["in"] == "query"));
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
        if has_body || has_query {
            add("400", "invalid_request");
        }
        if has_body {
            add("408", "request_timeout: the body did not arrive within the server's body read timeout");
            add("413", "payload_too_large");
            add("415", "unsupported_media_type: send the body as application/json");
        }
    }
}

/// Puts a parameter where the server reads it, with the constraints the server checks.
fn complete_parameter(path: &str, param: &mut Value) {
    let name = param["name"].as_str().unwrap_or_default().to_owned();
    if param["in"] == "path" && !path.contains(&format!("{{{name}}}")) {
        into_query(param);
    }
    if param["in"] == "query" {
        // A query value is one scalar: `limit=5`, never a list spread over several pairs.
        param["explode"] = json!(false);
    }
    let schema = match name.as_str() {
        "order_no" | "request_no" | "refund_no" => json!({ "type": "string", "pattern": KEY_PATTERN }),
        // A payment's token: or `token` in the body (the original design's clients); one of the two is required,
        // which OpenAPI cannot say across a header and a body field; the document says it in words, and
        // api/tests/schemathesis/hooks.py tells schemathesis. (A refund's is the header alone, required.)
        "Idempotency-Key" if path == "/v1/payments" => {
            param["required"] = json!(false);
            param["description"] = json!(
                "Token from POST /v1/tokens: 1-128 characters of A-Z a-z 0-9 _ -. Required unless the body \
                 carries it as `token` (the original design's clients); the header is used when both are sent."
            );
            json!({ "type": "string", "pattern": TOKEN_PATTERN })
        }
        "Idempotency-Key" => json!({ "type": "string", "pattern": TOKEN_PATTERN }),
        // The same enum as a workflow's `state` in the answers: one type for clients.
        "state" => json!({ "$ref": format!("#/components/schemas/{}", WorkflowStateSchema::name()) }),
        "limit" => json!({ "type": "integer", "format": "int64", "minimum": 1, "maximum": 1000 }),
        // A UTC day (`GET /v1/reconciliations`).
        "date" => json!({ "type": "string", "format": "date" }),
        _ => return,
    };
    param["schema"] = schema;
}

/// Moves a parameter of a query struct to the query. `#[derive(IntoParams)]` puts a struct's fields in the path
/// unless told otherwise, and makes every one required there; a query field is required only when it is not an
/// `Option`, which the generated schema says as a `null` in its type. An absent parameter is the query's `null`,
/// so the schema keeps only the other types (`before=` would be no integer the server reads).
fn into_query(param: &mut Value) {
    let mut optional = false;
    if let Some(kind) = param.pointer_mut("/schema/type")
        && let Some(types) = kind.as_array()
    {
        optional = types.iter().any(|t| t == "null");
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        *kind = if let [one] = rest.as_slice() { one.clone() } else { Value::Array(rest) };
    }
    param["in"] = json!("query");
    param["required"] = json!(!optional);
}
