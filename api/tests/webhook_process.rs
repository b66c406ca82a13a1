//! Webhook deliveries by real `onceflow serve` processes: one killed with SIGKILL in the middle of a delivery
//! loses nothing (the next process sends it again, with the same `webhook-id`, once the attempt's lease has
//! passed), on every backend; and two processes on one database never send one delivery twice at once.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::webhooks::{Receiver, Reply, event};
use onceflow_api::{OnPayments, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::{EventStore, MockChannel, NewEvent, PaymentStore, Payments};
use serde_json::{Value, json};

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

/// A `serve` process, killed when dropped.
struct Serve {
    child: Child,
    base: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `onceflow serve` on `url` with a local receiver allowed, short retries and a 2 s timeout (so an
/// attempt's lease is 7 s), and waits for `/healthz`.
async fn serve(url: &str) -> Serve {
    serve_to(url, Stdio::inherit()).await
}

/// [`serve`], its log written to `stderr`.
async fn serve_to(url: &str, stderr: impl Into<Stdio>) -> Serve {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let child = Command::new(ONCEFLOW)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}"), "--database-url", url, "--channel-url", "mock"])
        .args(["--webhook-allow-http", "--webhook-allow-private"])
        .args(["--webhook-retry-schedule", "200ms,200ms,200ms", "--webhook-timeout", "2s"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start onceflow serve");
    let mut serve = Serve { child, base };
    let started = Instant::now();
    loop {
        if let Ok(r) = reqwest::get(format!("{}/healthz", serve.base)).await
            && r.status().is_success()
        {
            return serve;
        }
        if let Some(status) = serve.child.try_wait().unwrap() {
            panic!("serve exited before it came up: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `events` into the database at `url` through the outbox, from this process.
async fn write(url: &str, events: Vec<NewEvent>) {
    struct Write(Vec<NewEvent>);
    impl OnPayments for Write {
        type Output = ();
        async fn run<S: PaymentStore>(self, payments: Payments<S>) {
            for e in self.0 {
                let mut tx = payments.engine().store().begin().await.unwrap();
                assert!(<S as EventStore>::write_event(&mut tx, &e).await.unwrap());
                tx.commit().await.unwrap();
            }
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Write(events)).await.expect("database");
}

async fn get(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}")).await.unwrap().json().await.unwrap()
}

async fn register(base: &str, url: &str) -> String {
    let r = reqwest::Client::new().post(format!("{base}/v1/webhook-endpoints")).json(&json!({ "url": url }));
    let body: Value = r.send().await.unwrap().json().await.unwrap();
    body["id"].as_str().unwrap_or_else(|| panic!("{body}")).to_owned()
}

macro_rules! on_backends {
    ($scenario:ident: $($name:ident => $backend:ident),+ $(,)?) => {
        $( backend_test!($backend, $name, $scenario); )+
    };
}

macro_rules! backend_test {
    (sqlite, $name:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $scenario(&common::database("sqlite").await.unwrap()).await;
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

on_backends!(a_process_killed_mid_delivery_loses_nothing:
    killed_sqlite => sqlite, killed_postgres => postgres, killed_mysql => mysql);

async fn a_process_killed_mid_delivery_loses_nothing(url: &str) {
    // The first request is held open (the process is killed while it waits); the next is answered.
    let receiver = Receiver::start(|_, n| if n == 0 { Reply::Hang } else { Reply::Status(200) }).await;
    let first = serve(url).await;
    let we = register(&first.base, &receiver.url).await;
    let e = event("default", "R-kill");
    let id = e.id();
    write(url, vec![e]).await;
    receiver.wait_for(Duration::from_secs(20), "the first request", |h| h.len() == 1).await;
    let killed_at = Instant::now();
    drop(first); // SIGKILL, mid-delivery.

    let second = serve(url).await;
    let hits = receiver.wait_for(Duration::from_secs(30), "the event again", |h| h.len() == 2).await;
    assert_eq!((hits[0].id.as_str(), hits[1].id.as_str()), (id.as_str(), id.as_str()), "the same webhook-id");
    // Not before the killed attempt's lease (its 2 s timeout and 5 s more) had passed: never twice at once.
    assert!(killed_at.elapsed() >= Duration::from_secs(4), "{:?}", killed_at.elapsed());
    let started = Instant::now();
    let detail = loop {
        let detail = get(&second.base, &format!("/v1/events/{id}")).await;
        if detail["deliveries"][0]["state"] == "delivered" {
            break detail;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{detail}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(detail["deliveries"][0]["attempts"], 2, "{detail}");
    let attempts = get(&second.base, &format!("/v1/webhook-endpoints/{we}/deliveries")).await;
    let outcomes: Vec<&str> =
        attempts["deliveries"].as_array().unwrap().iter().map(|a| a["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["delivered", "abandoned"], "{attempts}");
}

on_backends!(two_processes_never_send_one_delivery_twice_at_once:
    shared_postgres => postgres, shared_mysql => mysql);

async fn two_processes_never_send_one_delivery_twice_at_once(url: &str) {
    // Each event's first attempt fails, its second is slow: retries cross processes, and any second sender of
    // one attempt would overlap the slow one.
    let receiver =
        Receiver::start(|_, n| if n == 0 { Reply::Status(500) } else { Reply::Slow(Duration::from_millis(300)) }).await;
    let (a, b) = (serve(url).await, serve(url).await);
    register(&a.base, &receiver.url).await;
    let events: Vec<NewEvent> = (0..40).map(|i| event("default", &format!("R-{i}"))).collect();
    let ids: Vec<String> = events.iter().map(NewEvent::id).collect();
    write(url, events).await;
    receiver.wait_for(Duration::from_secs(60), "two requests per event", |h| h.len() >= 80).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for id in &ids {
        assert_eq!(receiver.hits_of(id).len(), 2, "{id}: one failed attempt, one delivered, nothing twice");
    }
    assert_eq!(
        receiver.overlap.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "never two requests of one event at once"
    );
    for base in [&a.base, &b.base] {
        let page = get(base, "/v1/events?limit=1000").await;
        assert_eq!(page["events"].as_array().unwrap().len(), 40);
    }
    let detail = get(&b.base, &format!("/v1/events/{}", ids[0])).await;
    assert_eq!(
        (detail["deliveries"][0]["state"].as_str(), detail["deliveries"][0]["attempts"].as_i64()),
        (Some("delivered"), Some(2))
    );
}

/// Runs `onceflow args…` to its end: its exit code and stdout.
fn onceflow(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(ONCEFLOW).args(args).env("RUST_LOG", "warn").output().expect("run onceflow");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_lists_the_log_from_a_cursor_and_redelivers() {
    let url = common::database("sqlite").await.unwrap();
    let events: Vec<NewEvent> = (0..3).map(|i| event("acme", &format!("R-{i}"))).collect();
    let ids: Vec<String> = events.iter().map(NewEvent::id).collect();
    write(&url, events).await;
    let (code, out) = onceflow(&["events", "list", "--database-url", &url, "--tenant", "acme", "--limit", "2"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&ids[0]) && out.contains(&ids[1]) && !out.contains(&ids[2]), "{out}");
    let next = out.lines().last().and_then(|l| l.split("next: ").nth(1)).expect("the next cursor").to_owned();
    let (_, rest) = onceflow(&["events", "list", "--database-url", &url, "--tenant", "acme", "--after", &next]);
    assert!(rest.contains(&ids[2]) && !rest.contains(&ids[0]), "{rest}");
    let (_, other) = onceflow(&["events", "list", "--database-url", &url, "--tenant", "globex"]);
    assert!(other.contains("(0 shown)"), "{other}");
    let (code, _) = onceflow(&["events", "list", "--database-url", &url, "--after", "nonsense"]);
    assert_eq!(code, Some(2), "a cursor the log did not give is bad usage");
    let (code, out) =
        onceflow(&["events", "redeliver", "--database-url", &url, "--reason", "the receiver was down", &ids[0]]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("(0 deliveries made)"), "no endpoint yet: {out}");
    let (code, _) = onceflow(&["events", "redeliver", "--database-url", &url, "evt_nope"]);
    assert_eq!(code, Some(1), "an unknown event");
    let (code, _) = onceflow(&["events", "redeliver", "--database-url", &url, "--reason", "bell\u{7}", &ids[0]]);
    assert_eq!(code, Some(2), "a reason with a control character is bad usage");
    // The redelivery is on the record, as the terminal user's, with its reason (the unknown event is not).
    struct Audit;
    impl OnPayments for Audit {
        type Output = Vec<onceflow_engine::store::AuditRecord>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
            payments.engine().audit(None, None, 10).await.unwrap()
        }
    }
    let audit =
        with_payments(&url, Arc::new(MockChannel::reliable()), EngineConfig::default(), 2, Audit).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    let entry = &audit[0];
    assert_eq!((entry.action.as_str(), entry.subject.as_deref()), ("redeliver", Some(ids[0].as_str())));
    assert!(entry.actor.starts_with("cli:"), "{entry:?}");
    assert_eq!((entry.reason.as_deref(), entry.status), (Some("the receiver was down"), Some(202)));
    assert_eq!(entry.tenant.as_deref(), Some("acme"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_redelivers_on_the_schedule_it_is_given() {
    let url = common::database("sqlite").await.unwrap();
    let receiver = Receiver::start(|_, n| if n == 0 { Reply::Status(500) } else { Reply::Status(200) }).await;
    // Written before the endpoint exists: only the redelivery sends it.
    let e = event("default", "R-cli");
    let id = e.id();
    write(&url, vec![e]).await;
    let serve = serve(&url).await;
    register(&serve.base, &receiver.url).await;
    let (code, out) = onceflow(&["events", "redeliver", "--database-url", &url, "--webhook-retry-schedule", "3s", &id]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("(1 deliveries made)"), "{out}");
    let hits = receiver.wait_for(Duration::from_secs(20), "the retry", |h| h.len() == 2).await;
    // The redelivery's stored schedule is the command's (3 s), not the serving process's (200 ms).
    let waited = hits[1].at - hits[0].at;
    assert!(waited >= Duration::from_millis(2700), "{waited:?}");
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_holding_the_log_back_is_measured_and_named() {
    use sqlx::Connection;
    let Some(url) = common::database("postgres").await else { return };
    let receiver = Receiver::start(|_, _| Reply::Status(200)).await;
    let log = std::env::temp_dir().join(format!("onceflow-held-{}.log", uuid::Uuid::new_v4()));
    let serve = serve_to(&url, std::fs::File::create(&log).unwrap()).await;
    register(&serve.base, &receiver.url).await;
    // A session of this database takes a transaction id and idles: nothing committed after it may show yet.
    let mut idle = sqlx::PgConnection::connect(&url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut idle).await.unwrap();
    sqlx::query("BEGIN").execute(&mut idle).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut idle).await.unwrap();
    let e = event("default", "R-held");
    write(&url, vec![e.clone()]).await;
    let started = Instant::now();
    let (lag, warned) = loop {
        let metrics = reqwest::get(format!("{}/metrics", serve.base)).await.unwrap().text().await.unwrap();
        let lag: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("onceflow_event_dispatch_lag_seconds "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let warned = text.lines().find(|l| l.contains(&format!("pid={pid}"))).map(str::to_owned);
        if let Some(warned) = warned.filter(|_| lag >= 5.0) {
            break (lag, warned);
        }
        assert!(started.elapsed() < Duration::from_secs(40), "lag {lag}, log: {text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("lag {lag} s; {warned}");
    assert!(warned.contains("xact_start"), "{warned}");
    assert!(receiver.hits().is_empty(), "nothing is delivered while the log is held");
    sqlx::query("ROLLBACK").execute(&mut idle).await.unwrap();
    receiver.wait_for(Duration::from_secs(20), "the event once the session ended", |h| h.len() == 1).await;
    let _ = std::fs::remove_file(&log);
}
