//! Money safety at the edges (issue 16), on every backend, with a channel written from the protocol alone
//! (`common::channel`) served over HTTP, and its ledger as the judge: tenants sharing a request number, a
//! channel that mixes merchants up, a cancel while the charge is in flight, a cancel of a rejected payment
//! while another payment of the same order is in flight, and numbers a URL path would misread.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::channel::TestChannel;
use common::{Answer, App};
use onceflow_api::Auth;
use onceflow_payments::{HttpChannel, payment_workflow_id};
use reqwest::Method;
use serde_json::{Value, json};

const KEY_A: &str = "key-of-tenant-a";
const KEY_B: &str = "key-of-tenant-b";

/// The app on `url` charging through `channel`, with clients for tenants `tA` and `tB`.
async fn two_tenants(url: &str, channel: &TestChannel) -> (App, App) {
    let auth = Auth::keys(vec![("tA".into(), KEY_A.into()), ("tB".into(), KEY_B.into())]);
    let a = common::start(url, http_channel(channel), auth).await.with_key(KEY_A);
    let b = App { base: a.base.clone(), client: reqwest::Client::new(), key: Some(KEY_B.to_owned()) };
    (a, b)
}

fn http_channel(channel: &TestChannel) -> Arc<dyn onceflow_payments::Channel> {
    Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap())
}

fn body(order_no: &str, amount: i64, request_no: &str) -> Value {
    json!({"order_no": order_no, "amount": amount, "currency": "CNY", "request_no": request_no})
}

/// Creates `order_no` and pays it under a new token: the token and the answer.
async fn order_and_pay(app: &App, order_no: &str, amount: i64, request_no: &str) -> (String, Answer) {
    let o = app.post("/v1/orders", json!({"order_no": order_no, "amount": amount, "currency": "CNY"})).await;
    assert!(o.status == 201 || o.status == 200, "{}", o.text);
    let token = app.token().await;
    let answer = app.pay(&token, body(order_no, amount, request_no)).await;
    (token, answer)
}

