//! Refunds (issue 36) over HTTP, on every backend, against a channel written from the protocol alone
//! (`common::channel`), its ledger and `check_invariants` as the judges: concurrent refunds that together would
//! exceed the charge, one request repeated concurrently, every way the channel can answer a refund, numbers
//! reused, payments that cannot be refunded, a refund racing an operator's cancel of another payment of the same
//! order, and what the views, lists and metrics show.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::channel::{RefundMode, TestChannel};
use common::{Answer, App};
use onceflow_api::Auth;
use onceflow_payments::{HttpChannel, MockChannel, MockChannelConfig, payment_workflow_id, refund_workflow_id};
use reqwest::Method;
use serde_json::{Value, json};

const KEY_A: &str = "key-of-tenant-a";
const KEY_B: &str = "key-of-tenant-b";

fn http_channel(channel: &TestChannel) -> Arc<dyn onceflow_payments::Channel> {
    Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap())
}

fn pay_body(order_no: &str, amount: i64, request_no: &str) -> Value {
    json!({"order_no": order_no, "amount": amount, "currency": "CNY", "request_no": request_no})
}

/// Creates `order_no` of `amount` and pays it as `request_no`: `201` asserted; the payment's token.
async fn paid(app: &App, order_no: &str, amount: i64, request_no: &str) -> String {
    app.order(order_no, amount).await;
    let token = app.token().await;
    let answer = app.pay(&token, pay_body(order_no, amount, request_no)).await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    token
}

/// A refund under `token`, waiting up to `wait_secs` for the final answer.
async fn refund_waiting(app: &App, token: &str, request_no: &str, body: Value, wait_secs: u64) -> Answer {
    let path = format!("/v1/payments/{request_no}/refunds");
    let wait = format!("wait={wait_secs}");
    app.send(Method::POST, &path, &[("idempotency-key", token), ("prefer", &wait)], Some(body)).await
}

