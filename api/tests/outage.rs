//! The database goes away under load: requests fail fast with `503 unavailable` and `Retry-After` (no hang,
//! no 500), the process stays up, and once the database is back the in-flight payments finish with the
//! invariants intact. These tests stop and start the machine's Postgres cluster and MariaDB server, so they live
//! alone in their test binary (cargo runs test binaries one after another), one test at a time ([`SERVERS`]).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use onceflow_engine::{MySqlStore, PgStore};
use onceflow_payments::{MockChannel, MockChannelConfig, PaymentStore, check_invariants, mock_channel_router};
use serde_json::json;

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

/// Held for each test's whole duration: the tests stop and start the same servers.
static SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A database server on this machine the test can stop and start.
trait Server {
    fn stop(&self);
    fn start(&self);
    fn ready(&self) -> bool;
}

/// The machine's Postgres cluster (`pg_ctlcluster`).
struct Postgres(String);

impl Postgres {
    fn find() -> Option<Self> {
        let version = std::fs::read_dir("/etc/postgresql").ok()?.next()?.ok()?.file_name().into_string().ok()?;
        Command::new("pg_ctlcluster").arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().ok()?;
        Some(Self(version))
    }

    fn ctl(&self, action: &str) -> bool {
        Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &self.0, "main", action, "-m", "fast"])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Server for Postgres {
    fn stop(&self) {
        assert!(self.ctl("stop"), "pg_ctlcluster stop failed");
    }

    fn start(&self) {
        self.ctl("start");
    }

    fn ready(&self) -> bool {
        Command::new("pg_isready").args(["-h", "127.0.0.1", "-q"]).status().is_ok_and(|s| s.success())
    }
}

/// The machine's MariaDB server (`mysqladmin shutdown`, `start-stop-daemon`, as `.ci/run` starts it).
struct MariaDb;

impl MariaDb {
    fn find() -> Option<Self> {
        std::path::Path::new("/usr/sbin/mariadbd").exists().then_some(Self)
    }

    fn running() -> bool {
        Command::new("pidof").arg("mariadbd").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
    }
}