async fn order_status(app: &App, order_no: &str) -> String {
    let a = app.get(&format!("/v1/orders/{order_no}")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()["status"].as_str().unwrap_or_default().to_owned()
}

/// Pays without waiting (`202`), as a request whose charge is still in flight.
async fn pay_in_background(app: &App, token: &str, body: Value) -> Answer {
    app.send(Method::POST, "/v1/payments", &[("idempotency-key", token), ("prefer", "wait=0")], Some(body)).await
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

on_every_backend!(tenants_sharing_a_request_number:
    tenants_sharing_a_request_number_stay_apart_sqlite => sqlite,
    tenants_sharing_a_request_number_stay_apart_postgres => postgres,
    tenants_sharing_a_request_number_stay_apart_mysql => mysql,
);

/// Points 1, 2 and 4: tenant B reuses tenant A's request numbers (same fields, then other fields) and A's
/// used token. B pays for itself, A's charges are untouched, A's token is unknown to B.
async fn tenants_sharing_a_request_number(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let (a, b) = two_tenants(url, &channel).await;

    let (token_a, paid_a) = order_and_pay(&a, "O-1", 1000, "R-1").await;
    assert_eq!(paid_a.status, 201, "{}", paid_a.text);
    let (_, paid_b) = order_and_pay(&b, "O-1", 1000, "R-1").await;
    assert_eq!(paid_b.status, 201, "{}", paid_b.text);
    assert_ne!(paid_b.json()["charge_id"], paid_a.json()["charge_id"], "B was answered with A's charge");

    let (_, a2) = order_and_pay(&a, "O-2", 1000, "R-2").await;
    assert_eq!(a2.status, 201, "{}", a2.text);
    let (_, b2) = order_and_pay(&b, "O-3", 500, "R-2").await;
    assert_eq!(b2.status, 201, "{}", b2.text);

    // A's used token, presented by B: unknown to B, whatever it holds.
    let stolen = b.pay(&token_a, body("O-1", 1000, "R-1")).await;
    stolen.assert_problem(404, "token_not_found");

    let charges = channel.charges();
    assert!(charges.iter().all(|c| !c.refunded), "nothing was refunded: {charges:?}");
    assert_eq!(charges.len(), 4, "one charge per payment: {charges:?}");
    for (app, merchant, order_no) in [(&a, "tA", "O-1"), (&b, "tB", "O-1"), (&a, "tA", "O-2"), (&b, "tB", "O-3")] {
        assert_eq!(channel.kept(merchant, order_no), 1, "{merchant}/{order_no}: {charges:?}");
        assert_eq!(order_status(app, order_no).await, "paid", "{merchant}/{order_no}");
    }
}

on_every_backend!(a_channel_mixing_merchants:
    a_channel_mixing_merchants_is_caught_sqlite => sqlite,
    a_channel_mixing_merchants_is_caught_postgres => postgres,
    a_channel_mixing_merchants_is_caught_mysql => mysql,
);

/// Every answer is checked against the payment it is for: a channel that keeps no merchants apart answers B
/// with A's charge (same fields) or refuses B (other fields). B gets `409 request_no_conflict` or a generic
/// `422 channel_refused`, never A's charge, and A's charges are never refunded.
async fn a_channel_mixing_merchants(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, true).await;
    let (a, b) = two_tenants(url, &channel).await;

    let (_, paid_a) = order_and_pay(&a, "O-1", 1000, "R-1").await;
    assert_eq!(paid_a.status, 201, "{}", paid_a.text);
    let (token_b, same) = order_and_pay(&b, "O-1", 1000, "R-1").await;
    same.assert_problem(409, "request_no_conflict");
    assert_eq!(b.pay(&token_b, body("O-1", 1000, "R-1")).await.text, same.text, "stored and replayed");

    let (_, paid_a2) = order_and_pay(&a, "O-2", 1000, "R-2").await;
    assert_eq!(paid_a2.status, 201, "{}", paid_a2.text);
    let (_, other) = order_and_pay(&b, "O-3", 500, "R-2").await;
    other.assert_problem(422, "channel_refused");
    let detail = other.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(!detail.contains("conflict") && !detail.contains("127.0.0.1") && !detail.contains('{'), "{detail}");

    let charges = channel.charges();
    assert!(charges.iter().all(|c| !c.refunded), "A's charges were refunded: {charges:?}");
    assert_eq!(charges.len(), 2, "{charges:?}");
    assert_eq!((order_status(&a, "O-1").await, order_status(&a, "O-2").await), ("paid".into(), "paid".into()));
    assert_eq!((order_status(&b, "O-1").await, order_status(&b, "O-3").await), ("pending".into(), "pending".into()));
}

on_every_backend!(a_cancel_during_a_charge:
    a_cancel_during_a_held_charge_leaves_no_money_behind_sqlite => sqlite,
    a_cancel_during_a_held_charge_leaves_no_money_behind_postgres => postgres,
    a_cancel_during_a_held_charge_leaves_no_money_behind_mysql => mysql,
);

/// Point 3: the channel holds the charge for 2 s before recording it; a cancel arrives meanwhile. The cancel
/// ends within seconds with the money back or the order paid, never money taken from a `pending` order.
async fn a_cancel_during_a_charge(url: &str) {
    let channel = TestChannel::serve(Duration::from_secs(2), false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let started = Instant::now();
    let accepted = pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    let workflow_id = payment_workflow_id(&onceflow_payments::Token::parse(token.as_str()).unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);

    let state = final_state(&app, &workflow_id, Duration::from_secs(15)).await;
    // Whatever the channel does with the held request, its answer has come by now.
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(started.elapsed()) + Duration::from_millis(500)).await;
    let kept = channel.kept("default", "O-1");
    let status = order_status(&app, "O-1").await;
    assert!(kept <= 1, "{:?}", channel.charges());
    assert_eq!(status == "paid", kept == 1, "order {status} with {kept} kept charges (workflow {state})");
    assert_eq!(state == "cancelled", status == "pending", "workflow {state}, order {status}");
    assert!(channel.closes() >= 1, "the number was closed before anything was undone");
}

on_every_backend!(a_refusal_after_an_unknown_outcome:
    a_refusal_after_an_unknown_outcome_still_closes_the_number_sqlite => sqlite,
    a_refusal_after_an_unknown_outcome_still_closes_the_number_postgres => postgres,
    a_refusal_after_an_unknown_outcome_still_closes_the_number_mysql => mysql,
);

/// A refusal speaks only for its own request: the first charge request times out while the channel holds it,
/// the second is refused because the first is still in flight. The payment fails `channel_refused`, and the
/// number is closed before the order is released, so the first request cannot land on a `pending` order.
async fn a_refusal_after_an_unknown_outcome(url: &str) {
    let channel = TestChannel::serve_busy(Duration::from_millis(1500)).await;
    let impatient = Arc::new(HttpChannel::new(&channel.url, Duration::from_millis(300)).unwrap());
    let app = common::start(url, impatient, Auth::SingleTenant).await;
    let (_, refused) = order_and_pay(&app, "O-1", 1000, "R-1").await;
    refused.assert_problem(422, "channel_refused");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(channel.kept("default", "O-1"), 0, "{:?}", channel.charges());
    assert_eq!(order_status(&app, "O-1").await, "pending");
    assert!(channel.closes() >= 1, "the number was closed");
}

on_every_backend!(a_channel_without_close:
    a_cancel_on_a_channel_without_close_is_left_to_an_operator_sqlite => sqlite,
    a_cancel_on_a_channel_without_close_is_left_to_an_operator_postgres => postgres,
    a_cancel_on_a_channel_without_close_is_left_to_an_operator_mysql => mysql,
);

/// A channel that cannot close a number (`404`) leaves nothing to wait for: the cancel's compensation ends
/// `compensation_failed` for an operator at once, rather than retrying forever in `compensating`.
async fn a_channel_without_close(url: &str) {
    let channel = TestChannel::serve_closeless(Duration::from_secs(2)).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let accepted = pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    let workflow_id = payment_workflow_id(&onceflow_payments::Token::parse(token.as_str()).unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    assert_eq!(final_state(&app, &workflow_id, Duration::from_secs(10)).await, "compensation_failed");
}

on_every_backend!(a_cancel_of_a_rejected_payment:
    a_cancel_of_a_rejected_payment_leaves_the_payment_in_flight_alone_sqlite => sqlite,
    a_cancel_of_a_rejected_payment_leaves_the_payment_in_flight_alone_postgres => postgres,
    a_cancel_of_a_rejected_payment_leaves_the_payment_in_flight_alone_mysql => mysql,
);

/// Point 7: P1's charge is in flight on `W-1`; P2 (another token) is rejected `order_not_payable`, its rejection
/// is held in the database (a trigger refuses the write), and P2 is cancelled meanwhile. P2's compensations
/// touch nothing of P1's: P1 is paid once its charge lands.
async fn a_cancel_of_a_rejected_payment(url: &str) {
    let channel = TestChannel::serve(Duration::from_secs(3), false).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("W-1", 1000).await;
    let (t1, t2) = (app.token().await, app.token().await);
    let p1 = pay_in_background(&app, &t1, body("W-1", 1000, "P-1")).await;
    assert_eq!(p1.status, 202, "{}", p1.text);

    let db = Database::open(url).await;
    db.hold_token_completion(&t2).await;
    let p2 = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &t2), ("prefer", "wait=1")],
            Some(body("W-1", 1000, "P-2")),
        )
        .await;
    assert_eq!(p2.status, 202, "the rejection is held: {}", p2.text);
    let w2 = payment_workflow_id(&onceflow_payments::Token::parse(t2.as_str()).unwrap());
    let cancel = app.post(&format!("/v1/workflows/{w2}/cancel"), json!({})).await;
    assert!(cancel.status == 200 || cancel.json()["code"] == "invalid_state", "{}", cancel.text);
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.release_token_completion().await;

    let paid = app
        .send(
            Method::POST,
            "/v1/payments",
            &[("idempotency-key", &t1), ("prefer", "wait=15")],
            Some(body("W-1", 1000, "P-1")),
        )
        .await;
    assert_eq!(paid.status, 201, "P1 is paid: {}", paid.text);
    final_state(&app, &w2, Duration::from_secs(30)).await;
    assert_eq!(order_status(&app, "W-1").await, "paid");
    assert_eq!(channel.kept("default", "W-1"), 1, "{:?}", channel.charges());
    assert!(channel.charges().iter().all(|c| !c.refunded), "{:?}", channel.charges());
    let p2 = app.get("/v1/payments/P-2").await;
    assert_ne!(p2.json()["status"], "succeeded", "{}", p2.text);
}

/// The test's own connection to the app's database, to hold a write with a trigger.
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
                    "CREATE FUNCTION hold_token() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
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

/// Point 9: `.` and `..` are refused as order and request numbers (a URL path would read them as directory
/// steps); a number with `:` reaches the channel intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_a_path_would_misread_are_refused() {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let url = common::database("sqlite").await.unwrap();
    let app = common::start(&url, http_channel(&channel), Auth::SingleTenant).await;
    for bad in [".", ".."] {
        let order = app.post("/v1/orders", json!({"order_no": bad, "amount": 1000, "currency": "CNY"})).await;
        order.assert_problem(400, "invalid_request");
    }
    app.order("O-1", 1000).await;
    for bad in [".", ".."] {
        let token = app.token().await;
        app.pay(&token, body("O-1", 1000, bad)).await.assert_problem(400, "invalid_request");
    }
    let (_, paid) = order_and_pay(&app, "O-2", 1000, "R:2.x").await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    let charges = channel.charges();
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0].merchant_request_no, "R:2.x");
}
