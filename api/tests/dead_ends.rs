//! No dead ends (issue 30), on every backend, against a channel written from the protocol alone
//! (`common::channel`) served over HTTP, with its ledger as the judge (`check_invariants`):
//!
//! 1. a refund the channel fails (or refuses) during a cancel's compensation: the payment rolls forward — the
//!    charge kept, the order paid, the client answered with the charge — instead of keeping the money with the
//!    order `paying` for good;
//! 2. a cancel (or a payment) meeting a charge still `processing` says what it waits for (the workflow view and
//!    `onceflow workflows show`), and an operator asks the channel now (`query-channel`) and sees it settle;
//! 3. two requests with one token and different bodies: each answered once, the same forever (no `422` that a
//!    concurrent request made up, followed by a `201`);
//! 4. a queued command under the number of a failed HTTP payment: the same answer before and after retention;
//! 5. a refund answer that does not match the refund asked for is never a success;
//! 6. a process whose clock is an hour off takes no live lease of another, nor loses its own.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::channel::{ChargeMode, RefundMode, TestChannel};
use common::{Answer, App};
use onceflow_api::{Auth, OnPayments, with_payments};
use onceflow_engine::clock::{Clock, SystemClock};
use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::{
    Currency, HttpChannel, Ledger, MockChannel, OrderNo, PaymentRequest, PaymentStore, Payments, RequestNo, Retention,
    Token, check_invariants, payment_workflow_id,
};
use reqwest::Method;
use serde_json::{Value, json};

const ACME: &str = "key-of-tenant-acme";
const OPERATOR: &str = "key-of-an-operator";

fn http_channel(channel: &TestChannel) -> Arc<dyn onceflow_payments::Channel> {
    Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap())
}

fn body(order_no: &str, amount: i64, request_no: &str) -> Value {
    json!({"order_no": order_no, "amount": amount, "currency": "CNY", "request_no": request_no})
}

fn workflow_of(token: &str) -> String {
    payment_workflow_id(&Token::parse(token).unwrap())
}

/// Pays without waiting (`202`), as a request whose charge is still in flight.
async fn pay_in_background(app: &App, token: &str, body: Value) -> Answer {
    app.send(Method::POST, "/v1/payments", &[("idempotency-key", token), ("prefer", "wait=0")], Some(body)).await
}

