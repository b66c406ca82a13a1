//! What an operator reads and does (issue 33): a workflow's steps in the order they ran with only the fields
//! that apply, the audit log of operator actions, search and the unresolved payments — on SQLite, Postgres and
//! MySQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::channel::TestChannel;
use common::{App, database, start};
use onceflow_api::{Auth, OnPayments, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::HttpChannel;
use onceflow_payments::{MockChannel, PaymentStore, Payments};
use serde_json::{Value, json};

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
                let Some(url) = super::database("postgres").await else { return };
                super::$name(url).await;
            }

            #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let Some(url) = super::database("mysql").await else { return };
                super::$name(url).await;
            }
        }
    )*};
}

on_every_backend!(
    steps_read_in_the_order_they_ran,
    a_cancelled_payments_compensations_read_in_the_order_they_ran,
    operator_actions_are_on_the_record_and_outlive_the_history,
    search_finds_a_payment_by_every_number_it_has,
    unresolved_payments_are_listed_with_their_age,
    unresolved_refunds_are_listed_with_their_age,
    control_characters_are_a_clients_mistake,
    every_kind_of_action_is_on_the_record,
    a_redelivery_is_on_the_record,
    search_finds_refunds_events_and_any_tenants_charge,
    a_charge_id_is_looked_up_through_an_index,
    a_search_by_order_reads_one_page_of_its_attempts,
);

const ACME: &str = "acme-secret-key";
const GLOBEX: &str = "globex-secret-key";
const OPERATOR: &str = "operator-secret-key";

fn keys() -> Auth {
    Auth::keys(vec![("acme".into(), ACME.into()), ("globex".into(), GLOBEX.into())])
        .with_operators(vec![("ops".into(), OPERATOR.into())])
}

fn as_key(app: &App, key: &str) -> App {
    App { base: app.base.clone(), client: app.client.clone(), key: Some(key.to_owned()) }
}

fn pay_body(order_no: &str) -> Value {
    json!({"order_no": order_no, "amount": 1000, "currency": "CNY"})
}

/// A channel process of the tests' own (`hold`: how long it keeps a new charge in flight), and the app over it.
async fn app_over_channel(url: &str, hold: Duration) -> (App, TestChannel) {
    let channel = TestChannel::serve(hold, false).await;
    let client = HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap();
    (start(url, Arc::new(client), keys()).await, channel)
}

/// Starts a payment of `order_no` for acme without waiting for it; its workflow id.
async fn start_payment(acme: &App, order_no: &str) -> String {
    acme.order(order_no, 1000).await;
    let token = acme.token().await;
    let headers = [("idempotency-key", token.as_str()), ("prefer", "wait=0")];
    let started = acme.send(reqwest::Method::POST, "/v1/payments", &headers, Some(pay_body(order_no))).await;
    assert!(started.status == 202 || started.status == 201, "{}", started.text);
    let request_no = started.json()["request_no"].as_str().unwrap().to_owned();
    acme.get(&format!("/v1/payments/{request_no}")).await.json()["workflow_id"].as_str().unwrap().to_owned()
}

