//! Every outcome's event (contracts/events.md, issue 32's second part) over HTTP, on every backend, against a channel
//! written from the protocol alone (`common::channel`): a payment answered `201` has its `payment.succeeded`, a
//! declined one its `payment.declined`, one the channel refused (its number holds another charge) its `payment.failed`,
//! one an operator cancelled after its charge was taken its `payment.refunded`, one whose refund the channel would not
//! make (kept after a failed refund) its `payment.succeeded`; refunds partial and whole their `refund.succeeded` (and
//! no `payment.refunded`: merchant refunds never emit it), refused or failed ones their `refund.failed`; one cancelled
//! before any charge its `payment.failed`. Each appears in `GET /v1/events` once, its data the payment or refund as its
//! `GET` answers it; repeats write no second one; a payment refused before its channel step writes none.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::App;
use common::channel::{ChargeMode, RefundMode, TestChannel};
use onceflow_api::Auth;
use onceflow_payments::{HttpChannel, MockChannel, MockChannelConfig, Token, payment_workflow_id};
use reqwest::Method;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(30);

macro_rules! on_every_backend {
    ($scenario:ident: $($name:ident => $backend:ident),+ $(,)?) => {
        $( backend_test!($backend, $name, $scenario); )+
    };
}

/// One test of `$scenario` on `$backend`, ignored where its server's URL is not set.
macro_rules! backend_test {
    (sqlite, $name:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let url = common::database("sqlite").await.expect("sqlite always runs");
            $scenario(&url).await;
        }
    };
    (postgres, $name:ident, $scenario:ident) => {
        #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database("postgres").await else { return };
            $scenario(&url).await;
        }
    };
    (mysql, $name:ident, $scenario:ident) => {
        #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database("mysql").await else { return };
            $scenario(&url).await;
        }
    };
}

fn pay_body(order_no: &str, amount: i64, request_no: &str) -> Value {
    json!({"order_no": order_no, "amount": amount, "currency": "CNY", "request_no": request_no})
}

/// A payment of a new order under a new token, waiting up to `wait` s; the token and the answer.
async fn pay(app: &App, order_no: &str, amount: i64, request_no: &str, wait: u64) -> (String, common::Answer) {
    app.order(order_no, amount).await;
    let token = app.token().await;
    let prefer = format!("wait={wait}");
    let answer = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &token), ("prefer", &prefer)],
            Some(pay_body(order_no, amount, request_no)),
        )
        .await;
    (token, answer)
}

/// The whole event log, in commit order.
async fn log(app: &App) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/events?limit=100&after={c}"),
            None => "/v1/events?limit=100".to_owned(),
        };
        let page = app.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let page = page.json();
        let got = page["events"].as_array().unwrap().clone();
        let full = got.len() == 100;
        events.extend(got);
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if !full {
            return events;
        }
    }
}