async fn order_status(app: &App, order_no: &str) -> String {
    let a = app.get(&format!("/v1/orders/{order_no}")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()["status"].as_str().unwrap_or_default().to_owned()
}

async fn refunded_amount(app: &App, request_no: &str) -> i64 {
    let a = app.get(&format!("/v1/payments/{request_no}")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()["refunded_amount"].as_i64().unwrap_or(-1)
}

/// Waits until the refund `refund_no` is no longer `processing`; its body.
async fn settled(app: &App, refund_no: &str, within: Duration) -> Value {
    let asked = Instant::now();
    loop {
        let a = app.get(&format!("/v1/refunds/{refund_no}")).await;
        assert_eq!(a.status, 200, "{}", a.text);
        if a.json()["status"] != "processing" {
            return a.json();
        }
        assert!(asked.elapsed() < within, "refund {refund_no} still processing after {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the workflow is in a final state; its state.
async fn final_state(app: &App, workflow_id: &str, within: Duration) -> String {
    let asked = Instant::now();
    loop {
        let w = app.get(&format!("/v1/workflows/{workflow_id}")).await;
        let state = w.json()["workflow"]["state"].as_str().unwrap_or_default().to_owned();
        if !matches!(state.as_str(), "running" | "compensating" | "") {
            return state;
        }
        assert!(asked.elapsed() < within, "workflow {workflow_id} still {state} after {within:?}: {}", w.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn assert_invariants(url: &str, channel: &TestChannel) {
    let violations = common::invariants(url, channel.ledger()).await;
    assert!(violations.is_empty(), "{violations:?}\nledger: {:?}", channel.ledger());
}

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
            let Some(url) = common::database("postgres").await else {
                eprintln!("skipped: DATABASE_URL is not set");
                return;
            };
            $scenario(&url).await;
        }
    };
    (mysql, $name:ident, $scenario:ident) => {
        #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database("mysql").await else {
                eprintln!("skipped: MYSQL_URL is not set");
                return;
            };
            $scenario(&url).await;
        }
    };
}

on_every_backend!(twenty_refunds_of_a_tenth:
    twenty_concurrent_refunds_of_a_tenth_ten_succeed_sqlite => sqlite,
    twenty_concurrent_refunds_of_a_tenth_ten_succeed_postgres => postgres,
    twenty_concurrent_refunds_of_a_tenth_ten_succeed_mysql => mysql,
);

/// 20 refunds of 100, each under its own token, all at once, of a payment of 1,000: exactly 10 succeed, the
/// other 10 are `409 refund_exceeds_payment` with nothing left (`refundable` 0); the channel refunded 1,000 under
/// 10 numbers, the payment says so, the order is `refunded`.
async fn twenty_refunds_of_a_tenth(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = Arc::new(common::start(url, http_channel(&channel), Auth::SingleTenant).await);
    paid(&app, "O-1", 1000, "R-1").await;
    let mut tokens = Vec::new();
    for _ in 0..20 {
        tokens.push(app.token().await);
    }
    let mut tasks = Vec::new();
    for (n, token) in tokens.into_iter().enumerate() {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            app.refund(&token, "R-1", json!({"amount": 100, "refund_no": format!("RF-{n}")})).await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let succeeded: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status == 409).collect();
    assert_eq!(succeeded.len(), 10, "{:?}", answers.iter().map(|a| &a.text).collect::<Vec<_>>());
    assert_eq!(refused.len(), 10);
    for a in refused {
        a.assert_problem(409, "refund_exceeds_payment");
        assert_eq!(a.json()["refundable"], 0, "{}", a.text);
    }
    for a in succeeded {
        let body = a.json();
        assert_eq!((body["status"].as_str(), body["amount"].as_i64()), (Some("succeeded"), Some(100)), "{}", a.text);
        assert!(body["refund_id"].is_string() && body["created_at"].is_string(), "{}", a.text);
    }
    let refunds = channel.refunds();
    assert_eq!(refunds.len(), 10, "{refunds:?}");
    assert!(refunds.iter().all(|r| r["status"] == "succeeded"));
    assert_eq!(channel.charges()[0].refunded_amount, 1000);
    assert_eq!(refunded_amount(&app, "R-1").await, 1000);
    assert_eq!(order_status(&app, "O-1").await, "refunded");
    let list = app.get("/v1/payments/R-1/refunds").await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json()["refunds"].as_array().map(Vec::len), Some(20), "{}", list.text);
    assert_invariants(url, &channel).await;
}

on_every_backend!(one_refund_fifty_times:
    one_refund_asked_fifty_times_at_once_is_one_refund_sqlite => sqlite,
    one_refund_asked_fifty_times_at_once_is_one_refund_postgres => postgres,
    one_refund_asked_fifty_times_at_once_is_one_refund_mysql => mysql,
);

/// The same refund request (one token, one body) 50 times at once: one refund call at the channel, one refund,
/// 50 identical answers; a later repeat is the same bytes, `Idempotent-Replayed: true`.
async fn one_refund_fifty_times(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = Arc::new(common::start(url, http_channel(&channel), Auth::SingleTenant).await);
    paid(&app, "O-1", 1000, "R-1").await;
    let token = app.token().await;
    let body = json!({"amount": 300, "reason": "one item came back"});
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (app, token, body) = (app.clone(), token.clone(), body.clone());
        tasks.push(tokio::spawn(async move { app.refund(&token, "R-1", body).await }));
    }
    let mut texts = std::collections::HashSet::new();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.status, 201, "{}", a.text);
        texts.insert(a.text);
    }
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert_eq!(channel.refund_calls(), 1, "{:?}", channel.refunds());
    let again = app.refund(&token, "R-1", body).await;
    assert_eq!(again.status, 201);
    assert!(texts.contains(&again.text), "{}", again.text);
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    let first = again.json();
    assert_eq!(first["reason"], "one item came back");
    assert_eq!(first["refund_no"].as_str().map(|n| n.starts_with("RF-")), Some(true), "derived from the token");
    assert_eq!(refunded_amount(&app, "R-1").await, 300);
    assert_eq!(order_status(&app, "O-1").await, "paid", "partly refunded stays paid");
    assert_invariants(url, &channel).await;
}

on_every_backend!(balance_checked_first:
    a_refusal_after_a_lost_reply_is_no_failure_sqlite => sqlite,
    a_refusal_after_a_lost_reply_is_no_failure_postgres => postgres,
    a_refusal_after_a_lost_reply_is_no_failure_mysql => mysql,
);