/// Reads the workflow until it leaves `running` and `compensating` (at most 20 s).
async fn settled(app: &App, workflow_id: &str) -> Value {
    for _ in 0..200 {
        let view = app.get(&format!("/v1/workflows/{workflow_id}")).await.json();
        if !matches!(view["workflow"]["state"].as_str(), Some("running" | "compensating")) {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{workflow_id} did not settle");
}

/// Reads the workflow until it waits on a call to the channel (at most 10 s).
async fn in_flight(app: &App, workflow_id: &str) {
    for _ in 0..100 {
        let view = app.get(&format!("/v1/workflows/{workflow_id}")).await.json();
        if view["waiting_for"].is_object() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{workflow_id} never waited on the channel");
}

fn step_keys(view: &Value) -> Vec<String> {
    view["steps"].as_array().unwrap().iter().map(|s| s["step_key"].as_str().unwrap().to_owned()).collect()
}

async fn steps_read_in_the_order_they_ran(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::ZERO).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    let view = settled(&operator, &workflow_id).await;
    assert_eq!(view["workflow"]["state"], "completed", "{view:#}");
    assert_eq!(step_keys(&view), ["claim_token", "insert_record", "reserve_status", "call_channel", "confirm"]);
    // A completed workflow is not waiting for a next attempt, nor held by a worker, nor failed.
    let workflow = view["workflow"].as_object().unwrap();
    for absent in ["next_attempt_at", "lease_expires_at", "error"] {
        assert!(!workflow.contains_key(absent), "{absent} in {view:#}");
    }
    assert!(workflow.contains_key("output"));
    for step in view["steps"].as_array().unwrap() {
        assert!(!step.as_object().unwrap().contains_key("error"), "{step}");
        assert!(step["finished_at"].is_string(), "{step}");
    }
}

async fn a_cancelled_payments_compensations_read_in_the_order_they_ran(url: String) {
    // The channel holds the charge, so the payment is in the channel call when it is cancelled.
    let (app, channel) = app_over_channel(&url, Duration::from_secs(2)).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    let cancelled = operator.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    let view = settled(&operator, &workflow_id).await;
    assert_eq!(view["workflow"]["state"], "cancelled", "{view:#}");
    // Forward steps first, then the compensations in the reverse of their registration (3, 2, 1, 0).
    let keys = step_keys(&view);
    let forward = ["claim_token", "insert_record", "reserve_status", "call_channel"];
    assert_eq!(keys[..4], forward, "{keys:?}");
    let seqs: Vec<u32> = keys[4..]
        .iter()
        .map(|k| k.strip_prefix("compensate/").and_then(|k| k.split('/').next()).unwrap().parse().unwrap())
        .collect();
    assert!(!seqs.is_empty() && seqs.windows(2).all(|w| w[0] > w[1]), "{keys:?}");
    let workflow = view["workflow"].as_object().unwrap();
    for absent in ["next_attempt_at", "lease_expires_at", "output"] {
        assert!(!workflow.contains_key(absent), "{absent} in {view:#}");
    }
    assert_eq!(workflow["error"]["code"], "cancelled");
    assert_eq!(channel.kept("acme", "O-1"), 0);
}

/// Deletes every finished workflow's history on the database `url` (a retention pass with no time kept).
async fn delete_histories(url: &str) -> u64 {
    struct Delete;
    impl OnPayments for Delete {
        type Output = u64;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> u64 {
            payments.engine().delete_finished_before(i64::MAX, 1000).await.unwrap().workflows
        }
    }
    with_payments(url, Arc::new(MockChannel::reliable()), EngineConfig::default(), 2, Delete).await.unwrap()
}

async fn operator_actions_are_on_the_record_and_outlive_the_history(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::from_secs(2)).await;
    let (acme, globex, operator) = (as_key(&app, ACME), as_key(&app, GLOBEX), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    let path = format!("/v1/workflows/{workflow_id}/cancel");
    // A reason too long, or a body that is not JSON, is refused before anything is done or recorded.
    let long = "x".repeat(501);
    operator.post(&path, json!({"reason": long})).await.assert_problem(400, "invalid_request");
    operator.post(&path, json!({"why": "typo"})).await.assert_problem(400, "invalid_request");
    // A body is JSON (no page of another site can send that unasked); no body at all is no reason, as the
    // contract's plain `POST …/cancel` has it.
    let text = operator.client.post(format!("{}{path}", operator.base)).bearer_auth(OPERATOR);
    let text = common::into_answer(text.header("content-type", "text/plain").body("reason=x").send().await.unwrap());
    text.await.assert_problem(415, "unsupported_media_type");
    let bare = operator.send(reqwest::Method::POST, &path, &[], None).await;
    assert_eq!(bare.status, 200, "no body at all is no reason: {}", bare.text);
    // That cancel went through with no reason; the next one is refused by the engine, and recorded as such.
    let again = operator.post(&path, json!({"reason": "customer called: \"cancel it\" <b>now</b>"})).await;
    again.assert_problem(409, "invalid_state");
    let view = settled(&operator, &workflow_id).await;
    let audit = view["audit"].as_array().unwrap().clone();
    assert_eq!(audit.len(), 2, "{view:#}");
    assert_eq!((audit[0]["actor"].as_str(), audit[0]["action"].as_str()), (Some("ops"), Some("cancel")));
    assert_eq!(audit[0]["status"], 200);
    assert_eq!(audit[0]["result"], "now compensating");
    assert!(audit[0].get("reason").is_none(), "{audit:?}");
    assert_eq!(audit[1]["status"], 409);
    assert_eq!(audit[1]["reason"], "customer called: \"cancel it\" <b>now</b>");
    assert!(audit[1]["result"].as_str().unwrap().starts_with("invalid_state"), "{audit:?}");
    assert_eq!(audit[1]["tenant"], "acme");
    // The tenant sees its own workflow's entries, but not who acted nor why (operators' words, not the
    // tenant's); another tenant none of them.
    let seen = acme.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json()["audit"].clone();
    let mut unnamed = audit.clone();
    for entry in &mut unnamed {
        let entry = entry.as_object_mut().unwrap();
        entry.remove("actor");
        entry.remove("reason");
    }
    assert_eq!(seen, json!(unnamed));
    assert_eq!(acme.get(&format!("/v1/workflows/{workflow_id}")).await.json()["audit"], json!(unnamed));
    assert_eq!(globex.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json()["audit"], json!([]));
    assert_eq!(globex.get("/v1/audit").await.json()["audit"], json!([]));
    // Retention deletes the workflow's history; the record of what operators did to it stays.
    assert!(delete_histories(&url).await >= 1);
    operator.get(&format!("/v1/workflows/{workflow_id}")).await.assert_problem(404, "workflow_not_found");
    let kept = operator.get(&format!("/v1/audit?workflow_id={workflow_id}")).await;
    assert_eq!(kept.json()["audit"], json!(audit), "{}", kept.text);
    let newest = operator.get("/v1/audit?limit=1").await.json();
    assert_eq!(newest["audit"][0]["status"], 409, "newest first: {newest}");
}

/// Without keys (loopback), the actor is `local`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zero_configuration_actor_is_local() {
    let url = database("sqlite").await.unwrap();
    let channel = TestChannel::serve(Duration::from_secs(2), false).await;
    let client = HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap();
    let app = start(&url, Arc::new(client), Auth::SingleTenant).await;
    let workflow_id = start_payment(&app, "O-1").await;
    let cancelled = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({"reason": "test"})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    let audit = app.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json();
    assert_eq!(audit["audit"][0]["actor"], "local", "{audit}");
    assert_eq!(audit["audit"][0]["reason"], "test", "{audit}");
}

/// The numbers a search matched, as `matched:kind:tenant`.
async fn found(app: &App, q: &str) -> Vec<String> {
    let answer = app.get(&format!("/v1/search?q={q}")).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let mut found: Vec<String> = answer.json()["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}:{}:{}",
                m["matched"].as_str().unwrap(),
                m["kind"].as_str().unwrap(),
                m["tenant"].as_str().unwrap_or("-")
            )
        })
        .collect();
    found.sort();
    found
}

