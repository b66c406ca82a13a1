//! What an operator reads and does (issue 33): a workflow's steps in the order they ran with only the fields
//! that apply, the audit log of operator actions, search and the unresolved payments — on SQLite, Postgres and
//! MySQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::channel::TestChannel;
use common::{App, database, start};
use onceflow_api::Auth;
use onceflow_payments::HttpChannel;
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

on_every_backend!(steps_read_in_the_order_they_ran, a_cancelled_payments_compensations_read_in_the_order_they_ran);

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
