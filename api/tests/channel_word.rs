//! The channel's word (issue 31), on every backend, against the tests' own channel (`common::channel`, its
//! statements and notifications in `common::channel_word`): notifications that do not verify change nothing,
//! one that does is recorded once however often it comes; a statement with one line of each class is classified
//! exactly, across midnight; a day without a statement or with an incomplete one is done again later; the
//! channel going down mid-run leaves the last results whole.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use common::App;
use common::channel::TestChannel;
use common::channel_word::{Served, charge_line, notification, now_secs, refund_line, send, sign, start_with_accounts};
use onceflow_api::{Auth, OnPayments, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::{
    Channel, ChannelAccounts, HttpChannel, MockChannel, PaymentStore, Payments, ReconcileReport, Reconciler,
};
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

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

/// Tenant `default`'s merchant is `default`, with [`SECRET`]; merchant `globex` (tenant `globex`) has its own.
fn accounts() -> ChannelAccounts {
    ChannelAccounts::new(Vec::new(), pairs(&[("default", SECRET), ("globex", "whsec_globex")]))
}

fn http_channel(channel: &TestChannel) -> Arc<dyn Channel> {
    Arc::new(HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap())
}

/// Every word recorded on the database `url`: `(source, kind, number, status)`, and how many.
async fn words(url: &str) -> (i64, Vec<(String, String, String, String)>) {
    struct Words;
    impl OnPayments for Words {
        type Output = (i64, Vec<(String, String, String, String)>);
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
            let store = payments.engine().store();
            let count = store.count_words().await.unwrap();
            let mut all = Vec::new();
            for no in ["R-1", "R-res", "NOPE", "R-comp-refund"] {
                for kind in ["charge", "refund"] {
                    for w in store.words_on("default", kind, no).await.unwrap() {
                        all.push((w.source, w.kind, w.number, w.status));
                    }
                }
            }
            (count, all)
        }
    }
    with_payments(url, Arc::new(MockChannel::reliable()), EngineConfig::default(), 2, Words).await.unwrap()
}

fn charge_data(no: &str, status: &str) -> Value {
    json!({"merchant_id": "default", "merchant_request_no": no, "charge_id": "tc_1", "status": status,
        "amount": 1000, "currency": "CNY", "order_no": "O-1"})
}

/// Bad signature, stale or future time, another merchant's secret, a tampered body, no signature, an unknown
/// merchant, a merchant without a secret: each `401 notification_unverified` with the same body, and nothing
/// recorded.
async fn unverifiable_notifications_change_nothing(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = start_with_accounts(url, http_channel(&channel), Auth::SingleTenant, accounts()).await;
    let body = notification("ntf_1", "charge.succeeded", "default", charge_data("R-1", "succeeded")).to_string();
    // Well outside and well inside the 5 minutes: the cases take a while on a loaded machine, and a `t` one second
    // into the future was taken once the server's clock had moved on by that second.
    let now = now_secs();
    let tampered = body.replace("1000", "1");
    let unknown = notification("ntf_2", "charge.succeeded", "initech", charge_data("R-1", "succeeded")).to_string();
    let cases: Vec<(&str, String, Option<String>)> = vec![
        ("bad signature", body.clone(), Some(format!("t={now},v1={}", "ab".repeat(32)))),
        ("stale", body.clone(), Some(sign(body.as_bytes(), now - 400, &[SECRET]))),
        ("from the future", body.clone(), Some(sign(body.as_bytes(), now + 400, &[SECRET]))),
        ("another merchant's secret", body.clone(), Some(sign(body.as_bytes(), now, &["whsec_globex"]))),
        ("tampered", tampered.clone(), Some(sign(body.as_bytes(), now, &[SECRET]))),
        ("no signature", body.clone(), None),
        ("garbage signature", body.clone(), Some("v1=zz,t=now".into())),
        ("unknown merchant", unknown.clone(), Some(sign(unknown.as_bytes(), now, &[SECRET]))),
        ("not json", "nonsense".into(), Some(sign(b"nonsense", now, &[SECRET]))),
    ];
    let mut bodies = Vec::new();
    for (what, body, signature) in cases {
        let (status, text) = send(&app.base, body.as_bytes(), signature.as_deref()).await;
        assert_eq!(status, 401, "{what}: {text}");
        let problem: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(problem["code"], "notification_unverified", "{what}");
        bodies.push(text);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "the same body whatever was wrong: {bodies:?}");
    assert_eq!(words(url).await.0, 0, "nothing recorded");
    // Within the tolerance, the right secret: taken.
    let (status, text) = send(&app.base, body.as_bytes(), Some(&sign(body.as_bytes(), now - 200, &[SECRET]))).await;
    assert_eq!(status, 204, "{text}");
    assert_eq!(words(url).await.0, 1);
}