async fn search_finds_a_payment_by_every_number_it_has(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::ZERO).await;
    let (acme, globex, operator) = (as_key(&app, ACME), as_key(&app, GLOBEX), as_key(&app, OPERATOR));
    // Both tenants pay an order numbered O-1; acme also has an order nobody paid.
    let token = acme.token().await;
    acme.order("O-1", 1000).await;
    let paid = acme.pay(&token, pay_body("O-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    globex.order("O-1", 1000).await;
    assert_eq!(globex.pay(&globex.token().await, pay_body("O-1")).await.status, 201);
    acme.order("O-unpaid", 1000).await;
    let payment = paid.json();
    let (request_no, charge_id) = (payment["request_no"].as_str().unwrap(), payment["charge_id"].as_str().unwrap());
    let workflow_id =
        acme.get(&format!("/v1/payments/{request_no}")).await.json()["workflow_id"].as_str().unwrap().to_owned();

    assert_eq!(found(&operator, "O-1").await, ["order_no:payment:acme", "order_no:payment:globex"]);
    assert_eq!(found(&acme, "O-1").await, ["order_no:payment:acme"]);
    assert_eq!(found(&globex, "O-unpaid").await, Vec::<String>::new());
    assert_eq!(found(&acme, "O-unpaid").await, ["order_no:order:acme"]);
    for (q, matched) in
        [(request_no, "request_no"), (charge_id, "charge_id"), (&token, "token"), (&workflow_id, "workflow_id")]
    {
        assert_eq!(found(&operator, q).await, [format!("{matched}:payment:acme")], "{q}");
        assert_eq!(found(&acme, q).await, [format!("{matched}:payment:acme")], "{q}");
        assert_eq!(found(&globex, q).await, Vec::<String>::new(), "another tenant's {matched}");
    }
    // A match carries what the console shows: the payment with its workflow, its order, when it was made.
    let m = &operator.get(&format!("/v1/search?q={request_no}")).await.json()["matches"][0];
    assert_eq!(m["payment"]["workflow_id"], workflow_id.as_str());
    assert_eq!(m["payment"]["status"], "succeeded");
    assert_eq!(m["order"]["status"], "paid");
    assert!(m["created_at"].is_string());
    assert_eq!(found(&operator, "nothing-like-it").await, Vec::<String>::new());
    operator.get("/v1/search").await.assert_problem(400, "invalid_request");
    operator.get("/v1/search?q=").await.assert_problem(400, "invalid_request");
    let markup = operator.get("/v1/search?q=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E").await;
    assert_eq!(markup.json()["matches"], json!([]), "{}", markup.text);
}

async fn unresolved_payments_are_listed_with_their_age(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::from_secs(3)).await;
    let (acme, globex, operator) = (as_key(&app, ACME), as_key(&app, GLOBEX), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let listed = operator.get("/v1/unresolved").await.json();
    assert_eq!(listed["count"], 1, "{listed}");
    let first = &listed["payments"][0];
    assert_eq!((first["tenant"].as_str(), first["payment"]["status"].as_str()), (Some("acme"), Some("processing")));
    assert_eq!(first["payment"]["workflow_id"], workflow_id.as_str());
    assert!(first["age_seconds"].as_i64().unwrap() >= 1, "{listed}");
    assert!(listed["oldest_age_seconds"].as_i64().unwrap() >= 1, "{listed}");
    assert_eq!(acme.get("/v1/unresolved").await.json()["count"], 1);
    let none = globex.get("/v1/unresolved").await.json();
    assert_eq!((none["count"].as_i64(), none["payments"].as_array().map(Vec::len)), (Some(0), Some(0)), "{none}");
    assert!(none.get("oldest_age_seconds").is_none());
    // Once the channel answers, it is resolved.
    settled(&operator, &workflow_id).await;
    assert_eq!(operator.get("/v1/unresolved").await.json()["count"], 0);
}

/// A NUL or another control character in what a client sends to the operations routes is its mistake (`400`),
/// whatever the database would make of it.
async fn control_characters_are_a_clients_mistake(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::from_secs(2)).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    for path in [
        "/v1/search?q=%00",
        "/v1/search?q=O-1%00",
        "/v1/search?q=O%01-1",
        "/v1/search?q=O-1&tenant=ac%00me",
        "/v1/audit?workflow_id=pay%3A%00",
        "/v1/audit?tenant=%00",
        "/v1/unresolved?tenant=%00",
        "/v1/workflows?tenant=%00",
        "/v1/workflows?name=pay%00ment",
    ] {
        operator.get(path).await.assert_problem(400, "invalid_request");
    }
    acme.get("/v1/search?q=%00").await.assert_problem(400, "invalid_request");
    let path = format!("/v1/workflows/{workflow_id}/cancel");
    for reason in ["nul\u{0}byte", "bell\u{7}", "escape\u{1b}[31m", "c1\u{85}"] {
        operator.post(&path, json!({"reason": reason})).await.assert_problem(400, "invalid_request");
    }
    let audit = operator.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json();
    assert_eq!(audit["audit"], json!([]), "nothing refused is recorded: {audit}");
    // The console behind a proxy that forwards the name the browser used: its own origin, not another site's.
    let proxied = [("origin", "https://ops.example"), ("x-forwarded-host", "ops.example")];
    let asked = operator.send(reqwest::Method::POST, &path, &proxied, Some(json!({"reason": "x\u{0}"}))).await;
    asked.assert_problem(400, "invalid_request");
    let elsewhere = [("origin", "https://evil.example"), ("x-forwarded-host", "ops.example")];
    let refused = operator.send(reqwest::Method::POST, &path, &elsewhere, Some(json!({}))).await;
    refused.assert_problem(403, "forbidden");
    // A line break is a reason's own.
    let cancelled = operator.post(&path, json!({"reason": "line one\nline two"})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
}

/// Retry, cancel, query-channel and redeliver are each recorded with who, why and what came of it.
async fn every_kind_of_action_is_on_the_record(url: String) {
    let (app, channel) = app_over_channel(&url, Duration::from_secs(3)).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    in_flight(&operator, &workflow_id).await;
    let asked = operator
        .post(&format!("/v1/workflows/{workflow_id}/query-channel"), json!({"reason": "customer is waiting"}))
        .await;
    assert_eq!(asked.status, 200, "{}", asked.text);
    let view = settled(&operator, &workflow_id).await;
    assert_eq!(view["workflow"]["state"], "completed", "{view:#}");
    let audit = view["audit"].as_array().unwrap().clone();
    assert_eq!(audit.len(), 1, "{view:#}");
    assert_eq!(audit[0]["action"], "query_channel");
    assert_eq!(audit[0]["actor"], "ops");
    assert_eq!(audit[0]["reason"], "customer is waiting");
    assert_eq!(audit[0]["status"], 200, "{audit:?}");
    assert_eq!(audit[0]["tenant"], "acme");

    drop(channel);
}

/// An action whose client goes away before the answer is still taken to its end, and its audit entry completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_whose_client_left_is_still_recorded() {
    let url = database("sqlite").await.unwrap();
    // The channel holds the charge: query-channel waits its 2 s for the workflow, which does not end.
    let (app, _channel) = app_over_channel(&url, Duration::from_secs(20)).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    let workflow_id = start_payment(&acme, "O-1").await;
    in_flight(&operator, &workflow_id).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let left = impatient
        .post(format!("{}/v1/workflows/{workflow_id}/query-channel", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"reason": "left early"}))
        .send()
        .await;
    assert!(left.is_err(), "the client gave up before the answer: {left:?}");
    let mut audit = Value::Null;
    for _ in 0..60 {
        audit = operator.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json();
        if audit["audit"][0]["status"].is_number() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(audit["audit"][0]["action"], "query_channel", "{audit}");
    assert_eq!(audit["audit"][0]["status"], 200, "completed although its client left: {audit}");
}

