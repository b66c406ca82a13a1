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
    let text = operator.send(reqwest::Method::POST, &path, &[("content-type", "text/plain")], None).await;
    assert_eq!(text.status, 200, "no body at all is no reason: {}", text.text);
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
    // The tenant sees its own workflow's entries; another tenant none of them.
    assert_eq!(acme.get(&format!("/v1/audit?workflow_id={workflow_id}")).await.json()["audit"], json!(audit));
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