/// A channel that checks a charge's balance before a refund's number, and lost the reply of a refund that took
/// all of it: the same request again is refused `409 exceeds_charge`. That refusal says nothing of the number
/// (the channel holds the refund): asked what it holds, the channel's refund is the outcome. (Before, the
/// refusal was final: `422 refund_failed`, the amount refundable again while the channel had refunded it.)
async fn balance_checked_first(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    paid(&app, "O-1", 1000, "R-1").await;
    channel.set_refund_mode(RefundMode::LoseReplyBalanceFirst);
    let whole = app.refund(&app.token().await, "R-1", json!({"amount": 1000, "refund_no": "RF-all"})).await;
    assert_eq!(whole.status, 201, "{}", whole.text);
    assert_eq!(app.get("/v1/refunds/RF-all").await.json()["status"], "succeeded");
    assert_eq!(refunded_amount(&app, "R-1").await, 1000);
    assert_eq!(order_status(&app, "O-1").await, "refunded");
    assert_invariants(url, &channel).await;
}

on_every_backend!(client_mistakes:
    a_reason_with_a_nul_or_an_amount_past_any_charge_is_a_client_mistake_sqlite => sqlite,
    a_reason_with_a_nul_or_an_amount_past_any_charge_is_a_client_mistake_postgres => postgres,
    a_reason_with_a_nul_or_an_amount_past_any_charge_is_a_client_mistake_mysql => mysql,
);

/// Client mistakes are answered as such, never `500`: a `reason` with a control character (a NUL, which Postgres
/// cannot store) is `400`; an amount so large that the payment's refunded + reserved + it would overflow 64 bits
/// is `409 refund_exceeds_payment` with what is left, like any amount past the charge.
async fn client_mistakes(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    paid(&app, "O-1", 1000, "R-1").await;
    for reason in ["a\u{0}b", "bell\u{7}", "esc\u{1b}[31m"] {
        let answer = app.refund(&app.token().await, "R-1", json!({"amount": 100, "reason": reason})).await;
        answer.assert_problem(400, "invalid_request");
    }
    let part = app.refund(&app.token().await, "R-1", json!({"amount": 100, "refund_no": "RF-1"})).await;
    assert_eq!(part.status, 201, "{}", part.text);
    let huge = app.refund(&app.token().await, "R-1", json!({"amount": i64::MAX, "refund_no": "RF-2"})).await;
    huge.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(huge.json()["refundable"], 900, "{}", huge.text);
    assert_invariants(url, &channel).await;
}

on_every_backend!(channel_answers:
    every_answer_of_the_channel_to_a_refund_sqlite => sqlite,
    every_answer_of_the_channel_to_a_refund_postgres => postgres,
    every_answer_of_the_channel_to_a_refund_mysql => mysql,
);