impl Server for MariaDb {
    fn stop(&self) {
        let stopped = Command::new("mysqladmin").args(["-h", "127.0.0.1", "-u", "root", "shutdown"]).status();
        assert!(stopped.is_ok_and(|s| s.success()), "mysqladmin shutdown failed");
        let asked = Instant::now();
        while Self::running() {
            assert!(asked.elapsed() < Duration::from_secs(60), "MariaDB did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start(&self) {
        let _ = std::fs::create_dir_all("/run/mysqld");
        let _ = Command::new("chown").args(["mysql:mysql", "/run/mysqld"]).status();
        let _ = Command::new("start-stop-daemon")
            .args(["--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"])
            .status();
    }

    fn ready(&self) -> bool {
        Command::new("mysqladmin")
            .args(["-h", "127.0.0.1", "-u", "root", "--silent", "ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Starts the server again whatever happens to the test.
struct Restart<'a>(&'a dyn Server);

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        self.0.start();
        let started = Instant::now();
        while !self.0.ready() {
            assert!(started.elapsed() < Duration::from_secs(60), "the database did not come back");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_503_then_everything_finishes_postgres() {
    let _servers = SERVERS.lock().await;
    let Some(db) = common::database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let Some(server) = Postgres::find() else {
        eprintln!("skipped: no local Postgres cluster to stop");
        return;
    };
    outage(&db, &server, async { PgStore::connect(&db, 2).await.unwrap() }).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_503_then_everything_finishes_mysql() {
    let _servers = SERVERS.lock().await;
    let Some(db) = common::database("mysql").await else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let Some(server) = MariaDb::find() else {
        eprintln!("skipped: no local MariaDB server to stop");
        return;
    };
    outage(&db, &server, async { MySqlStore::connect(&db, 2).await.unwrap() }).await;
}

/// `onceflow serve` on `db` with leases of `lease_ms`, paying through `ledger` served over HTTP; once ready, its
/// base URL and a client.
async fn serve(db: &str, ledger: &MockChannel, lease_ms: u64) -> (Serve, String, reqwest::Client) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(ledger.clone())).into_future());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let serve = Serve(
        Command::new(ONCEFLOW)
            .args(["serve", "--database-url", db, "--listen", &format!("127.0.0.1:{port}")])
            .args(["--channel-url", &channel, "--lease-ms", &lease_ms.to_string()])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let started = Instant::now();
    while client.get(format!("{base}/readyz")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(started.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (serve, base, client)
}

/// Payments in flight against `db`, `server` stopped and started again; checked afterwards through the store
/// `connect` opens.
async fn outage<S: PaymentStore>(db: &str, server: &dyn Server, connect: impl std::future::Future<Output = S>) {
    let ledger = MockChannel::new(MockChannelConfig { latency_ms: 1500, ..Default::default() });
    let (serve, base, client) = serve(db, &ledger, 1000).await;

    // Payments in flight: their channel calls take 1.5 s.
    let mut tokens = Vec::new();
    for i in 0..5 {
        let order = json!({"order_no": format!("O-{i}"), "amount": 1000, "currency": "CNY"});
        client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap();
        let token: serde_json::Value =
            client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
        let token = token["token"].as_str().unwrap().to_owned();
        let r = client
            .post(format!("{base}/v1/payments"))
            .header("idempotency-key", &token)
            .header("prefer", "wait=0")
            .json(&order)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        tokens.push((token, order));
    }

    let restart = Restart(server);
    server.stop();
    let asked = Instant::now();
    for path in ["/v1/tokens", "/v1/payments"] {
        let r = client
            .post(format!("{base}{path}"))
            .header("idempotency-key", &tokens[0].0)
            .json(&tokens[0].1)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "{path}");
        assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["code"], "unavailable");
    }
    assert!(asked.elapsed() < Duration::from_secs(10), "answered fast: {:?}", asked.elapsed());
    assert_eq!(client.get(format!("{base}/healthz")).send().await.unwrap().status(), 200, "the process stays up");
    assert_eq!(client.get(format!("{base}/readyz")).send().await.unwrap().status(), 503);
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(restart);

    // Back: every in-flight payment finishes, once.
    for (token, order) in &tokens {
        let r = client
            .post(format!("{base}/v1/payments"))
            .header("idempotency-key", token)
            .header("prefer", "wait=20")
            .json(order)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }
    let store = connect.await;
    let violations = check_invariants(&store, &ledger.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(ledger.ledger().charges.len(), 5);
    drop(serve);
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_an_outage_resumes_without_a_restart_postgres() {
    let _servers = SERVERS.lock().await;
    let Some(db) = common::database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let Some(server) = Postgres::find() else {
        eprintln!("skipped: no local Postgres cluster to stop");
        return;
    };
    stopped_run(&db, &server, async { PgStore::connect(&db, 2).await.unwrap() }).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_an_outage_resumes_without_a_restart_mysql() {
    let _servers = SERVERS.lock().await;
    let Some(db) = common::database("mysql").await else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let Some(server) = MariaDb::find() else {
        eprintln!("skipped: no local MariaDB server to stop");
        return;
    };
    stopped_run(&db, &server, async { MySqlStore::connect(&db, 2).await.unwrap() }).await;
}

/// One payment in flight when the database stops for ~3 s (plus the time to stop and start it), shorter than the
/// lease: the run's commit after the
/// channel call fails, and so does its release, so the run stops with the lease held. The process must not keep
/// that lease alive: once it expires, the process resumes the payment itself, without a restart.
async fn stopped_run<S: PaymentStore>(db: &str, server: &dyn Server, connect: impl std::future::Future<Output = S>) {
    let ledger = MockChannel::new(MockChannelConfig { latency_ms: 1500, ..Default::default() });
    // The lease outlives the outage with room for a heartbeat after it (stopping and starting Postgres takes
    // up to ~6 s here): before the fix, that heartbeat kept the stopped run's lease alive for good.
    let (serve, base, client) = serve(db, &ledger, 12_000).await;
    let order = json!({"order_no": "O-stopped", "amount": 1000, "currency": "CNY"});
    client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap();
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
    let token = token["token"].as_str().unwrap().to_owned();
    let pay = |wait: &'static str| {
        client
            .post(format!("{base}/v1/payments"))
            .header("idempotency-key", &token)
            .header("prefer", wait)
            .json(&order)
            .send()
    };
    let r = pay("wait=0").await.unwrap();
    assert_eq!(r.status(), 202);
    let paid = Instant::now();

    // The channel call takes 1.5 s: the database is gone before it returns, and back before the lease ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restart = Restart(server);
    server.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(restart);
    let back = Instant::now();
    eprintln!("database back {:?} after the payment started", paid.elapsed());

    let last = loop {
        let answer = match pay("wait=5").await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        };
        if answer.0 == 201 || back.elapsed() > Duration::from_secs(40) {
            break answer;
        }
        if answer.0 != 202 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    assert_eq!(last.0, 201, "not finished {:?} after the database came back: {}", back.elapsed(), last.1);
    eprintln!("finished {:?} after the database came back", back.elapsed());
    let store = connect.await;
    let violations = check_invariants(&store, &ledger.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(ledger.ledger().charges.len(), 1);
    drop(serve);
}
