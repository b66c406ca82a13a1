//! The channel's word settles payments and refunds (issue 31), on every backend, against the tests' own channel
//! (`common::channel`, whose queries may lag behind its settlements, so that only a notification can tell): a
//! `processing` charge is settled by a signed notification within about a second, not by polling, and so is a
//! `processing` refund; a notification whose data is not the payment's (another amount) settles nothing; a
//! duplicate changes nothing, and one contradicting a final status changes nothing either; a notification for a
//! payment being cancelled informs its compensation (the charge is refunded) and never makes it succeed. The
//! money invariants hold in each. A statement that settles a payment still `processing` settles it too.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::App;
use common::channel::{ChargeMode, RefundMode, TestChannel};
use common::channel_word::{notification, now_secs, send, sign, start_with_accounts};
use onceflow_api::{Auth, OnPayments, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::{Channel, ChannelAccounts, HttpChannel, MockChannel, PaymentStore, Payments};
use serde_json::{Value, json};

macro_rules! on_every_backend {
    ($scenario:ident: $($name:ident => $backend:ident),+ $(,)?) => {
        $( backend_test!($backend, $name, $scenario); )+
    };
}
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

const SECRET: &str = "whsec_acme_1";

/// Tenant `default`'s merchant is `default`, with [`SECRET`]; tenant `globex`'s is `globex`, with its own.
fn accounts() -> ChannelAccounts {
    ChannelAccounts::new(Vec::new(), vec![("default".into(), SECRET.into()), ("globex".into(), "whsec_globex".into())])
}

/// A channel holding every new charge `processing`, its queries and closes lagging (answering `processing`
/// whatever the charge became), and the API charging it.
async fn lagging(url: &str) -> (TestChannel, App) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    channel.set_query_lag(true);
    let http: Arc<dyn Channel> = Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap());
    let app = start_with_accounts(url, http, Auth::SingleTenant, accounts()).await;
    (channel, app)
}

/// Starts paying 1000 CNY for `order_no` as `request_no` without waiting: `202`, processing. The token.
async fn start_paying(app: &App, order_no: &str, request_no: &str) -> String {
    app.order(order_no, 1000).await;
    let token = app.token().await;
    let body = json!({"order_no": order_no, "amount": 1000, "currency": "CNY", "request_no": request_no});
    let a = app
        .send(reqwest::Method::POST, "/v1/payments", &[("idempotency-key", &token), ("prefer", "wait=0")], Some(body))
        .await;
    assert_eq!(a.status, 202, "{}", a.text);
    token
}