on_every_backend!(unverifiable_notifications_change_nothing:
    unverifiable_notifications_change_nothing_on_sqlite => sqlite,
    unverifiable_notifications_change_nothing_on_postgres => postgres,
    unverifiable_notifications_change_nothing_on_mysql => mysql,
);

/// The same notification five times at once and again later (each signed afresh, one during a rotation with two
/// `v1=`): every one `204`, recorded once. A verified body that is no notification is `400`; a notification of a
/// number onceflow does not hold is kept.
async fn a_notification_is_recorded_once(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = start_with_accounts(url, http_channel(&channel), Auth::SingleTenant, accounts()).await;
    let body = notification("ntf_7", "charge.succeeded", "default", charge_data("R-1", "succeeded")).to_string();
    let sends = (0..5).map(|_| {
        let (base, body) = (app.base.clone(), body.clone());
        tokio::spawn(
            async move { send(&base, body.as_bytes(), Some(&sign(body.as_bytes(), now_secs(), &[SECRET]))).await },
        )
    });
    for sent in sends.collect::<Vec<_>>() {
        let (status, text) = sent.await.unwrap();
        assert_eq!(status, 204, "{text}");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let late = sign(body.as_bytes(), now_secs(), &["an-old-secret", SECRET]);
    assert_eq!(send(&app.base, body.as_bytes(), Some(&late)).await.0, 204, "late, during a rotation");
    let (count, all) = words(url).await;
    assert_eq!(count, 1, "{all:?}");
    assert_eq!(all, [("notification".into(), "charge".into(), "R-1".into(), "succeeded".into())]);

    let not_one = notification("ntf_8", "charge.exploded", "default", charge_data("R-1", "succeeded")).to_string();
    let (status, text) =
        send(&app.base, not_one.as_bytes(), Some(&sign(not_one.as_bytes(), now_secs(), &[SECRET]))).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_request"), "{text}");
    let evidence = notification("ntf_9", "charge.declined", "default", charge_data("NOPE", "declined")).to_string();
    let (status, _) =
        send(&app.base, evidence.as_bytes(), Some(&sign(evidence.as_bytes(), now_secs(), &[SECRET]))).await;
    assert_eq!(status, 204);
    assert_eq!(words(url).await.0, 2, "kept as evidence");
}

on_every_backend!(a_notification_is_recorded_once:
    a_notification_is_recorded_once_on_sqlite => sqlite,
    a_notification_is_recorded_once_on_postgres => postgres,
    a_notification_is_recorded_once_on_mysql => mysql,
);

/// The mock channel notifies a `processing` charge once it settles, signed, to the `notify_url` `--public-url`
/// makes; onceflow records it.
async fn the_mock_notifies_a_settled_charge(url: &str) {
    let mock = MockChannel::new(onceflow_payments::MockChannelConfig {
        processing_rate: 1.0,
        settle_ms: 300,
        notify_secrets: pairs(&[("default", SECRET)]),
        notify_schedule: vec![Duration::from_millis(200), Duration::from_secs(1)],
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let notifying =
        onceflow_payments::with_notify_url(Arc::new(mock.clone()), format!("{base}/v1/channel/notifications"));
    common::channel_word::start_on(listener, url, notifying, Auth::SingleTenant, accounts()).await;
    let app = App { base, client: reqwest::Client::new(), key: None };
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let paid = app
        .send(
            reqwest::Method::POST,
            "/v1/payments",
            &[("idempotency-key", &token), ("prefer", "wait=0")],
            Some(json!({"order_no": "O-1", "amount": 1000, "currency": "CNY", "request_no": "R-1"})),
        )
        .await;
    assert!(paid.status == 202 || paid.status == 201, "{}", paid.text);
    let started = std::time::Instant::now();
    loop {
        let (_, all) = words(url).await;
        if let Some(word) = all.first() {
            assert_eq!(word, &("notification".into(), "charge".into(), "R-1".into(), "succeeded".into()));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no notification recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(mock.ledger().notifications_sent, 1, "acknowledged at once: not sent again");
}

on_every_backend!(the_mock_notifies_a_settled_charge:
    the_mock_notifies_a_settled_charge_on_sqlite => sqlite,
    the_mock_notifies_a_settled_charge_on_postgres => postgres,
    the_mock_notifies_a_settled_charge_on_mysql => mysql,
);

/// Reconciles `day` on `url` against `channel`'s statements, for tenant `default`: the reports, or the error.
async fn reconcile(url: &str, channel: Arc<dyn Channel>, day: NaiveDate) -> Result<Vec<ReconcileReport>, String> {
    struct Run(Arc<dyn Channel>, NaiveDate);
    impl OnPayments for Run {
        type Output = Result<Vec<ReconcileReport>, String>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
            let reconciler = Reconciler::new(payments, self.0, accounts(), vec!["default".into()]);
            reconciler.run_day(self.1, None).await.map(|r| r.expect("the lock is free")).map_err(|e| e.to_string())
        }
    }
    with_payments(url, channel.clone(), EngineConfig::default(), 4, Run(channel, day)).await.unwrap()
}

/// Runs one statement of SQL with `$1`…`$n` (text) parameters on `url`, whichever backend.
async fn sql(url: &str, statement: &str, args: &[&str]) {
    let mut text = statement.to_owned();
    if url.starts_with("mysql") {
        for i in (1..=args.len()).rev() {
            text = text.replace(&format!("${i}"), "?");
        }
    }
    macro_rules! run {
        ($pool:ty) => {{
            let pool = <$pool>::connect(url).await.unwrap();
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text.clone()));
            for a in args {
                // Times are integers in every backend's column: bound as such.
                q = match a.parse::<i64>() {
                    Ok(n) => q.bind(n),
                    Err(_) => q.bind(a.to_string()),
                };
            }
            q.execute(&pool).await.unwrap();
            pool.close().await;
        }};
    }
    if url.starts_with("postgres") {
        run!(sqlx::PgPool)
    } else if url.starts_with("mysql") {
        run!(sqlx::MySqlPool)
    } else {
        run!(sqlx::SqlitePool)
    }
}

/// Pays `order_no` as `request_no` through the API (the test channel charges it).
async fn paid(app: &App, order_no: &str, request_no: &str) {
    app.order(order_no, 1000).await;
    let token = app.token().await;
    let a = app
        .pay(&token, json!({"order_no": order_no, "amount": 1000, "currency": "CNY", "request_no": request_no}))
        .await;
    assert_eq!(a.status, 201, "{}", a.text);
}

fn ms(day: NaiveDate, h: u32, m: u32, s: u32) -> String {
    day.and_hms_opt(h, m, s).unwrap().and_utc().timestamp_millis().to_string()
}

fn counts(report: &ReconcileReport) -> Vec<(String, u64)> {
    match report {
        ReconcileReport::Done(r) => r.counts.iter().filter(|(_, n)| **n > 0).map(|(c, n)| (c.clone(), *n)).collect(),
        ReconcileReport::NoStatement { .. } => panic!("no statement"),
    }
}

/// A statement holding one line of each class — a charge settled at 23:59:59 that onceflow ended the next day,
/// a line repeated, a compensation's refund, a refund onceflow never made, a payment still processing — plus a
/// payment of ours no statement around holds, classified exactly; a run again replaces the results without
/// doubling the statement's word; the next day counts the midnight charge nowhere again.
async fn a_statement_of_every_class(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = start_with_accounts(url, http_channel(&channel), Auth::SingleTenant, accounts()).await;
    for (order, no) in [
        ("O-1", "R-match"),
        ("O-2", "R-amt"),
        ("O-3", "R-stat"),
        ("O-4", "R-res"),
        ("O-5", "R-comp"),
        ("O-6", "R-mid"),
        ("O-7", "R-miss"),
    ] {
        paid(&app, order, no).await;
    }
    let today = chrono::Utc::now().date_naive();
    let day = today - chrono::Duration::days(2);
    let (before, after) = (day.pred_opt().unwrap(), day.succ_opt().unwrap());
    // Ours, as if each had ended on `day` (R-mid just after midnight, the next day, on our clock); R-res still
    // unknown; R-comp failed and compensated (its charge refunded by its compensation).
    sql(url, "UPDATE payments SET updated_at = $1", &[&ms(day, 12, 0, 0)]).await;
    sql(url, "UPDATE payments SET updated_at = $1 WHERE request_no = $2", &[&ms(after, 0, 0, 5), "R-mid"]).await;
    sql(url, "UPDATE payments SET status = 'processing' WHERE request_no = $1", &["R-res"]).await;
    sql(url, "UPDATE payments SET status = 'failed' WHERE request_no = $1", &["R-comp"]).await;
    let at = |h, m, s| day.and_hms_opt(h, m, s).unwrap().and_utc().to_rfc3339();
    let lines = vec![
        charge_line("R-match", "O-1", 1000, "succeeded", &at(8, 0, 0)),
        charge_line("R-match", "O-1", 1000, "succeeded", &at(8, 0, 0)),
        charge_line("R-amt", "O-2", 900, "succeeded", &at(9, 0, 0)),
        charge_line("R-stat", "O-3", 900, "declined", &at(10, 0, 0)),
        charge_line("R-res", "O-4", 1000, "succeeded", &at(11, 0, 0)),
        charge_line("R-comp", "O-5", 1000, "succeeded", &at(12, 0, 0)),
        refund_line("R-comp-refund", "R-comp", 1000, "succeeded", &at(12, 5, 0)),
        charge_line("R-mid", "O-6", 1000, "succeeded", &at(23, 59, 59)),
        charge_line("NOPE", "O-9", 500, "succeeded", &at(13, 0, 0)),
        refund_line("RF-unknown", "R-match", 300, "succeeded", &at(14, 0, 0)),
    ];
    let s = &channel.statements;
    s.set("default", &day.to_string(), Served::Lines { lines, complete: true });
    s.set("default", &before.to_string(), Served::Lines { lines: vec![], complete: true });
    s.set("default", &after.to_string(), Served::Lines { lines: vec![], complete: true });
    let expected: Vec<(String, u64)> = [
        ("amount_mismatch", 1),
        ("matched", 4),
        ("missing_at_channel", 1),
        ("missing_here", 2),
        ("resolved", 1),
        ("status_mismatch", 1),
    ]
    .iter()
    .map(|(c, n)| ((*c).to_owned(), *n))
    .collect();
    let first = reconcile(url, http_channel(&channel), day).await.unwrap();
    assert_eq!(counts(&first[0]), expected);
    let ReconcileReport::Done(done) = &first[0] else { unreachable!() };
    assert_eq!(done.state, "complete");
    let classes: Vec<(&str, &str, &str)> =
        done.exceptions.iter().map(|e| (e.class.as_str(), e.number.as_str(), e.action.as_str())).collect();
    assert_eq!(
        classes,
        [
            ("missing_here", "NOPE", "operator"),
            ("amount_mismatch", "R-amt", "operator"),
            ("missing_at_channel", "R-miss", "operator"),
            ("resolved", "R-res", "settled"),
            ("status_mismatch", "R-stat", "operator"),
            ("missing_here", "RF-unknown", "operator"),
        ]
    );
    // Run again: the same results, the statement's word on R-res recorded once.
    let again = reconcile(url, http_channel(&channel), day).await.unwrap();
    assert_eq!(counts(&again[0]), expected);
    let (count, all) = words(url).await;
    assert_eq!(count, 1, "{all:?}");
    assert_eq!(all, [("statement".into(), "charge".into(), "R-res".into(), "succeeded".into())]);
    // The API shows it to operators.
    let shown = app.get(&format!("/v1/reconciliations?date={day}")).await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    let r = &shown.json()["reconciliations"][0];
    assert_eq!((r["tenant"].as_str(), r["state"].as_str()), (Some("default"), Some("complete")));
    assert_eq!(r["counts"]["matched"], 4);
    assert_eq!(r["counts"]["missing_at_channel"], 1);
    assert_eq!(r["exceptions"].as_array().unwrap().len(), 6);
    // The next day: R-mid ended then on our clock, but its line is the day before's: counted there, not here.
    s.set("default", &(after + chrono::Duration::days(1)).to_string(), Served::Lines { lines: vec![], complete: true });
    let next = reconcile(url, http_channel(&channel), after).await.unwrap();
    assert_eq!(counts(&next[0]), Vec::<(String, u64)>::new());
    app.get("/v1/reconciliations?date=2001-01-01").await.assert_problem(404, "reconciliation_not_found");
    app.get("/v1/reconciliations?date=yesterday").await.assert_problem(400, "invalid_request");
}

on_every_backend!(a_statement_of_every_class:
    a_statement_of_every_class_on_sqlite => sqlite,
    a_statement_of_every_class_on_postgres => postgres,
    a_statement_of_every_class_on_mysql => mysql,
);

/// A day the channel has no statement of (`404`) records nothing; an incomplete one, or one whose next day is
/// still open, is `partial` (nothing concluded missing) and listed for the hourly run, which completes it once
/// the statements are complete.
async fn an_unfinished_day_is_done_again(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = start_with_accounts(url, http_channel(&channel), Auth::SingleTenant, accounts()).await;
    paid(&app, "O-7", "R-miss").await;
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(2);
    sql(url, "UPDATE payments SET updated_at = $1", &[&ms(day, 12, 0, 0)]).await;
    let no = reconcile(url, http_channel(&channel), day).await.unwrap();
    assert!(matches!(&no[0], ReconcileReport::NoStatement { .. }), "{no:?}");
    app.get(&format!("/v1/reconciliations?date={day}")).await.assert_problem(404, "reconciliation_not_found");

    let s = &channel.statements;
    s.set("default", &day.to_string(), Served::Lines { lines: vec![], complete: false });
    s.set("default", &day.pred_opt().unwrap().to_string(), Served::Lines { lines: vec![], complete: true });
    let partial = reconcile(url, http_channel(&channel), day).await.unwrap();
    let ReconcileReport::Done(p) = &partial[0] else { panic!() };
    assert_eq!((p.state.as_str(), p.counts["missing_at_channel"]), ("partial", 0), "nothing concluded yet");

    // The day complete, its next day still 404: still partial.
    s.set("default", &day.to_string(), Served::Lines { lines: vec![], complete: true });
    let still = reconcile(url, http_channel(&channel), day).await.unwrap();
    let ReconcileReport::Done(p) = &still[0] else { panic!() };
    assert_eq!(p.state, "partial");

    // The hourly run takes it up again by itself, and completes it once the next day is complete too.
    s.set("default", &day.succ_opt().unwrap().to_string(), Served::Lines { lines: vec![], complete: true });
    struct Due(Arc<dyn Channel>);
    impl OnPayments for Due {
        type Output = ();
        async fn run<S: PaymentStore>(self, payments: Payments<S>) {
            let reconciler = Reconciler::new(payments, self.0, accounts(), vec!["default".into()]);
            reconciler.due(chrono::NaiveTime::from_hms_opt(23, 59, 59).unwrap()).await;
        }
    }
    with_payments(url, http_channel(&channel), EngineConfig::default(), 4, Due(http_channel(&channel))).await.unwrap();
    let shown = app.get(&format!("/v1/reconciliations?date={day}")).await;
    let r = &shown.json()["reconciliations"][0];
    assert_eq!(r["state"], "complete", "{}", shown.text);
    assert_eq!(r["counts"]["missing_at_channel"], 1);
}

on_every_backend!(an_unfinished_day_is_done_again:
    an_unfinished_day_is_done_again_on_sqlite => sqlite,
    an_unfinished_day_is_done_again_on_postgres => postgres,
    an_unfinished_day_is_done_again_on_mysql => mysql,
);

/// The channel going down mid-statement, or entirely, during a run: the run fails and the results of the run
/// before stay as they were (none at all, the first time); the next run, with the channel back, replaces them.
async fn the_channel_down_leaves_nothing_half_written(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = start_with_accounts(url, http_channel(&channel), Auth::SingleTenant, accounts()).await;
    paid(&app, "O-1", "R-match").await;
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(2);
    sql(url, "UPDATE payments SET updated_at = $1", &[&ms(day, 12, 0, 0)]).await;
    let at = day.and_hms_opt(8, 0, 0).unwrap().and_utc().to_rfc3339();
    let mut lines: Vec<Value> = (0..1200).map(|i| charge_line(&format!("X-{i}"), "O-x", 1, "succeeded", &at)).collect();
    lines.push(charge_line("R-match", "O-1", 1000, "succeeded", &at));
    let s = &channel.statements;
    for d in [day.pred_opt().unwrap(), day.succ_opt().unwrap()] {
        s.set("default", &d.to_string(), Served::Lines { lines: vec![], complete: true });
    }
    s.set("default", &day.to_string(), Served::BreaksOff { lines: lines.clone(), after: 700 });
    let broken = reconcile(url, http_channel(&channel), day).await;
    assert!(broken.is_err(), "{broken:?}");
    app.get(&format!("/v1/reconciliations?date={day}")).await.assert_problem(404, "reconciliation_not_found");

    s.set("default", &day.to_string(), Served::Lines { lines: lines.clone(), complete: true });
    let whole = reconcile(url, http_channel(&channel), day).await.unwrap();
    assert_eq!(counts(&whole[0]), [("matched".to_owned(), 1), ("missing_here".to_owned(), 1200)]);

    // Down again: mid-statement, then entirely. The complete results stand.
    s.set("default", &day.to_string(), Served::BreaksOff { lines: lines.clone(), after: 1100 });
    assert!(reconcile(url, http_channel(&channel), day).await.is_err());
    let down: Arc<dyn Channel> = Arc::new(HttpChannel::new("http://127.0.0.1:9", Duration::from_secs(1)).unwrap());
    assert!(reconcile(url, down, day).await.is_err());
    let shown = app.get(&format!("/v1/reconciliations?date={day}")).await;
    let r = &shown.json()["reconciliations"][0];
    assert_eq!((r["counts"]["missing_here"].as_u64(), r["counts"]["matched"].as_u64()), (Some(1200), Some(1)));
    assert_eq!(r["exceptions"].as_array().unwrap().len(), 1200);
}

on_every_backend!(the_channel_down_leaves_nothing_half_written:
    the_channel_down_leaves_nothing_half_written_on_sqlite => sqlite,
    the_channel_down_leaves_nothing_half_written_on_postgres => postgres,
    the_channel_down_leaves_nothing_half_written_on_mysql => mysql,
);

/// Reconciliations are for operators: a tenant key is `403`.
#[tokio::test]
async fn reconciliations_are_for_operators() {
    let url = common::database("sqlite").await.unwrap();
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let auth = Auth::keys(pairs(&[("default", "tenant-key-1")])).with_operators(pairs(&[("ops", "operator-key-1")]));
    let app = start_with_accounts(&url, http_channel(&channel), auth, accounts()).await;
    let tenant = App { base: app.base.clone(), client: reqwest::Client::new(), key: Some("tenant-key-1".into()) };
    tenant.get("/v1/reconciliations?date=2026-01-01").await.assert_problem(403, "forbidden");
    let operator = App { base: app.base.clone(), client: reqwest::Client::new(), key: Some("operator-key-1".into()) };
    operator.get("/v1/reconciliations?date=2026-01-01").await.assert_problem(404, "reconciliation_not_found");
    // Notifications take no API key.
    let body = notification("ntf_1", "charge.succeeded", "default", charge_data("R-1", "succeeded")).to_string();
    assert_eq!(send(&app.base, body.as_bytes(), Some(&sign(body.as_bytes(), now_secs(), &[SECRET]))).await.0, 204);
}