async fn order_status(app: &App, order_no: &str) -> String {
    let a = app.get(&format!("/v1/orders/{order_no}")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()["status"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `ready` holds (checked every 20 ms), failing after `within`.
async fn until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let asked = Instant::now();
    while !ready() {
        assert!(asked.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the workflow is in a final state; its view.
async fn final_view(app: &App, workflow_id: &str, within: Duration) -> Value {
    let asked = Instant::now();
    loop {
        let w = app.get(&format!("/v1/workflows/{workflow_id}")).await;
        let state = w.json()["workflow"]["state"].as_str().unwrap_or_default().to_owned();
        if !matches!(state.as_str(), "running" | "compensating" | "") {
            return w.json();
        }
        assert!(asked.elapsed() < within, "workflow {workflow_id} still {state} after {within:?}: {}", w.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The workflow's view once `test` holds of it.
async fn view_when(app: &App, workflow_id: &str, within: Duration, test: impl Fn(&Value) -> bool) -> Value {
    let asked = Instant::now();
    loop {
        let w = app.get(&format!("/v1/workflows/{workflow_id}")).await;
        if test(&w.json()) {
            return w.json();
        }
        assert!(asked.elapsed() < within, "workflow {workflow_id}: not as expected after {within:?}: {}", w.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The invariants, judged from the channel's `ledger` and the database at `url`.
async fn violations(url: &str, ledger: Ledger) -> Vec<String> {
    struct Check(Ledger);
    impl OnPayments for Check {
        type Output = Vec<String>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Vec<String> {
            let found = check_invariants(payments.engine().store(), &self.0).await.unwrap();
            found.into_iter().map(|v| v.0).collect()
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Check(ledger)).await.unwrap()
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

// ---- 1. A refund the channel fails ----------------------------------------------------------------------

on_every_backend!(a_failed_refund_rolls_forward:
    a_refund_the_channel_fails_rolls_the_payment_forward_sqlite => sqlite,
    a_refund_the_channel_fails_rolls_the_payment_forward_postgres => postgres,
    a_refund_the_channel_fails_rolls_the_payment_forward_mysql => mysql,
);

on_every_backend!(a_refused_refund_rolls_forward:
    a_refund_the_channel_refuses_rolls_the_payment_forward_sqlite => sqlite,
    a_refund_the_channel_refuses_rolls_the_payment_forward_postgres => postgres,
    a_refund_the_channel_refuses_rolls_the_payment_forward_mysql => mysql,
);

async fn a_failed_refund_rolls_forward(url: &str) {
    refund_ends_definitively(url, RefundMode::Fail).await;
}

async fn a_refused_refund_rolls_forward(url: &str) {
    refund_ends_definitively(url, RefundMode::Refuse).await;
}

/// A charge the channel holds `processing`; an operator cancels; the compensation closes the number (`409
/// charged`) and waits for the charge to settle; it succeeds, and the refund is failed (or refused) by the
/// channel. Money was taken and cannot be given back: the payment rolls forward — charge kept, order paid, the
/// record succeeded with the charge, the client answered `201` with it — and the workflow ends `completed` with
/// the exception `kept_after_failed_refund` in its view.
async fn refund_ends_definitively(url: &str, mode: RefundMode) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let accepted = pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    until("the charge reached the channel", Duration::from_secs(10), || channel.charges().len() == 1).await;
    let workflow_id = workflow_of(&token);
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    channel.set_refund_mode(mode);
    channel.settle_charges("succeeded");

    let view = final_view(&app, &workflow_id, Duration::from_secs(20)).await;
    assert_eq!(view["workflow"]["state"], "completed", "rolled forward: {view}");
    assert_eq!(view["workflow"]["output"]["status"], 201, "{view}");
    assert_eq!(view["workflow"]["error"]["code"], "kept_after_failed_refund", "the view says so: {view}");
    assert_eq!(order_status(&app, "O-1").await, "paid");
    let payment = app.get("/v1/payments/R-1").await;
    assert_eq!(payment.json()["status"], "succeeded", "{}", payment.text);
    assert_eq!(payment.json()["charge_id"], "tc_1", "{}", payment.text);
    let replay = app.pay(&token, body("O-1", 1000, "R-1")).await;
    assert_eq!(replay.status, 201, "the client's answer is the charge: {}", replay.text);
    assert_eq!(replay.json()["charge_id"], "tc_1", "{}", replay.text);
    let another = app.pay(&app.token().await, body("O-1", 1000, "R-2")).await;
    another.assert_problem(409, "order_not_payable");
    assert_eq!(channel.kept("default", "O-1"), 1, "{:?}", channel.charges());
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

on_every_backend!(a_compensation_failed_payment_has_a_way_out:
    a_compensation_failed_payment_has_a_way_out_sqlite => sqlite,
    a_compensation_failed_payment_has_a_way_out_postgres => postgres,
    a_compensation_failed_payment_has_a_way_out_mysql => mysql,
);

/// Runs one statement on the database at `url` (`$1`-free SQL), from the test's own connection.
async fn execute(url: &str, sql: &'static str) {
    if url.starts_with("sqlite:") {
        sqlx::query(sql).execute(&sqlx::SqlitePool::connect(url).await.unwrap()).await.unwrap();
    } else if url.starts_with("mysql:") {
        sqlx::query(sql).execute(&sqlx::MySqlPool::connect(url).await.unwrap()).await.unwrap();
    } else {
        sqlx::query(sql).execute(&sqlx::PgPool::connect(url).await.unwrap()).await.unwrap();
    }
}

/// What is left of `compensation_failed` ends consistently by an operator's action. A channel that cannot close
/// a number (`404`) leaves a cancel `compensation_failed` with the payment resting as it was (order `paying` under
/// it, record `processing`, token `in_use`): the invariants report the order left paying, and no dead end. Once the
/// channel closes numbers, the operator's retry ends it: the number is closed (the charge found), refunded, the
/// order released. A payment undone in part (here: its order moved behind its back) is reported as a dead end.
async fn a_compensation_failed_payment_has_a_way_out(url: &str) {
    let channel = TestChannel::serve_closeless(Duration::from_millis(500)).await;
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    assert_eq!(pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await.status, 202);
    let workflow_id = workflow_of(&token);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    let view = final_view(&app, &workflow_id, Duration::from_secs(10)).await;
    assert_eq!(view["workflow"]["state"], "compensation_failed", "{view}");
    until("the held charge landed", Duration::from_secs(5), || channel.charges().len() == 1).await;
    let found = violations(url, channel.ledger()).await;
    assert!(found.iter().any(|v| v.contains("left paying")), "{found:?}");
    assert!(!found.iter().any(|v| v.contains("no way out")), "retry is its way out: {found:?}");

    execute(url, "UPDATE orders SET status = 'pending' WHERE order_no = 'O-1'").await;
    let found = violations(url, channel.ledger()).await;
    assert!(found.iter().any(|v| v.contains("no way out")), "an order moved behind its back: {found:?}");
    execute(url, "UPDATE orders SET status = 'paying' WHERE order_no = 'O-1'").await;

    channel.set_closeless(false);
    let retry = app.post(&format!("/v1/workflows/{workflow_id}/retry"), json!({})).await;
    assert_eq!(retry.status, 200, "{}", retry.text);
    let view = final_view(&app, &workflow_id, Duration::from_secs(10)).await;
    assert_eq!(view["workflow"]["state"], "cancelled", "{view}");
    assert_eq!(order_status(&app, "O-1").await, "pending");
    assert_eq!(channel.kept("default", "O-1"), 0, "{:?}", channel.charges());
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

// ---- 2. Waiting on the channel, said and steered ------------------------------------------------------------

on_every_backend!(a_cancel_meeting_a_processing_charge:
    a_cancel_meeting_a_processing_charge_says_what_it_waits_for_sqlite => sqlite,
    a_cancel_meeting_a_processing_charge_says_what_it_waits_for_postgres => postgres,
    a_cancel_meeting_a_processing_charge_says_what_it_waits_for_mysql => mysql,
);

on_every_backend!(a_processing_charge_asked_again:
    a_processing_charge_is_asked_again_by_an_operator_sqlite => sqlite,
    a_processing_charge_is_asked_again_by_an_operator_postgres => postgres,
    a_processing_charge_is_asked_again_by_an_operator_mysql => mysql,
);

/// The app with tenant `acme` and an operator: the tenant's client and the operator's.
async fn tenant_and_operator(url: &str, channel: &TestChannel) -> (App, App) {
    let auth = Auth::keys(vec![("acme".into(), ACME.into())]).with_operators(vec![("ops".into(), OPERATOR.into())]);
    let tenant = common::start(url, http_channel(channel), auth).await.with_key(ACME);
    let operator = App { base: tenant.base.clone(), client: reqwest::Client::new(), key: Some(OPERATOR.to_owned()) };
    (tenant, operator)
}

/// What `waiting_for` of a view says, as one line (empty without it).
fn waiting(view: &Value) -> String {
    let w = &view["waiting_for"];
    if w.is_null() { String::new() } else { format!("{} {}", w["step_key"], w["reason"]) }
}

/// `onceflow workflows show` of `workflow_id` on the database `url`.
fn shown(url: &str, workflow_id: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["workflows", "show", workflow_id, "--database-url", url])
        .env("RUST_LOG", "error")
        .output()
        .expect("run onceflow workflows show");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A cancel meets a `processing` charge: the compensation waits, and says so (view and CLI). A tenant may not
/// ask the channel; an operator may, with a reason. The charge settles `declined`: the cancel ends, nothing kept.
async fn a_cancel_meeting_a_processing_charge(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    let (tenant, operator) = tenant_and_operator(url, &channel).await;
    tenant.order("O-1", 1000).await;
    let token = tenant.token().await;
    assert_eq!(pay_in_background(&tenant, &token, body("O-1", 1000, "R-1")).await.status, 202);
    until("the charge reached the channel", Duration::from_secs(10), || channel.charges().len() == 1).await;
    let workflow_id = workflow_of(&token);
    let forward =
        view_when(&operator, &workflow_id, Duration::from_secs(5), |v| waiting(v).contains("processing")).await;
    let said = waiting(&forward);
    assert!(said.contains("call_channel") && said.contains("processing"), "waits for the charge: {forward}");

    let cancel = operator.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    let compensating = view_when(&operator, &workflow_id, Duration::from_secs(5), |v| {
        v["workflow"]["state"] == "compensating" && waiting(v).contains("compensate/") && waiting(v).contains("settle")
    })
    .await;
    let said = waiting(&compensating);
    assert!(said.contains("refund") && said.contains("processing"), "waits for the charge to settle: {compensating}");
    let printed = shown(url, &workflow_id);
    assert!(printed.contains("waiting for") && printed.contains("processing"), "the CLI says it too:\n{printed}");

    let path = format!("/v1/workflows/{workflow_id}/query-channel");
    let refused = tenant.post(&path, json!({"reason": "mine"})).await;
    refused.assert_problem(403, "forbidden");
    channel.settle_charges("declined");
    let asked = operator.post(&path, json!({"reason": "the customer called"})).await;
    assert_eq!(asked.status, 200, "{}", asked.text);
    let view = final_view(&operator, &workflow_id, Duration::from_secs(10)).await;
    assert_eq!(view["workflow"]["state"], "cancelled", "{view}");
    assert!(view["waiting_for"].is_null(), "an ended workflow waits for nothing: {view}");
    let again = operator.post(&path, json!({})).await;
    again.assert_problem(409, "invalid_state");
    assert_eq!(order_status(&tenant, "O-1").await, "pending");
    assert_eq!(channel.kept("acme", "O-1"), 0, "{:?}", channel.charges());
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

/// A payment whose charge is `processing` (no cancel): an operator asks the channel once it has settled, and the
/// payment completes — the same endpoint, with no body at all (but its JSON content type).
async fn a_processing_charge_asked_again(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    let (tenant, operator) = tenant_and_operator(url, &channel).await;
    tenant.order("O-1", 1000).await;
    let token = tenant.token().await;
    assert_eq!(pay_in_background(&tenant, &token, body("O-1", 1000, "R-1")).await.status, 202);
    until("the charge reached the channel", Duration::from_secs(10), || channel.charges().len() == 1).await;
    let workflow_id = workflow_of(&token);
    channel.settle_charges("succeeded");
    let path = format!("/v1/workflows/{workflow_id}/query-channel");
    // No body at all (an action is still asked for as JSON: see contracts/http-api.md, Operations).
    let asked = operator.send(Method::POST, &path, &[("content-type", "application/json")], None).await;
    assert_eq!(asked.status, 200, "{}", asked.text);
    let view = final_view(&operator, &workflow_id, Duration::from_secs(10)).await;
    assert_eq!(view["workflow"]["state"], "completed", "{view}");
    let paid = tenant.pay(&token, body("O-1", 1000, "R-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    assert_eq!(order_status(&tenant, "O-1").await, "paid");
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

// ---- 3. One request, one answer ----------------------------------------------------------------------------

on_every_backend!(one_token_two_bodies:
    one_token_two_bodies_each_answered_once_sqlite => sqlite,
    one_token_two_bodies_each_answered_once_postgres => postgres,
    one_token_two_bodies_each_answered_once_mysql => mysql,
);

/// The test's own connection to the app's database, holding a token's row so that a payment under it stalls in
/// its first phase.
enum Holder {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
    MySql(sqlx::pool::PoolConnection<sqlx::MySql>),
}

impl Holder {
    /// Holds `token`'s row (Postgres: the tokens' table; SQLite: the whole database's write lock) until
    /// [`Holder::release`].
    async fn hold(url: &str, token: &str) -> Self {
        if url.starts_with("sqlite:") {
            let mut conn = sqlx::SqlitePool::connect(url).await.unwrap().acquire().await.unwrap();
            sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await.unwrap();
            Self::Sqlite(conn)
        } else if url.starts_with("mysql:") {
            let mut conn = sqlx::MySqlPool::connect(url).await.unwrap().acquire().await.unwrap();
            sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
            let q = sqlx::query("SELECT token FROM idempotency_tokens WHERE token = ? FOR UPDATE").bind(token);
            q.execute(&mut *conn).await.unwrap();
            Self::MySql(conn)
        } else {
            // The table, not the row: an UPDATE whose condition does not hold of the row (another tenant's
            // token) would pass a row lock by.
            let _ = token;
            let mut conn = sqlx::PgPool::connect(url).await.unwrap().acquire().await.unwrap();
            sqlx::raw_sql("BEGIN; LOCK TABLE idempotency_tokens IN SHARE MODE").execute(&mut *conn).await.unwrap();
            Self::Postgres(conn)
        }
    }

    async fn release(self) {
        match self {
            Self::Sqlite(mut c) => sqlx::raw_sql("ROLLBACK").execute(&mut *c).await.map(drop),
            Self::Postgres(mut c) => sqlx::raw_sql("ROLLBACK").execute(&mut *c).await.map(drop),
            Self::MySql(mut c) => sqlx::raw_sql("ROLLBACK").execute(&mut *c).await.map(drop),
        }
        .unwrap();
    }
}

/// Request A (an unknown order) and request B (a payable one) under one token, B sent while A's first phase is
/// held in the database. A is refused and binds nothing; B pays — and B's answer is the one it gets again, not a
/// `422 idempotency_key_mismatch` made up from A's run, followed by a `201`.
async fn one_token_two_bodies(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = Arc::new(common::start(url, http_channel(&channel), Auth::SingleTenant).await);
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let holder = Holder::hold(url, &token).await;
    let (a_app, a_token) = (app.clone(), token.clone());
    let a = tokio::spawn(async move { a_app.pay(&a_token, body("O-404", 1000, "R-A")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (b_app, b_token) = (app.clone(), token.clone());
    let b = tokio::spawn(async move { b_app.pay(&b_token, body("O-1", 1000, "R-B")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    holder.release().await;
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    a.assert_problem(404, "order_not_found");
    let again = app.pay(&token, body("O-1", 1000, "R-B")).await;
    assert_eq!((b.status, &b.text), (again.status, &again.text), "B answered twice, differently");
    assert_eq!(b.status, 201, "{}", b.text);
    assert_eq!(channel.kept("default", "O-1"), 1);
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

on_every_backend!(another_tenants_token_in_flight:
    another_tenant_holding_a_token_cannot_make_its_requests_fail_sqlite => sqlite,
    another_tenant_holding_a_token_cannot_make_its_requests_fail_postgres => postgres,
    another_tenant_holding_a_token_cannot_make_its_requests_fail_mysql => mysql,
);

/// A tenant presenting another tenant's token (held in its first phase) while that tenant's own request under it
/// arrives: the owner's request is not answered `422` because of the intruder's run; it pays. The intruder's is
/// `404 token_not_found`, before and after.
async fn another_tenants_token_in_flight(url: &str) {
    const GLOBEX: &str = "key-of-tenant-globex";
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let auth = Auth::keys(vec![("acme".into(), ACME.into()), ("globex".into(), GLOBEX.into())]);
    let acme = Arc::new(common::start(url, http_channel(&channel), auth).await.with_key(ACME));
    let globex = Arc::new(App { base: acme.base.clone(), client: reqwest::Client::new(), key: Some(GLOBEX.into()) });
    acme.order("O-1", 1000).await;
    globex.order("O-1", 1000).await;
    let token = acme.token().await;
    let holder = Holder::hold(url, &token).await;
    let (intruder, t) = (globex.clone(), token.clone());
    let intruding = tokio::spawn(async move { intruder.pay(&t, body("O-1", 1000, "R-G")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (owner, t) = (acme.clone(), token.clone());
    let owned = tokio::spawn(async move { owner.pay(&t, body("O-1", 1000, "R-A")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    holder.release().await;
    let (intruding, owned) = (intruding.await.unwrap(), owned.await.unwrap());
    intruding.assert_problem(404, "token_not_found");
    assert_eq!(owned.status, 201, "{}", owned.text);
    let again = acme.pay(&token, body("O-1", 1000, "R-A")).await;
    assert_eq!(again.text, owned.text);
    globex.pay(&token, body("O-1", 1000, "R-G")).await.assert_problem(404, "token_not_found");
    assert_eq!((channel.kept("acme", "O-1"), channel.kept("globex", "O-1")), (1, 0));
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

// ---- 4. A command's answer, before and after retention ----------------------------------------------------

on_every_backend!(a_command_under_a_failed_payments_number:
    a_command_under_a_failed_payments_number_answers_alike_after_retention_sqlite => sqlite,
    a_command_under_a_failed_payments_number_answers_alike_after_retention_postgres => postgres,
    a_command_under_a_failed_payments_number_answers_alike_after_retention_mysql => mysql,
);

/// HTTP payments that failed — `order_not_payable` (the order was paid by another), and a cancel (the charge
/// settled declined) — then a queued command under each one's `request_no`: answered that payment's answer, and
/// after a retention pass that deleted the answers and histories, the same bytes again.
async fn a_command_under_a_failed_payments_number(url: &str) {
    struct Run(TestChannel);
    impl OnPayments for Run {
        type Output = ();
        async fn run<S: PaymentStore>(self, payments: Payments<S>) {
            let channel = self.0;
            let none = Duration::ZERO;
            let payments = payments.with_retention(Retention {
                response_retention: none,
                history_retention: none,
                ..Retention::default()
            });
            payments.engine().spawn_background();
            let cny = Currency::parse("CNY").unwrap();
            let wait = Duration::from_secs(10);
            let request = |order: &str, no: &str| {
                let (order, no) = (OrderNo::parse(order).unwrap(), RequestNo::parse(no).unwrap());
                PaymentRequest::new(order, 1000, cny.clone(), Some(no)).unwrap()
            };
            for order in ["O-1", "O-2"] {
                payments.create_order("default", &OrderNo::parse(order).unwrap(), 1000, &cny).await.unwrap();
            }
            let pay = |req: PaymentRequest| {
                let payments = payments.clone();
                async move {
                    let token = payments.issue_token("default").await.unwrap().token;
                    (payments.pay("default", &token, "/v1/payments", &req, wait).await.unwrap(), token)
                }
            };
            assert_eq!(pay(request("O-1", "R-0")).await.0.status, 201);
            let (not_payable, _) = pay(request("O-1", "R-1")).await;
            assert_eq!(not_payable.status, 409, "{}", not_payable.body);

            channel.set_charge_mode(ChargeMode::Processing);
            let token = payments.issue_token("default").await.unwrap().token;
            let quick = Duration::from_millis(1);
            let accepted = payments.pay("default", &token, "/v1/payments", &request("O-2", "R-2"), quick).await;
            assert_eq!(accepted.unwrap().status, 202);
            let workflow_id = payment_workflow_id(&token);
            payments.engine().cancel(&workflow_id).await.unwrap();
            channel.settle_charges("declined");
            let cancelled = payments.engine().wait(&workflow_id, wait).await.unwrap();
            assert!(matches!(cancelled, Some(onceflow_engine::Outcome::Cancelled(_))), "{cancelled:?}");
            let failed = payments.pay("default", &token, "/v1/payments", &request("O-2", "R-2"), wait).await;
            let failed = failed.unwrap();
            assert_eq!(failed.status, 502, "{}", failed.body);

            for (http, order, no) in [(&not_payable, "O-1", "R-1"), (&failed, "O-2", "R-2")] {
                let before = payments.pay_command("default", &request(order, no), wait).await.unwrap();
                assert_eq!((before.status, &before.body), (http.status, &http.body), "{no}: the payment's answer");
                let pass = payments.retention_pass(false).await.unwrap().unwrap();
                assert!(pass.used_tokens > 0 && pass.workflows > 0, "{pass:?}");
                let after = payments.pay_command("default", &request(order, no), wait).await.unwrap();
                assert_eq!(
                    (after.status, &after.body),
                    (before.status, &before.body),
                    "{no}: answered otherwise after retention"
                );
            }
        }
    }
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    with_payments(url, http_channel(&channel), EngineConfig::default(), 8, Run(channel.clone())).await.unwrap();
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

// ---- 5. A refund answer is checked ------------------------------------------------------------------------

on_every_backend!(a_refund_answer_that_does_not_match:
    a_refund_answer_that_does_not_match_is_no_success_sqlite => sqlite,
    a_refund_answer_that_does_not_match_is_no_success_postgres => postgres,
    a_refund_answer_that_does_not_match_is_no_success_mysql => mysql,
);

/// A payment of 1000 for `O-1` whose charge is held `processing`, cancelled by an operator; then the charge
/// succeeds and the compensation refunds it under `refunds` (the channel's refund mode). The app, the channel
/// and the workflow's final view.
async fn cancelled_while_charging(url: &str, refunds: RefundMode) -> (App, TestChannel, Value) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    let app = common::start(url, http_channel(&channel), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    assert_eq!(pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await.status, 202);
    until("the charge reached the channel", Duration::from_secs(10), || channel.charges().len() == 1).await;
    let workflow_id = workflow_of(&token);
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    channel.set_refund_mode(refunds);
    channel.settle_charges("succeeded");
    let view = final_view(&app, &workflow_id, Duration::from_secs(20)).await;
    (app, channel, view)
}

/// The compensation's refund is answered `succeeded` for half the amount (the channel refunded half). Never a
/// success: the order is not released for a second charge while half the money is kept. (The half is recorded as
/// refunded and the payment rolls forward, keeping the rest.)
async fn a_refund_answer_that_does_not_match(url: &str) {
    let (app, channel, view) = cancelled_while_charging(url, RefundMode::Half).await;
    let status = order_status(&app, "O-1").await;
    let kept = channel.kept("default", "O-1");
    assert!(!(status == "pending" && kept > 0), "order released with {kept} charge kept: {view}");
    let another = app.pay(&app.token().await, body("O-1", 1000, "R-2")).await;
    another.assert_problem(409, "order_not_payable");
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

on_every_backend!(a_refusal_of_the_repeated_refund:
    a_refusal_of_a_repeated_compensation_refund_asks_what_the_channel_holds_sqlite => sqlite,
    a_refusal_of_a_repeated_compensation_refund_asks_what_the_channel_holds_postgres => postgres,
    a_refusal_of_a_repeated_compensation_refund_asks_what_the_channel_holds_mysql => mysql,
);

/// The compensation's refund is made but its reply lost, and the same request again is refused
/// `409 exceeds_charge` (the channel checks the balance the refund itself took before its number). The refusal
/// says nothing of the number: what the channel holds under it is asked, the refund it made is the outcome, and
/// the payment is undone (order payable again, nothing kept) — not rolled forward as if the money were kept.
async fn a_refusal_of_the_repeated_refund(url: &str) {
    let (app, channel, view) = cancelled_while_charging(url, RefundMode::LoseReplyBalanceFirst).await;
    assert_eq!(view["workflow"]["state"], "cancelled", "{view}");
    assert_eq!(order_status(&app, "O-1").await, "pending", "{view}");
    assert_eq!(channel.kept("default", "O-1"), 0);
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}

// ---- 6. Leases by the database's clock ---------------------------------------------------------------------

/// A process clock `skew_ms` off the wall clock (and the database's).
struct Skewed(i64);

impl Clock for Skewed {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0
    }
}

const HOUR: i64 = 60 * 60 * 1000;

macro_rules! skew_test {
    ($name:ident, $connect:expr, $backend:literal $(, $ignore:meta)?) => {
        $(#[$ignore])?
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database($backend).await else {
                eprintln!("skipped: no {} server", $backend);
                return;
            };
            let connect = $connect;
            let (a, b, c) = (connect(url.clone()).await, connect(url.clone()).await, connect(url.clone()).await);
            a.migrate_payments().await.unwrap();
            leases_by_the_databases_clock(a, b, c).await;
        }
    };
}

skew_test!(
    a_skewed_clock_takes_no_live_lease_sqlite,
    |u: String| async move { SqliteStore::connect(&u).await.unwrap() },
    "sqlite"
);
skew_test!(
    a_skewed_clock_takes_no_live_lease_postgres,
    |u: String| async move { PgStore::connect(&u, 8).await.unwrap() },
    "postgres",
    cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")
);
skew_test!(
    a_skewed_clock_takes_no_live_lease_mysql,
    |u: String| async move { MySqlStore::connect(&u, 8).await.unwrap() },
    "mysql",
    cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")
);

/// Three processes' engines on one database, each with a clock of its own: `a` right, `b` an hour ahead, `c` an
/// hour behind. The channel holds each charge 1.5 s. A payment `a` runs is not taken by `b` (whose clock says
/// its lease ended an hour ago), and a payment `c` runs is not taken by `a` (for whose clock `c`'s lease ended an
/// hour ago): each reaches the channel once.
async fn leases_by_the_databases_clock<S: PaymentStore>(a: S, b: S, c: S) {
    let channel = TestChannel::serve(Duration::from_millis(1500), false).await;
    let config = EngineConfig { lease: Duration::from_secs(3), ..EngineConfig::default() };
    let a = Payments::with_clock(a, http_channel(&channel), config.clone(), SystemClock);
    let b = Payments::with_clock(b, http_channel(&channel), config.clone(), Skewed(HOUR));
    let c = Payments::with_clock(c, http_channel(&channel), config, Skewed(-HOUR));
    a.engine().spawn_background();
    c.engine().spawn_background();
    let cny = Currency::parse("CNY").unwrap();
    let wait = Duration::from_secs(10);
    for (payments, order, no, other) in [(&a, "O-1", "R-1", &b), (&c, "O-2", "R-2", &a)] {
        let order_no = OrderNo::parse(order).unwrap();
        payments.create_order("default", &order_no, 1000, &cny).await.unwrap();
        let token = payments.issue_token("default").await.unwrap().token;
        let request = PaymentRequest::new(order_no, 1000, cny.clone(), Some(RequestNo::parse(no).unwrap())).unwrap();
        let quick = Duration::from_millis(1);
        let accepted = payments.pay("default", &token, "/v1/payments", &request, quick).await.unwrap();
        assert_eq!(accepted.status, 202, "{}", accepted.body);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(other.engine().recover_once().await.unwrap(), 0, "{no}: a live lease was taken");
        let paid = payments.pay("default", &token, "/v1/payments", &request, wait).await.unwrap();
        assert_eq!(paid.status, 201, "{}", paid.body);
        let row = payments.engine().store().workflow(&payment_workflow_id(&token)).await.unwrap().unwrap();
        assert_eq!(row.lease_epoch, 1, "{no}: claimed by another process: {row:?}");
    }
    assert_eq!(channel.charge_calls(), 2, "each payment reached the channel once");
    a.engine().shutdown(Duration::from_millis(100)).await.unwrap();
    c.engine().shutdown(Duration::from_millis(100)).await.unwrap();
}

// ---- Crashes ----------------------------------------------------------------------------------------------

/// `onceflow serve` on `url` charging through `channel` (1 s leases), and its base URL.
async fn serve(url: &str, channel: &TestChannel) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["serve", "--listen", &listen, "--database-url", url, "--channel-url", &channel.url])
        .args(["--lease-ms", "1000"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start onceflow serve");
    let base = format!("http://{listen}");
    let started = Instant::now();
    while !reqwest::get(format!("{base}/readyz")).await.is_ok_and(|r| r.status().is_success()) {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, base)
}

on_every_backend!(a_crash_between_a_failed_refund_and_its_roll_forward:
    a_crash_between_a_failed_refund_and_its_roll_forward_sqlite => sqlite,
    a_crash_between_a_failed_refund_and_its_roll_forward_postgres => postgres,
    a_crash_between_a_failed_refund_and_its_roll_forward_mysql => mysql,
);

/// A cancel's compensation asks for the refund; the channel records it `failed` and holds its reply; the serving
/// process is SIGKILLed meanwhile. Another process resumes the compensation: it closes the number (charged),
/// asks for the same refund again (the same number: one refund at the channel), hears `failed`, and rolls the
/// payment forward — once.
async fn a_crash_between_a_failed_refund_and_its_roll_forward(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    let (mut first, base) = serve(url, &channel).await;
    let app = App { base, client: reqwest::Client::new(), key: None };
    app.order("O-1", 1000).await;
    let token = app.token().await;
    assert_eq!(pay_in_background(&app, &token, body("O-1", 1000, "R-1")).await.status, 202);
    until("the charge reached the channel", Duration::from_secs(10), || channel.charges().len() == 1).await;
    let workflow_id = workflow_of(&token);
    let cancel = app.post(&format!("/v1/workflows/{workflow_id}/cancel"), json!({})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    channel.set_refund_mode(RefundMode::Fail);
    channel.set_refund_hold(Duration::from_secs(2));
    channel.settle_charges("succeeded");
    until("the refund was recorded", Duration::from_secs(15), || channel.refunds().len() == 1).await;
    first.kill().expect("SIGKILL");
    first.wait().unwrap();

    let (mut second, base) = serve(url, &channel).await;
    let app = App { base, client: reqwest::Client::new(), key: None };
    let view = final_view(&app, &workflow_id, Duration::from_secs(20)).await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(view["workflow"]["state"], "completed", "{view}");
    assert_eq!(view["workflow"]["error"]["code"], "kept_after_failed_refund", "{view}");
    assert_eq!(channel.refunds().len(), 1, "the same refund asked again: {:?}", channel.refunds());
    assert_eq!(channel.kept("default", "O-1"), 1);
    let found = violations(url, channel.ledger()).await;
    assert!(found.is_empty(), "{found:?}");
}
