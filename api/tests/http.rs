//! The HTTP contract, against the real application on port 0, on SQLite, Postgres and MySQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{App, database, start, start_reliable};
use onceflow_api::Auth;
use onceflow_payments::{MockChannel, MockChannelConfig};
use reqwest::Method;
use serde_json::json;

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::database("sqlite").await.unwrap()).await;
            }

            #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(url) = super::database("postgres").await else {
                    eprintln!("skipped: DATABASE_URL is not set");
                    return;
                };
                super::$name(url).await;
            }

            #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let Some(url) = super::database("mysql").await else {
                    eprintln!("skipped: MYSQL_URL is not set");
                    return;
                };
                super::$name(url).await;
            }
        }
    )*};
}

fn pay_body(order_no: &str, amount: i64) -> serde_json::Value {
    json!({"order_no": order_no, "amount": amount, "currency": "CNY"})
}

async fn every_row_of_the_payments_table(url: String) {
    let (app, channel) = start_reliable(&url).await;
    app.order("O-1", 1000).await;

    // charged: 201, then replays identical with Idempotent-Replayed.
    let token = app.token().await;
    let first = app.pay(&token, pay_body("O-1", 1000)).await;
    assert_eq!(first.status, 201, "{}", first.text);
    assert_eq!(first.json()["status"], "succeeded");
    assert!(first.json()["charge_id"].is_string());
    assert_eq!(first.header("idempotent-replayed"), None);
    let replay = app.pay(&token, pay_body("O-1", 1000)).await;
    assert_eq!((replay.status, &replay.text), (201, &first.text));
    assert_eq!(replay.header("idempotent-replayed").as_deref(), Some("true"));
    let request_no = first.json()["request_no"].as_str().unwrap().to_owned();
    let got = app.get(&format!("/v1/payments/{request_no}")).await;
    assert_eq!((got.status, got.json()["status"].as_str()), (200, Some("succeeded")));
    assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "paid");

    // missing and malformed keys; the original design's body token works.
    app.send(Method::POST, "/v1/payments", &[], Some(pay_body("O-1", 1000)))
        .await
        .assert_problem(400, "idempotency_key_missing");
    app.pay("not a token!", pay_body("O-1", 1000)).await.assert_problem(400, "idempotency_key_invalid");
    app.pay(&"x".repeat(129), pay_body("O-1", 1000)).await.assert_problem(400, "idempotency_key_invalid");
    // unknown token; mismatch; order unknown (not stored: the token stays usable).
    app.pay("tok_unknown", pay_body("O-1", 1000)).await.assert_problem(404, "token_not_found");
    app.pay(&token, pay_body("O-1", 999)).await.assert_problem(422, "idempotency_key_mismatch");
    let t2 = app.token().await;
    app.pay(&t2, pay_body("O-nope", 1000)).await.assert_problem(404, "order_not_found");
    // invalid body: not stored, the token stays usable.
    app.pay(&t2, json!({"order_no": "O-2", "amount": "ten", "currency": "CNY"}))
        .await
        .assert_problem(400, "invalid_request");
    app.pay(&t2, json!({"order_no": "O-2", "amount": 1000, "currency": "cny"}))
        .await
        .assert_problem(400, "invalid_request");
    app.pay(&t2, json!({"order_no": "O-2", "amount": 0, "currency": "CNY"}))
        .await
        .assert_problem(400, "invalid_request");
    // amount mismatch: stored.
    app.order("O-2", 1000).await;
    app.pay(&t2, pay_body("O-2", 5)).await.assert_problem(422, "amount_mismatch");
    let again = app.pay(&t2, pay_body("O-2", 5)).await;
    again.assert_problem(422, "amount_mismatch");
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    // order not payable: stored.
    let t3 = app.token().await;
    app.pay(&t3, pay_body("O-1", 1000)).await.assert_problem(409, "order_not_payable");
    // request_no already used by another payment: stored.
    let t4 = app.token().await;
    let reuse = json!({"order_no": "O-2", "amount": 1000, "currency": "CNY", "request_no": request_no});
    app.pay(&t4, reuse).await.assert_problem(409, "request_no_conflict");
    // the body's token, for the original design's clients.
    app.order("O-3", 1000).await;
    let t5 = app.token().await;
    let by_body =
        app.post("/v1/payments", json!({"order_no": "O-3", "amount": 1000, "currency": "CNY", "token": t5})).await;
    assert_eq!(by_body.status, 201, "{}", by_body.text);
    assert_eq!(channel.ledger().charges.len(), 2, "nothing else reached the channel");
}

