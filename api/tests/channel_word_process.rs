//! The channel's loop through the real binaries (`mock-channel` notifying `serve`, `reconcile` reading the
//! mock's statement), and real `onceflow` processes killed (SIGKILL) while taking notifications and while
//! reconciling, on every backend: every notification answered `204` before the kill is there after it, none is there twice once the
//! channel has sent them all again; a reconciliation killed mid-run leaves either no results or whole ones, and
//! the run again finishes them without doubling the statement's word.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::channel::TestChannel;
use common::channel_word::{Served, charge_line, notification, now_secs, send, sign};
use serde_json::json;

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");
const SECRET: &str = "whsec_crash";

macro_rules! on_every_backend {
    ($scenario:ident: $($name:ident => $backend:ident),+ $(,)?) => {
        $(
            #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let backend = stringify!($backend);
                if (backend == "postgres" && std::env::var("DATABASE_URL").is_err())
                    || (backend == "mysql" && std::env::var("MYSQL_URL").is_err())
                {
                    eprintln!("skipped: no server for {backend}");
                    return;
                }
                let url = common::database(backend).await.expect("database");
                $scenario(&url).await;
            }
        )+
    };
}

/// A process killed however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `onceflow serve` on `url`, taking notifications signed with [`SECRET`] for merchant `default`.
async fn serve(url: &str) -> (Killed, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(ONCEFLOW)
        .args(["serve", "--listen", &listen, "--database-url", url, "--channel-url", "mock"])
        .args(["--channel-notify-secrets", &format!("default:{SECRET}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://{listen}");
    let started = Instant::now();
    while !reqwest::get(format!("{base}/healthz")).await.is_ok_and(|r| r.status().is_success()) {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (Killed(child), base)
}

/// How many words the database holds, and their ids.
async fn recorded(url: &str) -> Vec<String> {
    let q = "SELECT notification_id FROM channel_notifications ORDER BY notification_id";
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query_scalar(q).fetch_all(&pool).await.unwrap()
    } else if url.starts_with("mysql") {
        let pool = sqlx::MySqlPool::connect(url).await.unwrap();
        sqlx::query_scalar(q).fetch_all(&pool).await.unwrap()
    } else {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query_scalar(q).fetch_all(&pool).await.unwrap()
    }
}

/// 400 notifications sent 8 at a time to a `serve` killed mid-stream, then all sent again (as the channel
/// resends what was not acknowledged, and may resend what was) to a new `serve`.
async fn notifications_survive_a_kill(url: &str) {
    let (server, base) = serve(url).await;
    let bodies: Vec<String> = (0..400)
        .map(|i| {
            let data = json!({"merchant_id": "default", "merchant_request_no": format!("R-{i}"), "charge_id": "c",
                "status": "succeeded", "amount": 1000, "currency": "CNY", "order_no": "O"});
            notification(&format!("ntf_{i:03}"), "charge.succeeded", "default", data).to_string()
        })
        .collect();
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sending = {
        let (bodies, base, acknowledged) = (bodies.clone(), base.clone(), acknowledged.clone());
        tokio::spawn(async move {
            for chunk in bodies.chunks(8) {
                let sends: Vec<_> = chunk
                    .iter()
                    .map(|b| {
                        let (b, base) = (b.clone(), base.clone());
                        tokio::spawn(async move {
                            let client = reqwest::Client::new();
                            let sent = client
                                .post(format!("{base}/v1/channel/notifications"))
                                .header("channel-signature", sign(b.as_bytes(), now_secs(), &[SECRET]))
                                .body(b.clone())
                                .send()
                                .await;
                            (b, sent.map(|r| r.status().as_u16()).unwrap_or(0))
                        })
                    })
                    .collect();
                for s in sends {
                    let (b, status) = s.await.unwrap();
                    if status == 204 {
                        let id =
                            serde_json::from_str::<serde_json::Value>(&b).unwrap()["id"].as_str().unwrap().to_owned();
                        acknowledged.lock().unwrap().push(id);
                    }
                }
            }
        })
    };
    // Killed once some are acknowledged, while the rest are in flight.
    while acknowledged.lock().unwrap().len() < 40 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(server);
    let _ = sending.await;
    let acknowledged: Vec<String> = acknowledged.lock().unwrap().clone();
    assert!(!acknowledged.is_empty() && acknowledged.len() < bodies.len(), "killed mid-stream: {}", acknowledged.len());
    let after_kill = recorded(url).await;
    for id in &acknowledged {
        assert!(after_kill.contains(id), "{id} was acknowledged but is lost");
    }
    let (_server, base) = serve(url).await;
    for b in &bodies {
        let (status, text) = send(&base, b.as_bytes(), Some(&sign(b.as_bytes(), now_secs(), &[SECRET]))).await;
        assert_eq!(status, 204, "{text}");
    }
    let all = recorded(url).await;
    assert_eq!(all.len(), 400, "each once");
    let mut unique = all.clone();
    unique.dedup();
    assert_eq!(unique, all);
}

on_every_backend!(notifications_survive_a_kill:
    notifications_survive_a_kill_on_sqlite => sqlite,
    notifications_survive_a_kill_on_postgres => postgres,
    notifications_survive_a_kill_on_mysql => mysql,
);

/// `onceflow reconcile` of a 20,000-line day killed after a moment, then run again to its end: the results are
/// whole (every line counted once), the statement's word on the one processing payment recorded once, and the
/// copies the killed run left deleted.
async fn a_killed_reconciliation_is_finished_by_the_next(url: &str) {
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let app = common::channel_word::start_with_accounts(
        url,
        Arc::new(onceflow_payments::HttpChannel::new(&channel.url, Duration::from_secs(5)).unwrap()),
        onceflow_api::Auth::SingleTenant,
        onceflow_payments::ChannelAccounts::default(),
    )
    .await;
    app.order("O-1", 1000).await;
    let token = app.token().await;
    let paid =
        app.pay(&token, json!({"order_no": "O-1", "amount": 1000, "currency": "CNY", "request_no": "R-res"})).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(3);
    let at = day.and_hms_opt(8, 0, 0).unwrap().and_utc().to_rfc3339();
    let mut lines: Vec<serde_json::Value> =
        (0..20_000).map(|i| charge_line(&format!("X-{i:05}"), "O-x", 1, "succeeded", &at)).collect();
    lines.push(charge_line("R-res", "O-1", 1000, "succeeded", &at));
    for d in [day.pred_opt().unwrap(), day, day.succ_opt().unwrap()] {
        let l = if d == day { lines.clone() } else { vec![] };
        channel.statements.set("default", &d.to_string(), Served::Lines { lines: l, complete: true });
    }
    execute(url, "UPDATE payments SET status = 'processing'").await;
    let run = || {
        Command::new(ONCEFLOW)
            .args(["reconcile", "--date", &day.to_string(), "--database-url", url, "--channel-url", &channel.url])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    for wait in [400, 1500] {
        let mut killed = run();
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let _ = killed.kill();
        let _ = killed.wait();
        let shown = app.get(&format!("/v1/reconciliations?date={day}")).await;
        eprintln!("killed after {wait} ms: results {}", if shown.status == 200 { "whole" } else { "none" });
        if shown.status == 200 {
            let r = &shown.json()["reconciliations"][0];
            assert_eq!(r["counts"]["missing_here"], 20_000, "whole or nothing: {}", r["counts"]);
        }
    }
    let done = run().wait_with_output().unwrap();
    assert!(done.status.success());
    let printed = String::from_utf8_lossy(&done.stdout);
    assert!(printed.contains("missing_here        20000"), "{printed}");
    assert!(printed.contains("resolved            1"), "{printed}");
    let shown = app.get(&format!("/v1/reconciliations?date={day}")).await;
    let r = &shown.json()["reconciliations"][0];
    assert_eq!((r["state"].as_str(), r["counts"]["missing_here"].as_u64()), (Some("complete"), Some(20_000)));
    assert_eq!(recorded(url).await, [format!("statement:{day}:charge:R-res")], "the statement's word once");
    assert_eq!(scalar(url, "SELECT COUNT(*) FROM statement_lines").await, 20_001, "no copy left behind");
    assert_eq!(scalar(url, "SELECT COUNT(*) FROM reconciliation_exceptions").await, 20_001);
}

on_every_backend!(a_killed_reconciliation_is_finished_by_the_next:
    a_killed_reconciliation_is_finished_by_the_next_on_sqlite => sqlite,
    a_killed_reconciliation_is_finished_by_the_next_on_postgres => postgres,
    a_killed_reconciliation_is_finished_by_the_next_on_mysql => mysql,
);

async fn execute(url: &str, q: &'static str) {
    if url.starts_with("postgres") {
        sqlx::query(q).execute(&sqlx::PgPool::connect(url).await.unwrap()).await.unwrap();
    } else if url.starts_with("mysql") {
        sqlx::query(q).execute(&sqlx::MySqlPool::connect(url).await.unwrap()).await.unwrap();
    } else {
        sqlx::query(q).execute(&sqlx::SqlitePool::connect(url).await.unwrap()).await.unwrap();
    }
}

async fn scalar(url: &str, q: &'static str) -> i64 {
    if url.starts_with("postgres") {
        sqlx::query_scalar(q).fetch_one(&sqlx::PgPool::connect(url).await.unwrap()).await.unwrap()
    } else if url.starts_with("mysql") {
        sqlx::query_scalar(q).fetch_one(&sqlx::MySqlPool::connect(url).await.unwrap()).await.unwrap()
    } else {
        sqlx::query_scalar(q).fetch_one(&sqlx::SqlitePool::connect(url).await.unwrap()).await.unwrap()
    }
}

/// `onceflow` with `args`, killed however the test ends.
fn spawn(args: &[&str]) -> Killed {
    Killed(Command::new(ONCEFLOW).args(args).env("RUST_LOG", "warn").stdout(Stdio::null()).spawn().unwrap())
}

async fn up(base: &str, path: &str) {
    let started = Instant::now();
    while !reqwest::get(format!("{base}{path}")).await.is_ok_and(|r| r.status().as_u16() < 500) {
        assert!(started.elapsed() < Duration::from_secs(30), "{base} did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The loop docs/channel.md shows: the mock channel, told the merchant's secret, notifies `serve` (whose charges
/// carry `notify_url` from `--public-url`) when a processing charge settles; `onceflow reconcile` then matches
/// the mock's statement of the day (today's: partial, still growing) and prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_loop_runs_through_the_binaries() {
    let (mock, api) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let (mock_url, api_url) = (format!("http://{mock}"), format!("http://{api}"));
    let db = common::database("sqlite").await.unwrap();
    let _mock = spawn(&[
        "mock-channel",
        "--listen",
        &mock,
        "--processing-rate",
        "1",
        "--settle-ms",
        "500",
        "--notify-secret",
        "default=whsec_demo",
        "--notify-schedule",
        "200ms,1s,5s",
    ]);
    let _serve = spawn(&[
        "serve",
        "--listen",
        &api,
        "--database-url",
        &db,
        "--channel-url",
        &mock_url,
        "--public-url",
        &api_url,
        "--channel-notify-secrets",
        "default:whsec_demo",
    ]);
    up(&mock_url, "/v1/ledger").await;
    up(&api_url, "/healthz").await;
    let app = common::App { base: api_url.clone(), client: reqwest::Client::new(), key: None };
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
    assert_eq!(paid.status, 202, "{}", paid.text);
    let started = Instant::now();
    while recorded(&db).await.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(15), "the mock's notification was not recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(recorded(&db).await, ["ntf_ch_00000001"]);
    while app.get("/v1/payments/R-1").await.json()["status"] != "succeeded" {
        assert!(started.elapsed() < Duration::from_secs(30), "the payment did not succeed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let today = chrono::Utc::now().date_naive().to_string();
    let out = Command::new(ONCEFLOW)
        .args(["reconcile", "--date", &today, "--database-url", &db, "--channel-url", &mock_url])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    assert!(printed.starts_with(&format!("default {today} partial")), "{printed}");
    assert!(printed.contains("matched             1"), "{printed}");
    let shown = app.get(&format!("/v1/reconciliations?date={today}")).await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    assert_eq!(shown.json()["reconciliations"][0]["counts"]["matched"], 1);
}