/// The events whose data is `number`'s (a payment's `request_no`, or a refund's `refund_no`), waiting until
/// there are `expected` (the Postgres log shows an event once older transactions ended), and a little more,
/// to see that no second one comes.
async fn events_of(app: &App, key: &str, number: &str, expected: usize) -> Vec<Value> {
    let started = Instant::now();
    let mine = |events: Vec<Value>| -> Vec<Value> {
        events
            .into_iter()
            .filter(|e| {
                e["data"][key] == number && (key != "request_no" || e["type"].as_str().unwrap().starts_with("payment."))
            })
            .collect()
    };
    loop {
        let found = mine(log(app).await);
        if found.len() >= expected {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return mine(log(app).await);
        }
        assert!(started.elapsed() < WITHIN, "{expected} event(s) of {number}, found {found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The one event of payment `request_no`: its type asserted, its shape that of the contract, its data what
/// `GET /v1/payments/{request_no}` answers now.
async fn payment_event(app: &App, request_no: &str, kind: &str) -> Value {
    let events = events_of(app, "request_no", request_no, 1).await;
    assert_eq!(events.len(), 1, "one event of {request_no}: {events:?}");
    let e = events[0].clone();
    assert_eq!(e["type"], kind, "{e}");
    assert_contract_shape(&e);
    let now = app.get(&format!("/v1/payments/{request_no}")).await;
    assert_eq!(now.status, 200, "{}", now.text);
    assert_eq!(e["data"], now.json(), "the data is the payment as its GET answers it");
    e
}

/// The one event of refund `refund_no`, as [`payment_event`].
async fn refund_event(app: &App, refund_no: &str, kind: &str) -> Value {
    let events = events_of(app, "refund_no", refund_no, 1).await;
    assert_eq!(events.len(), 1, "one event of {refund_no}: {events:?}");
    let e = events[0].clone();
    assert_eq!(e["type"], kind, "{e}");
    assert_contract_shape(&e);
    let now = app.get(&format!("/v1/refunds/{refund_no}")).await;
    assert_eq!(now.status, 200, "{}", now.text);
    assert_eq!(e["data"], now.json(), "the data is the refund as its GET answers it");
    e
}

/// `{"id": "evt_…", "type", "created_at": RFC 3339, "tenant", "data": {…}}`, and the same by its id.
fn assert_contract_shape(e: &Value) {
    let id = e["id"].as_str().unwrap();
    assert!(id.starts_with("evt_") && id.len() == 30, "{e}");
    assert!(chrono::DateTime::parse_from_rfc3339(e["created_at"].as_str().unwrap()).is_ok(), "{e}");
    assert_eq!(e["tenant"], "default", "{e}");
    assert!(e["data"].is_object(), "{e}");
}

/// Waits until payment `request_no` is no longer `processing`; its body.
async fn payment_settled(app: &App, request_no: &str) -> Value {
    let started = Instant::now();
    loop {
        let p = app.get(&format!("/v1/payments/{request_no}")).await;
        if p.status == 200 && p.json()["status"] != "processing" {
            return p.json();
        }
        assert!(started.elapsed() < WITHIN, "{request_no} still processing: {}", p.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the workflow is in a final state; its state.
async fn final_state(app: &App, workflow_id: &str) -> String {
    let started = Instant::now();
    loop {
        let w = app.get(&format!("/v1/workflows/{workflow_id}")).await;
        let state = w.json()["workflow"]["state"].as_str().unwrap_or_default().to_owned();
        if !matches!(state.as_str(), "running" | "compensating" | "") {
            return state;
        }
        assert!(started.elapsed() < WITHIN, "workflow {workflow_id} still {state}: {}", w.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start(url: &str) -> (App, TestChannel) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let http = Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap());
    (common::start(url, http, Auth::SingleTenant).await, channel)
}

on_every_backend!(payments_write_their_outcomes_events:
    payment_events_sqlite => sqlite, payment_events_postgres => postgres, payment_events_mysql => mysql);

/// Each way a payment that reached its channel step ends, its one event; a refused one, none; a repeat, none.
async fn payments_write_their_outcomes_events(url: &str) {
    let (app, channel) = start(url).await;

    // Succeeded: answered 201, its event the payment as GET shows it.
    let (token, paid) = pay(&app, "O-1", 1000, "P-1", 10).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    let e = payment_event(&app, "P-1", "payment.succeeded").await;
    assert_eq!((e["data"]["status"].as_str(), e["data"]["refunded_amount"].as_i64()), (Some("succeeded"), Some(0)));
    // The same request again (a replay of the stored answer): no second event.
    let again = app.pay(&token, pay_body("O-1", 1000, "P-1")).await;
    assert_eq!(again.status, 201, "{}", again.text);
    assert_eq!(payment_event(&app, "P-1", "payment.succeeded").await["id"], e["id"]);

    // Refused before the channel (the order is paid): no event.
    let (_, refused) = pay(&app, "O-2", 500, "P-2", 10).await;
    assert_eq!(refused.status, 201, "{}", refused.text);
    let token = app.token().await;
    app.pay(&token, pay_body("O-2", 500, "P-2b")).await.assert_problem(409, "order_not_payable");
    assert!(events_of(&app, "request_no", "P-2b", 0).await.is_empty(), "a refusal before the channel writes none");

    // Declined by the channel (a charge held processing, then declined).
    channel.set_charge_mode(ChargeMode::Processing);
    let (_, held) = pay(&app, "O-3", 700, "P-3", 1).await;
    assert_eq!(held.status, 202, "{}", held.text);
    channel.settle_charges("declined");
    assert_eq!(payment_settled(&app, "P-3").await["status"], "declined");
    let e = payment_event(&app, "P-3", "payment.declined").await;
    assert!(e["data"]["decline_code"].is_string(), "{e}");

    // Cancelled by an operator after its charge was taken: the compensation refunds it whole.
    let (token, held) = pay(&app, "O-4", 800, "P-4", 1).await;
    assert_eq!(held.status, 202, "{}", held.text);
    let workflow = payment_workflow_id(&Token::parse(&token).unwrap());
    let cancel = app.post(&format!("/v1/workflows/{workflow}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    channel.settle_charges("succeeded");
    assert_eq!(final_state(&app, &workflow).await, "cancelled");
    let events = events_of(&app, "request_no", "P-4", 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "payment.refunded", "{e}");
    assert_contract_shape(e);
    assert_eq!((e["data"]["status"].as_str(), e["data"]["refunded_amount"].as_i64()), (Some("failed"), Some(800)));
    let now = app.get("/v1/payments/P-4").await.json();
    for field in ["amount", "currency", "order_no", "request_no", "status", "workflow_id"] {
        assert_eq!(e["data"][field], now[field], "{field}");
    }

    // Kept after a failed refund: cancelled, its refund failed at the channel, the payment rolled forward.
    channel.set_refund_mode(RefundMode::Fail);
    let (token, held) = pay(&app, "O-5", 900, "P-5", 1).await;
    assert_eq!(held.status, 202, "{}", held.text);
    let workflow = payment_workflow_id(&Token::parse(&token).unwrap());
    let cancel = app.post(&format!("/v1/workflows/{workflow}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    channel.settle_charges("succeeded");
    assert_eq!(final_state(&app, &workflow).await, "completed");
    let e = payment_event(&app, "P-5", "payment.succeeded").await;
    assert_eq!(e["data"]["status"], "succeeded");
    channel.set_refund_mode(RefundMode::Succeed);
    channel.set_charge_mode(ChargeMode::Succeed);

    // Refused by the channel (its number holds another charge, of other fields): failed.
    let other = json!({"merchant_id": "default", "merchant_request_no": "P-6", "order_no": "elsewhere",
        "amount": 1, "currency": "CNY"});
    let made = reqwest::Client::new().post(format!("{}/v1/charges", channel.url)).json(&other).send().await.unwrap();
    assert!(made.status().is_success());
    let (_, conflict) = pay(&app, "O-6", 600, "P-6", 10).await;
    conflict.assert_problem(422, "channel_refused");
    let e = payment_event(&app, "P-6", "payment.failed").await;
    assert_eq!(e["data"]["status"], "failed");

    // Every payment that ended after its channel step has its one event, and every event its payment.
    let log = log(&app).await;
    let payments: Vec<&str> = log.iter().filter_map(|e| e["data"]["request_no"].as_str()).collect();
    assert_eq!(payments.len(), log.len());
    let mut sorted = payments.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["P-1", "P-2", "P-3", "P-4", "P-5", "P-6"], "{log:?}");
}

on_every_backend!(refunds_write_their_outcomes_events:
    refund_events_sqlite => sqlite, refund_events_postgres => postgres, refund_events_mysql => mysql);

/// Refunds partial and whole: `refund.succeeded` each, no `payment.refunded`; refused and failed ones:
/// `refund.failed`; a repeat: nothing more.
async fn refunds_write_their_outcomes_events(url: &str) {
    let (app, channel) = start(url).await;
    let (_, paid) = pay(&app, "O-1", 1000, "P-1", 10).await;
    assert_eq!(paid.status, 201, "{}", paid.text);

    let token = app.token().await;
    let part = app.refund(&token, "P-1", json!({"amount": 400, "refund_no": "RF-1", "reason": "one of two"})).await;
    assert_eq!(part.status, 201, "{}", part.text);
    let e = refund_event(&app, "RF-1", "refund.succeeded").await;
    assert_eq!((e["data"]["amount"].as_i64(), e["data"]["status"].as_str()), (Some(400), Some("succeeded")));
    // The same request again: its answer replayed, no second event.
    let again = app.refund(&token, "P-1", json!({"amount": 400, "refund_no": "RF-1", "reason": "one of two"})).await;
    assert_eq!(again.status, 201, "{}", again.text);
    assert_eq!(refund_event(&app, "RF-1", "refund.succeeded").await["id"], e["id"]);

    let rest = app.refund(&app.token().await, "P-1", json!({"amount": 600, "refund_no": "RF-2"})).await;
    assert_eq!(rest.status, 201, "{}", rest.text);
    refund_event(&app, "RF-2", "refund.succeeded").await;
    assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "refunded");

    // More than is left: refused, the refund recorded failed.
    let more = app.refund(&app.token().await, "P-1", json!({"amount": 1, "refund_no": "RF-3"})).await;
    more.assert_problem(409, "refund_exceeds_payment");
    refund_event(&app, "RF-3", "refund.failed").await;

    // Failed by the channel.
    let (_, paid) = pay(&app, "O-2", 500, "P-2", 10).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    channel.set_refund_mode(RefundMode::Fail);
    let failed = app.refund(&app.token().await, "P-2", json!({"amount": 500, "refund_no": "RF-4"})).await;
    assert!(failed.status >= 400, "{}", failed.text);
    let e = refund_event(&app, "RF-4", "refund.failed").await;
    assert_eq!(e["data"]["status"], "failed");

    // The payment keeps its one event, `payment.succeeded`: merchant refunds never emit `payment.refunded`.
    let events = events_of(&app, "request_no", "P-1", 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "payment.succeeded");
    assert_eq!(events[0]["data"]["refunded_amount"], 0, "the payment as it was when it succeeded");
    let log = log(&app).await;
    assert!(log.iter().all(|e| e["type"] != "payment.refunded"), "{log:?}");
    let kinds: Vec<(&str, &str)> = log
        .iter()
        .map(|e| {
            (e["type"].as_str().unwrap(), e["data"]["refund_no"].as_str().or(e["data"]["request_no"].as_str()).unwrap())
        })
        .collect();
    let mut kinds = kinds;
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            ("payment.succeeded", "P-1"),
            ("payment.succeeded", "P-2"),
            ("refund.failed", "RF-3"),
            ("refund.failed", "RF-4"),
            ("refund.succeeded", "RF-1"),
            ("refund.succeeded", "RF-2"),
        ]
    );
}

on_every_backend!(a_payment_cancelled_before_any_charge_writes_payment_failed:
    cancelled_uncharged_sqlite => sqlite, cancelled_uncharged_postgres => postgres,
    cancelled_uncharged_mysql => mysql);

/// A payment whose channel answers every charge `500` before charging (its call retried), cancelled by an
/// operator: the compensation closes the number (nothing was taken) and the payment ends `failed` with its
/// one `payment.failed`.
async fn a_payment_cancelled_before_any_charge_writes_payment_failed(url: &str) {
    let failing = MockChannelConfig { error_before_rate: 1.0, ..Default::default() };
    let app = common::start(url, Arc::new(MockChannel::new(failing)), Auth::SingleTenant).await;
    let (token, held) = pay(&app, "O-1", 1000, "P-1", 1).await;
    assert_eq!(held.status, 202, "{}", held.text);
    let workflow = payment_workflow_id(&Token::parse(&token).unwrap());
    let cancel = app.post(&format!("/v1/workflows/{workflow}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    assert_eq!(final_state(&app, &workflow).await, "cancelled");
    let e = payment_event(&app, "P-1", "payment.failed").await;
    assert_eq!((e["data"]["status"].as_str(), e["data"]["refunded_amount"].as_i64()), (Some("failed"), Some(0)));
    assert!(e["data"].get("charge_id").is_none(), "{e}");
}