/// The channel fails a refund (`failed`), refuses one (`422`), refunds and loses its reply (`500`), and answers
/// `processing`, then `succeeded` or `failed`. Each refund ends as the channel says; a failed one is
/// `422 refund_failed` and its amount is refundable again; nothing stays reserved.
async fn channel_answers(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    paid(&app, "O-1", 1000, "R-1").await;
    let refund = |amount: i64, no: &str| json!({"amount": amount, "refund_no": no});

    channel.set_refund_mode(RefundMode::Fail);
    let token = app.token().await;
    let failed = app.refund(&token, "R-1", refund(1000, "RF-fail")).await;
    failed.assert_problem(422, "refund_failed");
    assert_eq!(app.refund(&token, "R-1", refund(1000, "RF-fail")).await.text, failed.text, "stored and replayed");
    assert_eq!(app.get("/v1/refunds/RF-fail").await.json()["status"], "failed");

    channel.set_refund_mode(RefundMode::Refuse);
    let refused = app.refund(&app.token().await, "R-1", refund(1000, "RF-refused")).await;
    refused.assert_problem(422, "refund_failed");
    let detail = refused.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(!detail.contains("refused\"") && !detail.contains('{'), "the channel's answer stays inside: {detail}");

    // Refunded, its reply lost: asked again under the same number, the channel answers with the refund it made.
    channel.set_refund_mode(RefundMode::LoseReply);
    let lost = app.refund(&app.token().await, "R-1", refund(400, "RF-lost")).await;
    assert_eq!(lost.status, 201, "{}", lost.text);
    assert_eq!(channel.refunds().iter().filter(|r| r["merchant_refund_no"] == "rf~RF-lost").count(), 1);

    // Processing: answered 202 within the wait, settled by asking again once the channel has.
    channel.set_refund_mode(RefundMode::Processing);
    let token = app.token().await;
    let pending = refund_waiting(&app, &token, "R-1", refund(300, "RF-slow"), 1).await;
    assert_eq!(pending.status, 202, "{}", pending.text);
    assert_eq!(pending.header("location").as_deref(), Some("/v1/refunds/RF-slow"));
    assert_eq!(pending.json()["status"], "processing");
    // What is reserved is not refundable meanwhile: 1000 - 400 - 300 left.
    let over = app.refund(&app.token().await, "R-1", refund(301, "RF-over")).await;
    over.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(over.json()["refundable"], 300, "{}", over.text);
    channel.settle_refunds("succeeded");
    assert_eq!(settled(&app, "RF-slow", Duration::from_secs(15)).await["status"], "succeeded");
    let replay = app.refund(&token, "R-1", refund(300, "RF-slow")).await;
    assert_eq!(replay.status, 201, "{}", replay.text);

    channel.set_refund_mode(RefundMode::Processing);
    let token = app.token().await;
    let pending = refund_waiting(&app, &token, "R-1", refund(300, "RF-slow-fail"), 1).await;
    assert_eq!(pending.status, 202, "{}", pending.text);
    channel.settle_refunds("failed");
    assert_eq!(settled(&app, "RF-slow-fail", Duration::from_secs(15)).await["status"], "failed");
    app.refund(&token, "R-1", refund(300, "RF-slow-fail")).await.assert_problem(422, "refund_failed");

    // Every failed amount came back to be refunded: 300 are left, and refunding them refunds the order.
    channel.set_refund_mode(RefundMode::Succeed);
    let rest = app.refund(&app.token().await, "R-1", refund(300, "RF-rest")).await;
    assert_eq!(rest.status, 201, "{}", rest.text);
    assert_eq!(refunded_amount(&app, "R-1").await, 1000);
    assert_eq!(order_status(&app, "O-1").await, "refunded");
    let again = app.refund(&app.token().await, "R-1", refund(1, "RF-none")).await;
    again.assert_problem(409, "refund_exceeds_payment");
    assert_eq!(again.json()["refundable"], 0);
    assert_invariants(url, &channel).await;
}

on_every_backend!(numbers_and_tokens:
    a_refund_number_or_token_used_again_sqlite => sqlite,
    a_refund_number_or_token_used_again_postgres => postgres,
    a_refund_number_or_token_used_again_mysql => mysql,
);