async fn declines_and_slow_payments(url: String) {
    let declining = MockChannel::new(MockChannelConfig { decline_rate: 1.0, ..Default::default() });
    let app = start(&url, Arc::new(declining), Auth::SingleTenant).await;
    app.order("O-d", 1000).await;
    let token = app.token().await;
    let declined = app.pay(&token, pay_body("O-d", 1000)).await;
    declined.assert_problem(402, "payment_declined");
    assert_eq!(declined.json()["decline_code"], "insufficient_funds");
    let replay = app.pay(&token, pay_body("O-d", 1000)).await;
    assert_eq!((replay.status, &replay.text), (402, &declined.text));
    assert_eq!(app.get("/v1/orders/O-d").await.json()["status"], "pending");

    // Not final within the wait window: 202 with Location, then the payment settles.
    let slow = MockChannel::new(MockChannelConfig { latency_ms: 400, ..Default::default() });
    let app = start(&url, Arc::new(slow.clone()), Auth::SingleTenant).await;
    app.order("O-s", 1000).await;
    let token = app.token().await;
    let pending = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &token), ("prefer", "wait=0")],
            Some(pay_body("O-s", 1000)),
        )
        .await;
    assert_eq!(pending.status, 202, "{}", pending.text);
    assert_eq!(pending.json()["status"], "processing");
    let location = pending.header("location").expect("Location");
    assert!(location.starts_with("/v1/payments/R-"));
    let mut status = String::new();
    for _ in 0..100 {
        status = app.get(&location).await.json()["status"].as_str().unwrap_or_default().to_owned();
        if status == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "succeeded");
    assert_eq!(app.pay(&token, pay_body("O-s", 1000)).await.status, 201);
    assert_eq!(slow.ledger().charges.len(), 1);
}

async fn tenants_see_only_their_own(url: String) {
    let channel = Arc::new(MockChannel::reliable());
    let auth =
        Auth::keys(vec![("acme".into(), "acme-secret-key".into()), ("globex".into(), "globex-secret-key".into())]);
    let base = start(&url, channel, auth).await;
    let acme = App { base: base.base.clone(), client: base.client.clone(), key: None }.with_key("acme-secret-key");
    let globex = App { base: base.base.clone(), client: base.client.clone(), key: None }.with_key("globex-secret-key");
    let nobody = App { base: base.base.clone(), client: base.client.clone(), key: None };
    let wrong = App { base: base.base.clone(), client: base.client.clone(), key: None }.with_key("acme-secret-kez");
    nobody.get("/v1/orders/O-1").await.assert_problem(401, "unauthorized");
    wrong.get("/v1/orders/O-1").await.assert_problem(401, "unauthorized");
    acme.order("O-1", 1000).await;
    globex.get("/v1/orders/O-1").await.assert_problem(404, "order_not_found");
    let token = acme.token().await;
    globex.order("O-1", 1000).await;
    globex.pay(&token, pay_body("O-1", 1000)).await.assert_problem(404, "token_not_found");
    let paid = acme.pay(&token, pay_body("O-1", 1000)).await;
    assert_eq!(paid.status, 201);
    let request_no = paid.json()["request_no"].as_str().unwrap().to_owned();
    globex.get(&format!("/v1/payments/{request_no}")).await.assert_problem(404, "payment_not_found");
    let workflow_id =
        acme.get(&format!("/v1/payments/{request_no}")).await.json()["workflow_id"].as_str().unwrap().to_owned();
    globex.get(&format!("/v1/workflows/{workflow_id}")).await.assert_problem(404, "workflow_not_found");
    let view = acme.get(&format!("/v1/workflows/{workflow_id}")).await;
    assert_eq!(view.status, 200);
    assert!(!view.text.contains(&token[4..]), "the token itself is not shown");
    assert_eq!(view.json()["workflow"]["state"], "completed");
    // contracts/http-api.md: times as RFC 3339; input, output and errors as JSON values, not strings.
    let v = view.json();
    let rfc3339 = |t: &serde_json::Value| t.as_str().is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
    assert!(v["workflow"]["input"].is_object(), "{v}");
    assert_eq!(v["workflow"]["input"]["order_no"], "O-1");
    assert!(v["workflow"]["output"].is_object(), "{v}");
    assert!(rfc3339(&v["workflow"]["created_at"]) && rfc3339(&v["workflow"]["updated_at"]), "{v}");
    let steps = v["steps"].as_array().unwrap();
    assert!(steps.iter().all(|s| rfc3339(&s["started_at"]) && rfc3339(&s["finished_at"])), "{v}");
    let claimed = steps.iter().find(|s| s["step_key"] == "claim_token").unwrap();
    assert_eq!(claimed["output"], json!(true), "the step's output as its JSON value, not a string: {v}");
    let listed = acme.get("/v1/workflows").await.json();
    let listed = &listed["workflows"][0];
    assert!(listed["input"].is_object() && rfc3339(&listed["created_at"]), "{listed}");
    assert_eq!(globex.get("/v1/orders/O-1").await.json()["status"], "pending");
}