/// Without keys, an operator action is taken only when asked for in JSON by this server's own page (or a client
/// that is no browser): another site's page can reach a loopback service, but not act through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zero_configuration_actions_refuse_other_sites() {
    let url = database("sqlite").await.unwrap();
    let channel = TestChannel::serve(Duration::from_secs(5), false).await;
    let client = HttpChannel::new(&channel.url, Duration::from_secs(10)).unwrap();
    let app = start(&url, Arc::new(client), Auth::SingleTenant).await;
    let workflow_id = start_payment(&app, "O-1").await;
    let json_ct = ("content-type", "application/json");
    let paths = [
        format!("/v1/workflows/{workflow_id}/cancel"),
        format!("/v1/workflows/{workflow_id}/retry"),
        format!("/v1/workflows/{workflow_id}/query-channel"),
        "/v1/events/evt_00000000000000000000000000/redeliver".to_owned(),
    ];
    for path in &paths {
        // What a form or a no-cors fetch can send: a body of another type than JSON.
        for kind in ["text/plain", "application/x-www-form-urlencoded"] {
            let sent = app.client.post(format!("{}{path}", app.base)).header("content-type", kind).body("reason=x");
            let answer = common::into_answer(sent.send().await.unwrap()).await;
            answer.assert_problem(415, "unsupported_media_type");
        }
        for other in [
            vec![json_ct, ("sec-fetch-site", "cross-site")],
            vec![json_ct, ("sec-fetch-site", "same-site")],
            vec![json_ct, ("origin", "https://evil.example")],
            vec![json_ct, ("origin", "http://127.0.0.1:1")],
            vec![json_ct, ("origin", "null")],
        ] {
            let answer = app.send(reqwest::Method::POST, path, &other, Some(json!({"reason": "csrf"}))).await;
            // Refused by the action (`forbidden`), or before it by the keyless mode's own check
            // (`cross_site_request`, `routes/host.rs`), whichever sees it first.
            assert_eq!(answer.status, 403, "{other:?}: {}", answer.text);
        }
    }
    let audit = app.get("/v1/audit").await.json();
    assert_eq!(audit["audit"], json!([]), "nothing refused is recorded: {audit}");
    // The console's own request: same origin.
    let origin = app.base.clone();
    let own = [json_ct, ("origin", origin.as_str()), ("sec-fetch-site", "same-origin")];
    let cancelled = app.send(reqwest::Method::POST, &paths[0], &own, Some(json!({"reason": "mine"}))).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
}