/// A `refund_no` is spent forever: with other fields, or the same ones under another token, it is
/// `409 refund_no_conflict` (stored). A token is bound to its route and fields: another body, another payment,
/// or a payment's token is `422 idempotency_key_mismatch`.
async fn numbers_and_tokens(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    let pay_token = paid(&app, "O-1", 1000, "R-1").await;
    paid(&app, "O-2", 1000, "R-2").await;
    let token = app.token().await;
    let first = app.refund(&token, "R-1", json!({"amount": 300, "refund_no": "RF-1"})).await;
    assert_eq!(first.status, 201, "{}", first.text);

    let other = app.token().await;
    let reused = app.refund(&other, "R-1", json!({"amount": 200, "refund_no": "RF-1"})).await;
    reused.assert_problem(409, "refund_no_conflict");
    assert_eq!(app.refund(&other, "R-1", json!({"amount": 200, "refund_no": "RF-1"})).await.text, reused.text);
    let same = app.refund(&app.token().await, "R-1", json!({"amount": 300, "refund_no": "RF-1"})).await;
    same.assert_problem(409, "refund_no_conflict");
    let elsewhere = app.refund(&app.token().await, "R-2", json!({"amount": 300, "refund_no": "RF-1"})).await;
    elsewhere.assert_problem(409, "refund_no_conflict");

    app.refund(&token, "R-1", json!({"amount": 301, "refund_no": "RF-1"}))
        .await
        .assert_problem(422, "idempotency_key_mismatch");
    app.refund(&token, "R-2", json!({"amount": 300, "refund_no": "RF-1"}))
        .await
        .assert_problem(422, "idempotency_key_mismatch");
    app.refund(&pay_token, "R-1", json!({"amount": 300})).await.assert_problem(422, "idempotency_key_mismatch");
    // A refund's token presented for a payment: its route says whose it is.
    app.pay(&token, pay_body("O-1", 1000, "R-9")).await.assert_problem(422, "idempotency_key_mismatch");

    assert_eq!(app.get("/v1/refunds/RF-1").await.json()["amount"], 300, "the first refund keeps its number");
    assert_eq!(channel.refunds().len(), 1);
    assert_eq!(refunded_amount(&app, "R-1").await, 300);
    assert_eq!(refunded_amount(&app, "R-2").await, 0);
    assert_invariants(url, &channel).await;
}

on_every_backend!(unrefundable_payments:
    declined_pending_and_foreign_payments_are_not_refunded_sqlite => sqlite,
    declined_pending_and_foreign_payments_are_not_refunded_postgres => postgres,
    declined_pending_and_foreign_payments_are_not_refunded_mysql => mysql,
);

/// A payment still in flight, and one of another tenant, or none: a pending one is
/// `409 payment_not_refundable` (stored); another tenant's or an unknown one `404 payment_not_found`, nothing
/// stored (the token stays good for a refund of the tenant's own payment).
async fn unrefundable_payments(url: &str) {
    let channel = TestChannel::serve(Duration::from_secs(2), false).await;
    let auth = Auth::keys(vec![("tA".into(), KEY_A.into()), ("tB".into(), KEY_B.into())]);
    let a = common::start(url, http_channel(&channel), auth).await.with_key(KEY_A);
    let b = App { base: a.base.clone(), client: reqwest::Client::new(), key: Some(KEY_B.to_owned()) };

    a.order("O-1", 1000).await;
    let pending = a.token().await;
    let accepted = a
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &pending), ("prefer", "wait=0")],
            Some(pay_body("O-1", 1000, "R-1")),
        )
        .await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    let token = a.token().await;
    let early = a.refund(&token, "R-1", json!({"amount": 100})).await;
    early.assert_problem(409, "payment_not_refundable");
    assert_eq!(a.refund(&token, "R-1", json!({"amount": 100})).await.text, early.text, "stored");

    let foreign = b.token().await;
    b.refund(&foreign, "R-1", json!({"amount": 100})).await.assert_problem(404, "payment_not_found");
    b.refund(&foreign, "NO-SUCH", json!({"amount": 100})).await.assert_problem(404, "payment_not_found");
    b.order("O-B", 500).await;
    let b_pay = b.token().await;
    assert_eq!(b.pay(&b_pay, pay_body("O-B", 500, "R-B")).await.status, 201);
    let own = b.refund(&foreign, "R-B", json!({"amount": 500})).await;
    assert_eq!(own.status, 201, "the token stayed usable: {}", own.text);
    a.refund(&a.token().await, "R-B", json!({"amount": 1})).await.assert_problem(404, "payment_not_found");
    assert_eq!(a.get("/v1/refunds/RF-none").await.status, 404);
    let own_no = own.json()["refund_no"].as_str().unwrap().to_owned();
    a.get(&format!("/v1/refunds/{own_no}")).await.assert_problem(404, "refund_not_found");
    a.get("/v1/payments/R-B/refunds").await.assert_problem(404, "payment_not_found");

    // Once paid, refundable.
    let paid = a
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &pending), ("prefer", "wait=15")],
            Some(pay_body("O-1", 1000, "R-1")),
        )
        .await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    assert_eq!(a.refund(&a.token().await, "R-1", json!({"amount": 100})).await.status, 201);
    assert_invariants(url, &channel).await;
}