async fn original_design_routes(url: String) {
    let (app, channel) = start_reliable(&url).await;
    app.order("O-1", 1000).await;
    let token = app.send(Method::POST, "/tokens", &[], None).await;
    assert_eq!(token.status, 200);
    let token = token.json()["token"].as_str().unwrap().to_owned();
    let body = json!({"token": token, "order_no": "O-1", "request_no": "R-legacy-1", "amount": 1000});
    let paid = app.post("/pay", body.clone()).await;
    assert_eq!(paid.status, 200, "{}", paid.text);
    assert_eq!(paid.json(), json!({"order_no": "O-1", "request_no": "R-legacy-1", "status": "PAID"}));
    let again = app.post("/pay", body).await;
    assert_eq!((again.status, &again.text), (200, &paid.text));
    let other = app.send(Method::POST, "/tokens", &[], None).await.json()["token"].as_str().unwrap().to_owned();
    let conflict =
        app.post("/pay", json!({"token": other, "order_no": "O-1", "request_no": "R-legacy-2", "amount": 1000})).await;
    conflict.assert_problem(409, "order_not_payable");
    assert!(conflict.json()["message"].is_string(), "the original design's field is kept");
    // The same token on the other route is a mismatch.
    app.pay(&token, json!({"order_no": "O-1", "amount": 1000, "currency": "CNY", "request_no": "R-legacy-1"}))
        .await
        .assert_problem(422, "idempotency_key_mismatch");
    assert_eq!(channel.ledger().charges.len(), 1);
}

async fn errors_have_one_shape(url: String) {
    let (app, _) = start_reliable(&url).await;
    app.get("/v1/nope").await.assert_problem(404, "not_found");
    app.send(Method::DELETE, "/v1/orders", &[], None).await.assert_problem(405, "method_not_allowed");
    let big = json!({"order_no": "O-1", "amount": 1, "currency": "CNY", "pad": "x".repeat(70 * 1024)});
    app.post("/v1/orders", big).await.assert_problem(413, "payload_too_large");
    let plain = app.client.post(format!("{}/v1/orders", app.base)).body("{}").send().await.unwrap();
    common::into_answer(plain).await.assert_problem(415, "unsupported_media_type");
    let token = app.token().await;
    let plain = app
        .client
        .post(format!("{}/v1/payments", app.base))
        .header("idempotency-key", &token)
        .body("{}")
        .send()
        .await
        .unwrap();
    common::into_answer(plain).await.assert_problem(415, "unsupported_media_type");
    app.post("/v1/orders", json!({"order_no": "O 1", "amount": 1, "currency": "CNY"}))
        .await
        .assert_problem(400, "invalid_request");
    app.post("/v1/orders", json!({"order_no": "O-1", "amount": 1.5, "currency": "CNY"}))
        .await
        .assert_problem(400, "invalid_request");
    app.post("/v1/orders", json!({"order_no": "O-1", "amount": 100, "currency": "CNY"})).await;
    app.post("/v1/orders", json!({"order_no": "O-1", "amount": 200, "currency": "CNY"}))
        .await
        .assert_problem(409, "order_conflict");
    assert_eq!(app.post("/v1/orders", json!({"order_no": "O-1", "amount": 100, "currency": "CNY"})).await.status, 200);
    app.get("/v1/workflows?state=bogus").await.assert_problem(400, "invalid_request");
    app.get("/v1/workflows/none").await.assert_problem(404, "workflow_not_found");
    assert_eq!(app.get("/healthz").await.status, 200);
    assert_eq!(app.get("/readyz").await.status, 200);
    let metrics = app.get("/metrics").await;
    assert!(metrics.text.contains("onceflow_http_requests_total"), "{}", metrics.text);
    assert!(metrics.text.contains("onceflow_workflows"), "{}", metrics.text);
}