/// An event sent again is recorded with the event it names and whose it is: an operator's with its reason, a
/// tenant's own as the tenant's.
async fn a_redelivery_is_on_the_record(url: String) {
    let hooked = common::webhooks::start(&url, keys(), common::webhooks::local(&[1])).await;
    let (acme, operator) = (hooked.as_key(ACME), hooked.as_key(OPERATOR));
    let event = common::webhooks::event("acme", "R-1");
    let event_id = event.id();
    hooked.write(event).await;
    let again =
        operator.post(&format!("/v1/events/{event_id}/redeliver"), json!({"reason": "endpoint was down"})).await;
    assert_eq!(again.status, 202, "{}", again.text);
    let newest = operator.get("/v1/audit?limit=1").await.json();
    let entry = &newest["audit"][0];
    assert_eq!(entry["action"], "redeliver", "{newest}");
    assert_eq!(entry["subject"], event_id.as_str());
    assert_eq!(entry["reason"], "endpoint was down");
    assert_eq!(entry["status"], 202, "{newest}");
    assert_eq!(entry["tenant"], "acme");
    let own = acme.post(&format!("/v1/events/{event_id}/redeliver"), json!({})).await;
    assert_eq!(own.status, 202, "{}", own.text);
    let newest = operator.get("/v1/audit?limit=1").await.json();
    assert_eq!(newest["audit"][0]["actor"], "tenant:acme", "{newest}");
    // Another tenant's event is not found, and nothing is recorded of it.
    let globex = hooked.as_key(GLOBEX);
    globex.post(&format!("/v1/events/{event_id}/redeliver"), json!({})).await.assert_problem(404, "event_not_found");
    assert_eq!(operator.get("/v1/audit").await.json()["audit"].as_array().unwrap().len(), 2);
}