/// A declined payment is not refundable (`409 payment_not_refundable`), and nothing reaches the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_is_not_refunded() {
    let url = common::database("sqlite").await.unwrap();
    let channel = MockChannel::new(MockChannelConfig { decline_rate: 1.0, ..Default::default() });
    let app = common::start(&url, Arc::new(channel.clone()), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let declined = app.pay(&app.token().await, pay_body("O-1", 1000, "R-1")).await;
    declined.assert_problem(402, "payment_declined");
    let token = app.token().await;
    let refused = app.refund(&token, "R-1", json!({"amount": 1000, "refund_no": "RF-1"})).await;
    refused.assert_problem(409, "payment_not_refundable");
    assert_eq!(app.get("/v1/refunds/RF-1").await.json()["status"], "failed");
    assert_eq!(channel.ledger().refund_calls, 0);
    let violations = common::invariants(&url, channel.ledger()).await;
    assert!(violations.is_empty(), "{violations:?}");
}

on_every_backend!(a_refund_racing_a_sibling_cancel:
    a_refund_racing_the_cancel_of_another_payment_of_the_order_sqlite => sqlite,
    a_refund_racing_the_cancel_of_another_payment_of_the_order_postgres => postgres,
    a_refund_racing_the_cancel_of_another_payment_of_the_order_mysql => mysql,
);