async fn five_hundred_requests_one_token(url: String) {
    let channel = MockChannel::new(MockChannelConfig { latency_ms: 50, ..Default::default() });
    let app = Arc::new(start(&url, Arc::new(channel.clone()), Auth::SingleTenant).await);
    app.order("O-storm", 1000).await;
    let token = app.token().await;
    let mut tasks = Vec::new();
    for _ in 0..500 {
        let (app, token) = (app.clone(), token.clone());
        tasks.push(tokio::spawn(async move { app.pay(&token, pay_body("O-storm", 1000)).await }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.iter().all(|a| a.status == 201 && a.text == answers[0].text), "identical 201s");
    assert_eq!(channel.ledger().charges.len(), 1);
    assert_eq!(channel.ledger().charge_calls, 1);
}

on_every_backend!(
    every_row_of_the_payments_table,
    declines_and_slow_payments,
    tenants_see_only_their_own,
    original_design_routes,
    errors_have_one_shape,
    five_hundred_requests_one_token,
);

/// The document says what the server does (what schemathesis checks): errors are problem+json, the statuses
/// every operation can answer are listed, and request fields carry the constraints the server checks.
/// Which check answers first is part of the contract a client sees: the token before the body's fields on both
/// payment routes, and on the original design's route an invalid order number is an unknown order, as it was.
#[tokio::test]
async fn the_order_of_checks_is_kept() {
    let (app, _) = start_reliable(&database("sqlite").await.unwrap()).await;
    app.order("O-c", 1000).await;
    // The header is the token: a malformed `token` in the body beside it is not looked at.
    let token = app.token().await;
    let body = json!({"order_no": "O-c", "amount": 1000, "currency": "CNY", "token": "not a token!"});
    let paid = app.pay(&token, body).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    // The original design's route: the token first, then the order, then the rest.
    let legacy = |token: &str, order_no: &str, request_no: &str| json!({"token": token, "order_no": order_no, "request_no": request_no, "amount": 1000});
    app.post("/pay", legacy("bad token!", "a b", "R-1")).await.assert_problem(400, "idempotency_key_invalid");
    let token = app.send(Method::POST, "/tokens", &[], None).await.json()["token"].as_str().unwrap().to_owned();
    app.post("/pay", legacy(&token, "a b", "R-1")).await.assert_problem(404, "order_not_found");
    app.post("/pay", legacy(&token, "O-none", "..")).await.assert_problem(404, "order_not_found");
    app.post("/pay", legacy(&token, "O-c", "..")).await.assert_problem(400, "invalid_request");
}

#[tokio::test]
async fn openapi_says_what_the_server_answers() {
    let (app, _) = start_reliable(&database("sqlite").await.unwrap()).await;
    let doc = app.get("/openapi.json").await.json();
    let pay = &doc["paths"]["/v1/payments"]["post"]["responses"];
    for status in ["401", "409", "413", "415", "503"] {
        assert!(pay[status]["content"]["application/problem+json"].is_object(), "{status}: {pay}");
        assert!(pay[status]["content"]["application/json"].is_null(), "{status}: {pay}");
    }
    // The list's filters are optional query parameters (a derived IntoParams says path, and required).
    let list = doc["paths"]["/v1/workflows"]["get"]["parameters"].as_array().unwrap();
    assert!(list.iter().all(|p| p["in"] == "query" && p["required"] == false), "{list:?}");
    assert!(doc["paths"]["/v1/workflows"]["get"]["responses"]["400"].is_object());
    let text = doc.to_string();
    assert!(text.contains(r#""minimum":1"#) && text.contains("^[A-Z]{3}$"), "constraints in the schemas");
    let bad_limit = app.get("/v1/workflows?limit=5000").await;
    bad_limit.assert_problem(400, "invalid_request");
    // A query the server cannot read is a problem too, not axum's plain-text rejection.
    app.get("/v1/workflows?before=yesterday").await.assert_problem(400, "invalid_request");
    // An integer sent as 1000.0 is the integer JSON Schema says it is.
    let order = app.post("/v1/orders", json!({"order_no": "O-f", "amount": 1000.0, "currency": "CNY"})).await;
    assert_eq!(order.status, 201, "{}", order.text);
    // The original design's route answers its `message` for every error, a rejected body included.
    let legacy = app.post("/pay", json!({"order_no": "O-f"})).await;
    assert_eq!(legacy.status, 400, "{}", legacy.text);
    assert!(legacy.json()["message"].is_string(), "{}", legacy.text);
    let big = json!({"token": "t", "order_no": "O-f", "amount": 1, "pad": "x".repeat(70 * 1024)});
    let legacy = app.post("/pay", big).await;
    assert_eq!(legacy.status, 413, "{}", legacy.text);
    assert!(legacy.json()["message"].is_string(), "an oversized body too: {}", legacy.text);
}

#[tokio::test]
async fn openapi_covers_every_route_of_the_contract() {
    let (app, _) = start_reliable(&database("sqlite").await.unwrap()).await;
    let doc = app.get("/openapi.json").await.json();
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
    let contract = [
        ("post", "/v1/orders"),
        ("get", "/v1/orders/{order_no}"),
        ("post", "/v1/tokens"),
        ("post", "/v1/payments"),
        ("get", "/v1/payments/{request_no}"),
        ("get", "/v1/payments"),
        ("post", "/tokens"),
        ("post", "/pay"),
        ("get", "/v1/workflows"),
        ("get", "/v1/workflows/{workflow_id}"),
        ("post", "/v1/workflows/{workflow_id}/retry"),
        ("post", "/v1/workflows/{workflow_id}/cancel"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
    ];
    for (method, path) in contract {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is missing from /openapi.json");
        let concrete = path.replace("{order_no}", "x").replace("{request_no}", "x").replace("{workflow_id}", "x");
        let answer = app.send(method.parse().unwrap(), &concrete, &[], None).await;
        assert_ne!(answer.code(), "not_found", "{method} {path} is not routed");
    }
    let text = doc.to_string();
    for code in [
        "idempotency_key_missing",
        "idempotency_key_mismatch",
        "order_not_payable",
        "amount_mismatch",
        "request_no_conflict",
        "payment_declined",
        "unavailable",
    ] {
        assert!(text.contains(code), "error code {code} is not documented");
    }
}

/// The operations whose answers were once described in words alone describe them as schemas that clients
/// generate code from: each `200` has a JSON schema, and the keys of real answers are the keys it lists, all
/// required (a key that is null is sent as null, never left out). A workflow's `state` is one enum, shared with
/// the list's `state` filter.
#[tokio::test]
async fn openapi_describes_the_answers_of_operations() {
    let (app, _) = start_reliable(&database("sqlite").await.unwrap()).await;
    let doc = app.get("/openapi.json").await.json();
    let resolve = |schema: &serde_json::Value| match schema["$ref"].as_str() {
        Some(name) => doc.pointer(name.trim_start_matches('#')).cloned().unwrap_or_default(),
        None => schema.clone(),
    };
    let mut bodies = std::collections::BTreeMap::new();
    for (method, path) in [
        ("get", "/v1/workflows"),
        ("get", "/v1/workflows/{workflow_id}"),
        ("post", "/v1/workflows/{workflow_id}/retry"),
        ("post", "/v1/workflows/{workflow_id}/cancel"),
        ("get", "/v1/payments"),
    ] {
        let schema = &doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {path}: no schema for 200");
        let body = resolve(schema);
        assert!(body["properties"].is_object(), "{method} {path}: {schema} resolves to {body}");
        bodies.insert((method, path), body);
    }
    let workflow = &bodies[&("post", "/v1/workflows/{workflow_id}/retry")];
    assert_eq!(workflow, &bodies[&("post", "/v1/workflows/{workflow_id}/cancel")]);
    let states = json!(["running", "compensating", "completed", "failed", "compensation_failed", "cancelled"]);
    assert_eq!(resolve(&workflow["properties"]["state"])["enum"], states);
    let filter = doc["paths"]["/v1/workflows"]["get"]["parameters"].as_array().unwrap();
    let filter = filter.iter().find(|p| p["name"] == "state").unwrap();
    assert_eq!(resolve(&filter["schema"])["enum"], states);

    // Real answers have only documented keys, and every required one (a field that does not apply to the state
    // shown is absent, so it is documented as not required).
    let keys = |body: &serde_json::Value| {
        let mut keys: Vec<String> = body.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let documented = |schema: &serde_json::Value| {
        let required: Vec<String> =
            schema["required"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_owned()).collect();
        (keys(&schema["properties"]), required)
    };
    #[track_caller]
    fn conforms(body: &serde_json::Value, (properties, required): (Vec<String>, Vec<String>)) {
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| properties.contains(k)), "undocumented keys in {body}: {properties:?}");
        assert!(required.iter().all(|k| keys.contains(&k)), "required keys missing in {body}: {required:?}");
    }
    app.order("O-s", 1000).await;
    assert_eq!(app.pay(&app.token().await, pay_body("O-s", 1000)).await.status, 201);
    let page = app.get("/v1/workflows").await.json();
    conforms(&page, documented(&bodies[&("get", "/v1/workflows")]));
    conforms(&page["workflows"][0], documented(workflow));
    let id = page["workflows"][0]["workflow_id"].as_str().unwrap();
    let detail = app.get(&format!("/v1/workflows/{id}")).await.json();
    let detail_schema = &bodies[&("get", "/v1/workflows/{workflow_id}")];
    conforms(&detail, documented(detail_schema));
    let step = resolve(&detail_schema["properties"]["steps"]["items"]);
    conforms(&detail["steps"][0], documented(&step));
    // A completed payment keeps no compensations (none ran, none will); a declined one lists those it ran.
    assert_eq!(detail["compensations"], json!([]));
    let declines = start_declining().await;
    declines.order("O-d", 1000).await;
    declines.pay(&declines.token().await, pay_body("O-d", 1000)).await.assert_problem(402, "payment_declined");
    let page = declines.get("/v1/workflows").await.json();
    let id = page["workflows"][0]["workflow_id"].as_str().unwrap();
    let detail = declines.get(&format!("/v1/workflows/{id}")).await.json();
    let compensation = resolve(&detail_schema["properties"]["compensations"]["items"]);
    assert!(detail["compensations"].as_array().is_some_and(|c| !c.is_empty()), "{detail}");
    conforms(&detail["compensations"][0], documented(&compensation));
    let payments = app.get("/v1/payments?order_no=O-s").await.json();
    conforms(&payments, documented(&bodies[&("get", "/v1/payments")]));
}

/// An app on a fresh SQLite database whose channel declines every charge.
async fn start_declining() -> App {
    let url = database("sqlite").await.unwrap();
    let declining = MockChannel::new(MockChannelConfig { decline_rate: 1.0, ..Default::default() });
    start(&url, Arc::new(declining), Auth::SingleTenant).await
}

/// Storage going away answers `503 unavailable` with `Retry-After`, fast, with no internal text.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_outage_is_503_with_retry_after() {
    let Some(url) = database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let (app, _) = start_reliable(&url).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let name = url.rsplit('/').next().unwrap().to_owned();
    let admin = sqlx::PgPool::connect(&std::env::var("DATABASE_URL").unwrap()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"))).execute(&admin).await.unwrap();
    let started = std::time::Instant::now();
    for answer in
        [app.token_answer().await, app.pay(&token, pay_body("O-1", 1000)).await, app.get("/v1/orders/O-1").await]
    {
        answer.assert_problem(503, "unavailable");
        assert_eq!(answer.header("retry-after").as_deref(), Some("1"));
        assert!(!answer.text.contains("database"), "no internal text: {}", answer.text);
    }
    assert_eq!(app.get("/readyz").await.status, 503);
    assert!(started.elapsed() < Duration::from_secs(20), "failed fast enough: {:?}", started.elapsed());
}