/// A refund's number and an event's id name their payment; an operator finds a charge id of any tenant stored
/// (one no key names, too), a tenant its own only.
async fn search_finds_refunds_events_and_any_tenants_charge(url: String) {
    let hooked = common::webhooks::start(&url, keys(), common::webhooks::local(&[1])).await;
    let (acme, globex, operator) = (hooked.as_key(ACME), hooked.as_key(GLOBEX), hooked.as_key(OPERATOR));
    acme.order("O-1", 1000).await;
    let paid = acme.pay(&acme.token().await, pay_body("O-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    let request_no = paid.json()["request_no"].as_str().unwrap().to_owned();
    let refunded = acme.refund(&acme.token().await, &request_no, json!({"amount": 100, "refund_no": "RF-1"})).await;
    assert_eq!(refunded.status, 201, "{}", refunded.text);
    assert_eq!(found(&operator, "RF-1").await, ["refund_no:payment:acme"]);
    assert_eq!(found(&acme, "RF-1").await, ["refund_no:payment:acme"]);
    assert_eq!(found(&globex, "RF-1").await, Vec::<String>::new());

    let event = common::webhooks::event("acme", &request_no);
    let event_id = event.id();
    hooked.write(event).await;
    assert_eq!(found(&operator, &event_id).await, ["event_id:payment:acme"]);
    assert_eq!(found(&acme, &event_id).await, ["event_id:payment:acme"]);
    assert_eq!(found(&globex, &event_id).await, Vec::<String>::new());

    // A tenant that no key names (its payments came by another way: a message queue, a key since removed).
    struct Pay;
    impl OnPayments for Pay {
        type Output = String;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> String {
            use onceflow_payments::{Currency, OrderNo, PaymentRequest};
            let cny = Currency::parse("CNY").unwrap();
            let order_no = OrderNo::parse("I-1").unwrap();
            payments.create_order("initech", &order_no, 1000, &cny).await.unwrap();
            let token = payments.issue_token("initech").await.unwrap().token;
            let request = PaymentRequest::new(order_no, 1000, cny, None).unwrap();
            let r = payments.pay("initech", &token, "/v1/payments", &request, Duration::from_secs(10)).await.unwrap();
            let body: Value = serde_json::from_str(&r.body).unwrap();
            body["charge_id"].as_str().unwrap().to_owned()
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    let charge_id = with_payments(&url, channel, EngineConfig::default(), 2, Pay).await.unwrap();
    // (Each mock channel numbers its charges alike: acme's may have the same id; each is found as its own.)
    let initech = "charge_id:payment:initech".to_owned();
    assert!(found(&operator, &charge_id).await.contains(&initech), "{charge_id}");
    assert!(!found(&acme, &charge_id).await.contains(&initech));
    let only = operator.get(&format!("/v1/search?q={charge_id}&tenant=acme")).await.json();
    assert!(only["matches"].as_array().unwrap().iter().all(|m| m["tenant"] == "acme"), "{only}");
}

/// A search by charge id reads the index `payments_charge` (migration 0058), not every payment: the planner of
/// each backend may use it for the store's statement (PostgreSQL told not to scan the table, which on a small
/// one it would prefer).
async fn a_charge_id_is_looked_up_through_an_index(url: String) {
    let (_app, _channel) = app_over_channel(&url, Duration::ZERO).await;
    let plan: String = if url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let sql = "EXPLAIN QUERY PLAN SELECT * FROM payments WHERE charge_id = $1 AND ($2 IS NULL OR tenant = $2) \
                   ORDER BY created_at DESC, request_no DESC LIMIT $3";
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sql).bind("ch_1").bind(None::<String>).bind(50).fetch_all(&pool).await.unwrap();
        rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
    } else if url.starts_with("mysql:") {
        let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
        let sql = "EXPLAIN FORMAT=JSON SELECT * FROM payments WHERE charge_id = ? AND (? IS NULL OR tenant = ?) \
                   ORDER BY created_at DESC, request_no DESC LIMIT ?";
        let row: (String,) = sqlx::query_as(sql)
            .bind("ch_1")
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(50)
            .fetch_one(&pool)
            .await
            .unwrap();
        row.0
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        sqlx::query("SET enable_seqscan = off").execute(&pool).await.unwrap();
        let sql = "EXPLAIN SELECT * FROM payments WHERE charge_id = $1 AND ($2::text IS NULL OR tenant = $2) \
                   ORDER BY created_at DESC, request_no DESC LIMIT $3";
        let rows: Vec<(String,)> =
            sqlx::query_as(sql).bind("ch_1").bind(None::<String>).bind(50i64).fetch_all(&pool).await.unwrap();
        rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n")
    };
    assert!(plan.contains("payments_charge"), "{plan}");
}

/// A refund the channel says is processing is unresolved too: listed with its age, to its tenant and operators.
async fn unresolved_refunds_are_listed_with_their_age(url: String) {
    let (app, channel) = app_over_channel(&url, Duration::ZERO).await;
    let (acme, globex, operator) = (as_key(&app, ACME), as_key(&app, GLOBEX), as_key(&app, OPERATOR));
    acme.order("O-1", 1000).await;
    let paid = acme.pay(&acme.token().await, pay_body("O-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    let request_no = paid.json()["request_no"].as_str().unwrap().to_owned();
    channel.set_refund_mode(common::channel::RefundMode::Processing);
    let body = json!({"amount": 100, "refund_no": "RF-1"});
    let refund = acme
        .send(
            reqwest::Method::POST,
            &format!("/v1/payments/{request_no}/refunds"),
            &[("idempotency-key", acme.token().await.as_str()), ("prefer", "wait=0")],
            Some(body),
        )
        .await;
    assert!(refund.status == 202 || refund.status == 201, "{}", refund.text);
    let mut listed = Value::Null;
    for _ in 0..100 {
        listed = operator.get("/v1/unresolved").await.json();
        if listed["refund_count"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(listed["refund_count"], 1, "{listed}");
    let first = &listed["refunds"][0];
    assert_eq!((first["tenant"].as_str(), first["refund"]["refund_no"].as_str()), (Some("acme"), Some("RF-1")));
    assert!(first["age_seconds"].as_i64().is_some(), "{listed}");
    let own = acme.get("/v1/unresolved").await.json();
    assert_eq!(
        (own["refund_count"].as_i64(), own["refunds"][0]["refund"]["refund_no"].as_str()),
        (Some(1), Some("RF-1"))
    );
    let none = globex.get("/v1/unresolved").await.json();
    assert_eq!((none["refund_count"].as_i64(), none["refunds"].as_array().map(Vec::len)), (Some(0), Some(0)), "{none}");
}

/// Found by review: a search by order number read every payment of the order (each refused attempt on a paid order
/// is a record, kept for good, so a tenant could make that read as long as it liked) before the 50-match cap. It
/// reads one page, newest first: 60 attempts are 50 matches, the paid one (the oldest) not among them.
async fn a_search_by_order_reads_one_page_of_its_attempts(url: String) {
    let (app, _channel) = app_over_channel(&url, Duration::ZERO).await;
    let acme = as_key(&app, ACME);
    acme.order("O-1", 1000).await;
    let paid = acme.pay(&acme.token().await, pay_body("O-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    for _ in 0..59 {
        acme.pay(&acme.token().await, pay_body("O-1")).await.assert_problem(409, "order_not_payable");
    }
    let answer = acme.get("/v1/search?q=O-1").await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let matches = answer.json()["matches"].as_array().unwrap().clone();
    assert_eq!(matches.len(), 50, "{}", answer.text);
    assert!(matches.iter().all(|m| m["payment"]["status"] == "failed"), "the newest first: {}", answer.text);
}