/// P-1 paid `W-1`; P-2 (another token, the same order) is rejected `order_not_payable`, its rejection held in
/// the database so that it is still in flight, and an operator cancels it while P-1 is refunded in full, at once.
/// Then, P-3 the same way, cancelled first and held while compensating, and only then is P-1's refund asked
/// (nothing left: `409`). No refund but P-1's merchant refund reaches the channel, the order is `refunded` once,
/// and the siblings' compensations touch nothing of P-1's. (On MySQL a rejection commits in one transaction with
/// the payment's first phase, so the held one may record nothing: then there is no sibling in flight to cancel,
/// and the refund must come out the same.)
async fn a_refund_racing_a_sibling_cancel(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = Arc::new(common::start(url, http_channel(&channel), Auth::SingleTenant).await);
    paid(&app, "W-1", 1000, "P-1").await;
    let db = Database::open(url).await;

    let held = app.token().await;
    db.hold_token_completion(&held).await;
    let p2 = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &held), ("prefer", "wait=1")],
            Some(pay_body("W-1", 1000, "P-2")),
        )
        .await;
    assert_eq!(p2.status, 202, "the rejection is held: {}", p2.text);
    let w2 = payment_workflow_id(&onceflow_payments::Token::parse(held.as_str()).unwrap());
    let refund_token = app.token().await;
    let refund = {
        let (app, token) = (app.clone(), refund_token.clone());
        tokio::spawn(async move { app.refund(&token, "P-1", json!({"amount": 1000, "refund_no": "RF-all"})).await })
    };
    let cancel = app.post(&format!("/v1/workflows/{w2}/cancel"), json!({})).await;
    assert!(cancel.status == 200 || cancel.json()["code"] == "invalid_state", "{}", cancel.text);
    let refunded = refund.await.unwrap();
    assert_eq!(refunded.status, 201, "{}", refunded.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.release_token_completion().await;
    if recorded_here(url) || app.get(&format!("/v1/workflows/{w2}")).await.status == 200 {
        final_state(&app, &w2, Duration::from_secs(30)).await;
    }

    // P-3 is cancelled first, and held in its compensations.
    let held = app.token().await;
    db.hold_token_completion(&held).await;
    let p3 = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &held), ("prefer", "wait=1")],
            Some(pay_body("W-1", 1000, "P-3")),
        )
        .await;
    assert_eq!(p3.status, 202, "{}", p3.text);
    let w3 = payment_workflow_id(&onceflow_payments::Token::parse(held.as_str()).unwrap());
    let cancel = app.post(&format!("/v1/workflows/{w3}/cancel"), json!({})).await;
    let recorded = cancel.status == 200;
    assert!(recorded || (!recorded_here(url) && cancel.status == 404), "{}", cancel.text);
    let asked = Instant::now();
    while recorded && app.get(&format!("/v1/workflows/{w3}")).await.json()["workflow"]["state"] != "compensating" {
        assert!(asked.elapsed() < Duration::from_secs(10), "P-3 never compensated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let more = app.refund(&app.token().await, "P-1", json!({"amount": 1, "refund_no": "RF-more"})).await;
    more.assert_problem(409, "refund_exceeds_payment");
    db.release_token_completion().await;
    if recorded {
        assert_eq!(final_state(&app, &w3, Duration::from_secs(30)).await, "cancelled");
    }

    assert_eq!(order_status(&app, "W-1").await, "refunded");
    assert_eq!(refunded_amount(&app, "P-1").await, 1000);
    for sibling in ["P-2", "P-3"] {
        let p = app.get(&format!("/v1/payments/{sibling}")).await;
        if recorded_here(url) || p.status == 200 {
            let body = p.json();
            assert_eq!(
                (body["status"].as_str(), body["refunded_amount"].as_i64()),
                (Some("failed"), Some(0)),
                "{}",
                p.text
            );
        } else {
            p.assert_problem(404, "payment_not_found");
        }
    }
    let refunds = channel.refunds();
    assert_eq!(refunds.len(), 1, "only P-1's own refund: {refunds:?}");
    assert_eq!((refunds[0]["merchant_request_no"].as_str(), refunds[0]["amount"].as_i64()), (Some("P-1"), Some(1000)));
    assert_eq!(channel.charges().len(), 1);
    assert_invariants(url, &channel).await;
}

on_every_backend!(views_and_metrics:
    refunds_show_in_views_lists_workflows_and_metrics_sqlite => sqlite,
    refunds_show_in_views_lists_workflows_and_metrics_postgres => postgres,
    refunds_show_in_views_lists_workflows_and_metrics_mysql => mysql,
);

/// A refund as `GET /v1/refunds/{refund_no}` shows it (with its workflow, whose steps are the saga's), a
/// payment's refunds newest first, the payment's `refunded_amount` — while its stored `201` keeps its bytes —
/// and the refunds in `/metrics`.
async fn views_and_metrics(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    let pay_token = paid(&app, "O-1", 1000, "R-1").await;
    let first_answer = app.pay(&pay_token, pay_body("O-1", 1000, "R-1")).await.text;
    let token = app.token().await;
    let one = app.refund(&token, "R-1", json!({"amount": 100, "refund_no": "RF-a", "reason": "broken"})).await;
    assert_eq!(one.status, 201, "{}", one.text);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let two = app.refund(&app.token().await, "R-1", json!({"amount": 200, "refund_no": "RF-b"})).await;
    assert_eq!(two.status, 201, "{}", two.text);

    let shown = app.get("/v1/refunds/RF-a").await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    let body = shown.json();
    let workflow_id = refund_workflow_id(&onceflow_payments::Token::parse(token.as_str()).unwrap());
    assert_eq!(body["workflow_id"], workflow_id.as_str());
    for field in
        ["refund_no", "request_no", "order_no", "amount", "currency", "status", "refund_id", "reason", "created_at"]
    {
        assert_eq!(body[field], one.json()[field], "{field}: {}", shown.text);
    }
    assert_eq!(body["reason"], "broken");
    assert_eq!(two.json()["reason"], Value::Null);
    let list = app.get("/v1/payments/R-1/refunds").await.json();
    let numbers: Vec<&str> =
        list["refunds"].as_array().unwrap().iter().map(|r| r["refund_no"].as_str().unwrap()).collect();
    assert_eq!(numbers, ["RF-b", "RF-a"], "newest first");
    let payment = app.get("/v1/payments/R-1").await.json();
    assert_eq!(payment["refunded_amount"], 300);
    assert_eq!(
        app.pay(&pay_token, pay_body("O-1", 1000, "R-1")).await.text,
        first_answer,
        "a payment's answer never changes"
    );
    assert!(!first_answer.contains("refunded_amount"), "{first_answer}");

    let workflow = app.get(&format!("/v1/workflows/{workflow_id}")).await;
    let w = workflow.json();
    assert_eq!((w["workflow"]["name"].as_str(), w["workflow"]["state"].as_str()), (Some("refund"), Some("completed")));
    assert_eq!(w["workflow"]["input"]["token"], "***", "no token in a view");
    let steps: Vec<&str> = w["steps"].as_array().unwrap().iter().map(|s| s["step_key"].as_str().unwrap()).collect();
    for key in ["claim_token", "insert_refund", "reserve_amount", "call_refund", "confirm_refund"] {
        assert!(steps.contains(&key), "{key} in {steps:?}");
    }
    assert_eq!(w["workflow"]["output"]["body"]["refund_no"], "RF-a");
    let listed = app.get("/v1/workflows?limit=10").await.json();
    assert!(listed["workflows"].as_array().unwrap().iter().any(|w| w["workflow_id"] == workflow_id.as_str()));

    let metrics = app.get("/metrics").await.text;
    assert!(metrics.contains("onceflow_refunds_total{outcome=\"succeeded\"}"), "{metrics}");
    assert!(metrics.contains("onceflow_unresolved_refunds 0"), "{metrics}");
    assert!(metrics.contains("onceflow_unresolved_refund_oldest_seconds 0"), "{metrics}");
    assert_invariants(url, &channel).await;
}

/// Whether a payment rejected before the channel is recorded (and in flight) while its rejection is held: not
/// always on MySQL, where the rejection commits in one transaction with the first phase (the run records its
/// workflow, with nothing of the phase, only once it waits for its retry outside the process).
fn recorded_here(url: &str) -> bool {
    !url.starts_with("mysql:")
}

/// The test's own connection to the app's database, to hold a write with a trigger (as `money.rs` does).
enum Database {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

impl Database {
    async fn open(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            Self::Sqlite(sqlx::SqlitePool::connect(url).await.unwrap())
        } else if url.starts_with("mysql:") {
            Self::MySql(sqlx::MySqlPool::connect(url).await.unwrap())
        } else {
            Self::Postgres(sqlx::PgPool::connect(url).await.unwrap())
        }
    }

    /// From now on the database refuses to complete `token` (tokens are hex: safe to write into SQL).
    async fn hold_token_completion(&self, token: &str) {
        assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let sql = |s: String| sqlx::AssertSqlSafe(s);
        match self {
            Self::Sqlite(pool) => {
                let trigger = format!(
                    "CREATE TRIGGER hold_token BEFORE UPDATE ON idempotency_tokens \
                     WHEN NEW.token = '{token}' AND NEW.state = 'completed' BEGIN SELECT RAISE(ABORT, 'held'); END"
                );
                sqlx::query(sql(trigger)).execute(pool).await.unwrap();
            }
            Self::Postgres(pool) => {
                let function = format!(
                    "CREATE OR REPLACE FUNCTION hold_token() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                     IF NEW.token = '{token}' AND NEW.state = 'completed' THEN RAISE EXCEPTION 'held'; END IF; \
                     RETURN NEW; END $$"
                );
                sqlx::query(sql(function)).execute(pool).await.unwrap();
                let trigger = "CREATE TRIGGER hold_token BEFORE UPDATE ON idempotency_tokens \
                               FOR EACH ROW EXECUTE FUNCTION hold_token()";
                sqlx::query(trigger).execute(pool).await.unwrap();
            }
            Self::MySql(pool) => {
                let trigger = format!(
                    "CREATE TRIGGER hold_token BEFORE UPDATE ON idempotency_tokens FOR EACH ROW BEGIN \
                     IF NEW.token = '{token}' AND NEW.state = 'completed' THEN \
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'held'; END IF; END"
                );
                sqlx::query(sql(trigger)).execute(pool).await.unwrap();
            }
        }
    }

    async fn release_token_completion(&self) {
        match self {
            Self::Sqlite(pool) => sqlx::query("DROP TRIGGER hold_token").execute(pool).await.map(drop),
            Self::Postgres(pool) => {
                sqlx::query("DROP TRIGGER hold_token ON idempotency_tokens").execute(pool).await.map(drop)
            }
            Self::MySql(pool) => sqlx::query("DROP TRIGGER hold_token").execute(pool).await.map(drop),
        }
        .unwrap();
    }
}