/// The payment's status as the API shows it.
async fn payment_status(app: &App, request_no: &str) -> String {
    let a = app.get(&format!("/v1/payments/{request_no}")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json()["status"].as_str().unwrap_or_default().to_owned()
}

/// Waits up to `within` for `status()` to leave `from`: what it became, and when.
async fn settled<F, Fut>(within: Duration, from: &str, status: F) -> (String, Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let started = Instant::now();
    loop {
        let now = status().await;
        if now != from || started.elapsed() > within {
            return (now, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn charge_data(no: &str, order_no: &str, amount: i64, status: &str) -> Value {
    json!({"merchant_id": "default", "merchant_request_no": no, "charge_id": format!("tc_{no}"), "status": status,
        "amount": amount, "currency": "CNY", "order_no": order_no})
}

/// Sends the notification `id` of `kind` with `data` from merchant `default`, signed now: its status.
async fn notify(app: &App, id: &str, kind: &str, data: Value) -> u16 {
    notify_as(app, "default", SECRET, id, kind, data).await
}

/// Sends the notification `id` of `kind` with `data` from `merchant`, signed now with `secret`: its status.
async fn notify_as(app: &App, merchant: &str, secret: &str, id: &str, kind: &str, data: Value) -> u16 {
    let body = notification(id, kind, merchant, data).to_string();
    let (status, text) = send(&app.base, body.as_bytes(), Some(&sign(body.as_bytes(), now_secs(), &[secret]))).await;
    assert_eq!(status, 204, "{text}");
    status
}

/// Every word recorded on `kind` `number` of tenant `default`: `(id, outcome)`.
async fn outcomes(url: &str, kind: &'static str, number: &str) -> Vec<(String, Option<String>)> {
    struct Words(&'static str, String);
    impl OnPayments for Words {
        type Output = Vec<(String, Option<String>)>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
            let words = payments.engine().store().words_on("default", self.0, &self.1).await.unwrap();
            words.into_iter().map(|w| (w.notification_id, w.outcome)).collect()
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Words(kind, number.to_owned())).await.unwrap()
}

/// The money invariants hold against the channel's ledger.
async fn invariants_hold(url: &str, channel: &TestChannel) {
    let violations = common::invariants(url, channel.ledger()).await;
    assert!(violations.is_empty(), "{violations:?}");
}

/// A charge the channel keeps `processing` at its query, polled for a while (its waits grown past a second),
/// is settled by a signed notification within about a second: the notification wakes the workflow, whose
/// attempt takes the channel's word through the same checks as an answer, and marks it applied.
async fn a_notification_settles_a_processing_charge(url: &str) {
    let (channel, app) = lagging(url).await;
    start_paying(&app, "O-1", "R-1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(payment_status(&app, "R-1").await, "processing", "the channel's query says processing");
    // The channel settles it and says so.
    channel.settle_charges("succeeded");
    notify(&app, "ntf_1", "charge.succeeded", charge_data("R-1", "O-1", 1000, "succeeded")).await;
    let (status, after) = settled(Duration::from_secs(5), "processing", || payment_status(&app, "R-1")).await;
    assert_eq!(status, "succeeded", "settled by the notification");
    assert!(
        after < Duration::from_millis(1500),
        "within about a second of the notification, not by polling: {after:?}"
    );
    let paid = app.get("/v1/payments/R-1").await.json();
    assert_eq!(paid["charge_id"], "tc_R-1", "{paid}");
    assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "paid");
    assert_eq!(outcomes(url, "charge", "R-1").await, [("ntf_1".to_owned(), Some("settled".to_owned()))]);
    invariants_hold(url, &channel).await;
}

on_every_backend!(a_notification_settles_a_processing_charge:
    a_notification_settles_a_processing_charge_on_sqlite => sqlite,
    a_notification_settles_a_processing_charge_on_postgres => postgres,
    a_notification_settles_a_processing_charge_on_mysql => mysql,
);

/// A notification whose data is not the payment's (another amount) settles nothing and is marked not ours; the
/// right one then settles it. A duplicate of it changes nothing, nor does a `charge.declined` for the payment now
/// succeeded (kept as a contradiction for operators).
async fn only_the_payments_own_word_settles_it(url: &str) {
    let (channel, app) = lagging(url).await;
    start_paying(&app, "O-1", "R-1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    notify(&app, "ntf_other", "charge.succeeded", charge_data("R-1", "O-1", 999, "succeeded")).await;
    // Another tenant's merchant, under the same number (numbers are unique per merchant only).
    let mut theirs = charge_data("R-1", "O-1", 1000, "succeeded");
    theirs["merchant_id"] = json!("globex");
    notify_as(&app, "globex", "whsec_globex", "ntf_globex", "charge.succeeded", theirs).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(payment_status(&app, "R-1").await, "processing", "another amount, another tenant: nothing settled");
    assert_eq!(outcomes(url, "charge", "R-1").await, [("ntf_other".to_owned(), Some("not_ours".to_owned()))]);

    channel.settle_charges("succeeded");
    notify(&app, "ntf_1", "charge.succeeded", charge_data("R-1", "O-1", 1000, "succeeded")).await;
    let (status, _) = settled(Duration::from_secs(5), "processing", || payment_status(&app, "R-1")).await;
    assert_eq!(status, "succeeded");
    let before = app.get("/v1/payments/R-1").await.text;

    // The same notification again, and a contradicting one: nothing changes.
    notify(&app, "ntf_1", "charge.succeeded", charge_data("R-1", "O-1", 1000, "succeeded")).await;
    notify(&app, "ntf_declined", "charge.declined", charge_data("R-1", "O-1", 1000, "declined")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.get("/v1/payments/R-1").await.text, before, "nothing moves backwards");
    assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "paid");
    let mut seen = outcomes(url, "charge", "R-1").await;
    seen.sort();
    assert_eq!(
        seen,
        [
            ("ntf_1".to_owned(), Some("settled".to_owned())),
            ("ntf_declined".to_owned(), Some("contradicts".to_owned())),
            ("ntf_other".to_owned(), Some("not_ours".to_owned())),
        ]
    );
    invariants_hold(url, &channel).await;
}

on_every_backend!(only_the_payments_own_word_settles_it:
    only_the_payments_own_word_settles_it_on_sqlite => sqlite,
    only_the_payments_own_word_settles_it_on_postgres => postgres,
    only_the_payments_own_word_settles_it_on_mysql => mysql,
);

/// A refund the channel keeps `processing` is settled by its signed notification within about a second.
async fn a_notification_settles_a_processing_refund(url: &str) {
    let (channel, app) = lagging(url).await;
    channel.set_charge_mode(ChargeMode::Succeed);
    channel.set_query_lag(false);
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let paid =
        app.pay(&token, json!({"order_no": "O-1", "amount": 1000, "currency": "CNY", "request_no": "R-1"})).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    channel.set_refund_mode(RefundMode::Processing);
    let token = app.token().await;
    let asked = app
        .send(
            reqwest::Method::POST,
            "/v1/payments/R-1/refunds",
            &[("idempotency-key", &token), ("prefer", "wait=0")],
            Some(json!({"amount": 400, "refund_no": "RF-1"})),
        )
        .await;
    assert_eq!(asked.status, 202, "{}", asked.text);
    let refund_status = || async {
        let a = app.get("/v1/refunds/RF-1").await;
        assert_eq!(a.status, 200, "{}", a.text);
        a.json()["status"].as_str().unwrap_or_default().to_owned()
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(refund_status().await, "processing");
    // The channel says the refund succeeded; its answer to the repeated request still says processing.
    let held = channel.refunds().pop().expect("the channel holds the refund");
    let mut data = held.clone();
    data["status"] = json!("succeeded");
    let number = held["merchant_refund_no"].as_str().unwrap().to_owned();
    notify(&app, "ntf_r1", "refund.succeeded", data).await;
    let (status, after) = settled(Duration::from_secs(5), "processing", refund_status).await;
    assert_eq!(status, "succeeded", "settled by the notification");
    assert!(after < Duration::from_millis(1500), "within about a second: {after:?}");
    assert_eq!(outcomes(url, "refund", &number).await, [("ntf_r1".to_owned(), Some("settled".to_owned()))]);
    let refunded = app.get("/v1/payments/R-1").await.json();
    assert_eq!(refunded["refunded_amount"], 400, "{refunded}");
    channel.settle_refunds("succeeded");
    invariants_hold(url, &channel).await;
}

on_every_backend!(a_notification_settles_a_processing_refund:
    a_notification_settles_a_processing_refund_on_sqlite => sqlite,
    a_notification_settles_a_processing_refund_on_postgres => postgres,
    a_notification_settles_a_processing_refund_on_mysql => mysql,
);

/// A payment being cancelled while its charge is `processing`: the notification that the charge succeeded
/// informs the compensation, which refunds the charge; the payment never succeeds, the order is free again.
async fn a_notification_for_a_cancelled_payment_only_informs_its_compensation(url: &str) {
    let (channel, app) = lagging(url).await;
    let token = start_paying(&app, "O-1", "R-1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let workflow = onceflow_payments::payment_workflow_id(&onceflow_payments::Token::parse(token).unwrap());
    let cancelled = app.post(&format!("/v1/workflows/{workflow}/cancel"), json!({})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    // Its compensation closes the number: the channel's close says the charge is processing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(payment_status(&app, "R-1").await, "processing", "compensating, waiting for the charge to settle");
    channel.settle_charges("succeeded");
    notify(&app, "ntf_1", "charge.succeeded", charge_data("R-1", "O-1", 1000, "succeeded")).await;
    let (status, after) = settled(Duration::from_secs(5), "processing", || payment_status(&app, "R-1")).await;
    assert_eq!(status, "failed", "a cancelled payment never succeeds by the channel's word");
    assert!(after < Duration::from_millis(1500), "within about a second: {after:?}");
    let charge = channel.charges().into_iter().find(|c| c.merchant_request_no == "R-1").unwrap();
    assert!(charge.refunded && charge.refunded_amount == 1000, "the charge it took is refunded: {charge:?}");
    assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "pending");
    assert_eq!(outcomes(url, "charge", "R-1").await, [("ntf_1".to_owned(), Some("informed_compensation".to_owned()))]);
    invariants_hold(url, &channel).await;
}

on_every_backend!(a_notification_for_a_cancelled_payment_only_informs_its_compensation:
    a_notification_for_a_cancelled_payment_only_informs_its_compensation_on_sqlite => sqlite,
    a_notification_for_a_cancelled_payment_only_informs_its_compensation_on_postgres => postgres,
    a_notification_for_a_cancelled_payment_only_informs_its_compensation_on_mysql => mysql,
);

/// A statement's line for a payment still `processing` settles it: reconciliation records the statement's word,
/// and the word left to deliver wakes the payment's workflow within the next pass (every second).
async fn a_statement_settles_a_processing_charge(url: &str) {
    use common::channel_word::{Served, charge_line};
    use onceflow_payments::Reconciler;
    let (channel, app) = lagging(url).await;
    start_paying(&app, "O-1", "R-1").await;
    // Long enough for its waits to have grown past 6 s: the next poll is far off.
    tokio::time::sleep(Duration::from_secs(7)).await;
    channel.settle_charges("succeeded");
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(2);
    let at = day.and_hms_opt(11, 0, 0).unwrap().and_utc().to_rfc3339();
    let s = &channel.statements;
    s.set(
        "default",
        &day.to_string(),
        Served::Lines { lines: vec![charge_line("R-1", "O-1", 1000, "succeeded", &at)], complete: true },
    );
    for d in [day.pred_opt().unwrap(), day.succ_opt().unwrap()] {
        s.set("default", &d.to_string(), Served::Lines { lines: vec![], complete: true });
    }
    struct Run(Arc<dyn Channel>, chrono::NaiveDate);
    impl OnPayments for Run {
        type Output = ();
        async fn run<S: PaymentStore>(self, payments: Payments<S>) {
            let reconciler = Reconciler::new(payments, self.0, accounts(), vec!["default".into()]);
            reconciler.run_day(self.1, None).await.unwrap().expect("the lock is free");
        }
    }
    let http: Arc<dyn Channel> = Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap());
    with_payments(url, http.clone(), EngineConfig::default(), 4, Run(http, day)).await.unwrap();
    let (status, after) = settled(Duration::from_secs(5), "processing", || payment_status(&app, "R-1")).await;
    assert_eq!(status, "succeeded", "settled by the statement's word");
    assert!(after < Duration::from_millis(2500), "within the next delivery pass: {after:?}");
    let id = format!("statement:{day}:charge:R-1");
    assert_eq!(outcomes(url, "charge", "R-1").await, [(id, Some("settled".to_owned()))]);
    invariants_hold(url, &channel).await;
}

on_every_backend!(a_statement_settles_a_processing_charge:
    a_statement_settles_a_processing_charge_on_sqlite => sqlite,
    a_statement_settles_a_processing_charge_on_postgres => postgres,
    a_statement_settles_a_processing_charge_on_mysql => mysql,
);

/// A notification that arrives while the charge's own request is still in flight (before its answer): the
/// answer, `processing`, is followed at once by an attempt that takes the notification's word.
async fn a_notification_before_the_charges_answer(url: &str) {
    let channel = TestChannel::serve(Duration::from_secs(2), false).await;
    channel.set_charge_mode(ChargeMode::Processing);
    channel.set_query_lag(true);
    let http: Arc<dyn Channel> = Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap());
    let app = start_with_accounts(url, http, Auth::SingleTenant, accounts()).await;
    let started = Instant::now();
    start_paying(&app, "O-1", "R-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    notify(&app, "ntf_1", "charge.succeeded", charge_data("R-1", "O-1", 1000, "succeeded")).await;
    let (status, _) = settled(Duration::from_secs(5), "processing", || payment_status(&app, "R-1")).await;
    assert_eq!(status, "succeeded");
    let total = started.elapsed();
    assert!(total < Duration::from_millis(3000), "settled as soon as the answer came (held 2 s): {total:?}");
    channel.settle_charges("succeeded");
    invariants_hold(url, &channel).await;
}

on_every_backend!(a_notification_before_the_charges_answer:
    a_notification_before_the_charges_answer_on_sqlite => sqlite,
    a_notification_before_the_charges_answer_on_postgres => postgres,
    a_notification_before_the_charges_answer_on_mysql => mysql,
);
