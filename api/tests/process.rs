//! The real `onceflow` binary: the README's walk-through run as written, and a `serve` process killed with
//! SIGKILL mid-payment and restarted.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::database;
use onceflow_payments::{MockChannel, MockChannelConfig, mock_channel_router};
use serde_json::json;

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `onceflow serve` and waits for `/healthz`. The caller kills and reaps it.
async fn serve(args: &[&str]) -> (Child, String) {
    serve_with_stderr(args, Stdio::inherit()).await
}

/// [`serve`] with its stderr sent to `stderr` (`Stdio::piped()` to read its log lines after the kill).
#[allow(clippy::zombie_processes)]
async fn serve_with_stderr(args: &[&str], stderr: Stdio) -> (Child, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(ONCEFLOW)
        .arg("serve")
        .args(["--listen", &listen])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start onceflow serve");
    let base = format!("http://{listen}");
    let started = Instant::now();
    loop {
        if let Ok(r) = reqwest::get(format!("{base}/healthz")).await
            && r.status().is_success()
        {
            return (child, base);
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve {args:?} exited before it came up: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `onceflow args…` and returns its exit code and stderr, killing it (and failing) if it is still running
/// after 20 s: a process that should refuse to start must not serve instead.
fn refuses(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(ONCEFLOW)
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start onceflow");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("{args:?} kept running instead of refusing: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The README's walk-through block, run with bash against a real server.
#[tokio::test]
async fn the_readme_walkthrough_runs() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let block = readme
        .split("<!-- walkthrough -->\n```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README has a walk-through block");
    let url = database("sqlite").await.unwrap();
    let (mut child, base) = serve(&["--database-url", &url]).await;
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .env("BASE", &base)
        .output()
        .await
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("\"order_no\":\"O-1\""), "{printed}");
    assert_eq!(printed.matches("HTTP/1.1 201 Created").count(), 2, "{printed}");
    assert!(printed.to_lowercase().contains("idempotent-replayed: true"), "{printed}");
    assert!(printed.contains("idempotency_key_mismatch"), "{printed}");
    assert!(printed.contains("\"step_key\":\"call_channel\""), "{printed}");
    assert!(printed.contains("\"refund_no\":\"RF-1\"") && printed.contains("\"status\":\"succeeded\""), "{printed}");
}

/// `onceflow workflows show` prints what `GET /v1/workflows/{id}` answers, for people: RFC 3339 times, the input,
/// output and each step's output as JSON, never the token.
#[tokio::test]
async fn workflows_show_prints_the_view_readably() {
    let url = database("sqlite").await.unwrap();
    let (mut child, base) = serve(&["--database-url", &url]).await;
    let client = reqwest::Client::new();
    let order = json!({"order_no": "O-s", "amount": 1000, "currency": "CNY"});
    assert_eq!(client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap().status(), 201);
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
    let token = token["token"].as_str().unwrap().to_owned();
    let paid = client
        .post(format!("{base}/v1/payments"))
        .header("Idempotency-Key", &token)
        .json(&json!({"order_no": "O-s", "amount": 1000, "currency": "CNY", "request_no": "R-s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 201);
    let payment: serde_json::Value =
        client.get(format!("{base}/v1/payments/R-s")).send().await.unwrap().json().await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let workflow_id = payment["workflow_id"].as_str().unwrap();
    let out = Command::new(ONCEFLOW)
        .args(["workflows", "show", workflow_id, "--database-url", &url])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("state     completed"), "{printed}");
    assert!(printed.lines().any(|l| l.starts_with("created   20") && l.ends_with('Z')), "RFC 3339: {printed}");
    assert!(printed.contains("\ninput\n") && printed.contains("\"order_no\": \"O-s\""), "the input: {printed}");
    assert!(printed.contains("\noutput\n") && printed.contains("\"status\": 201"), "the output: {printed}");
    assert!(printed.contains("\"charge_id\": \"ch_"), "the stored body as JSON: {printed}");
    assert!(printed.contains("call_channel") && printed.contains("    output "), "steps and outputs: {printed}");
    assert!(!printed.contains(&token), "the token is never shown: {printed}");
}

/// `workflows list`, `show` and `gc --dry-run` only read: they never migrate the database they are pointed at (an
/// operator's look during a rolling deploy must not change its schema), and on a database without onceflow's
/// tables they say so and exit non-zero.
#[tokio::test]
async fn read_only_commands_do_not_migrate() {
    let url = database("sqlite").await.unwrap();
    for args in [vec!["workflows", "list"], vec!["workflows", "show", "pay:none"], vec!["gc", "--dry-run"]] {
        let out = Command::new(ONCEFLOW).args(&args).args(["--database-url", &url]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} on an empty database: {stderr}");
        assert!(stderr.contains("onceflow migrate"), "{args:?} says what to do: {stderr}");
    }
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'table'").fetch_all(&pool).await.unwrap();
    assert!(tables.is_empty(), "a read-only command created {tables:?}");
}

/// A `serve` killed however the test ends: a server left running would hold the test's output open.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`serve`], killed when the returned guard is dropped.
async fn serve_killed(args: &[&str]) -> (Killed, String) {
    let (child, base) = serve(args).await;
    (Killed(child), base)
}

/// A slowloris client — connections that send part of a request's headers and then nothing — is cut off after
/// `--header-read-timeout`, and while `--max-connections` are taken by such clients a real request waits for a
/// slot instead of being refused or hanging for ever.
#[tokio::test]
async fn slow_clients_cannot_hold_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = database("sqlite").await.unwrap();
    let args = ["--database-url", &url, "--header-read-timeout", "500ms", "--max-connections", "2"];
    let (child, base) = serve_killed(&args).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        slow.push(c);
    }
    let started = Instant::now();
    let answered = tokio::time::timeout(Duration::from_secs(10), reqwest::get(format!("{base}/healthz"))).await;
    let waited = started.elapsed();
    for mut c in slow {
        let mut buf = [0u8; 512];
        // Closed by the server (EOF, possibly after a 408), not left open.
        let read = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(read.is_ok(), "a connection with half its headers is still open");
    }
    drop(child);
    let answered = answered.expect("a request behind slow clients got no answer").unwrap();
    assert_eq!(answered.status(), 200);
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

/// A slow-body client — full headers, then a body that trickles or stops (a slow POST) — is answered `408` and
/// cut off after `--body-read-timeout`, and while `--max-connections` are taken by such clients a real request
/// is served at once: the one reading its body the longest is answered `408` and closed to make room.
#[tokio::test]
async fn slow_bodies_cannot_hold_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = database("sqlite").await.unwrap();
    let args = ["--database-url", &url, "--body-read-timeout", "2s", "--max-connections", "2"];
    let (child, base) = serve_killed(&args).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // A loopback `Host`: without keys the service answers no other (issue 35).
        let head = "POST /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(br#"{"order_no":"#).await.unwrap();
        slow.push(c);
    }
    // Their heads read: the one closed to make room for the real request below is answered too (a connection
    // whose head has not arrived yet is closed without an answer, as a slow head is). A second, half the body
    // timeout: a server started under a loaded CI may take a while to read them (300 ms once was not enough).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answered = tokio::time::timeout(Duration::from_secs(10), reqwest::get(format!("{base}/healthz"))).await;
    for mut c in slow {
        // Answered 408 as a problem, then closed (EOF), not left open.
        let read = tokio::time::timeout(Duration::from_secs(3), async {
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let got = String::from_utf8_lossy(&read.expect("a connection with half its body is still open")).into_owned();
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(got.contains("request_timeout") && got.contains("application/problem+json"), "{got}");
        assert!(got.to_ascii_lowercase().contains("x-request-id"), "a 408 carries its request id: {got}");
    }
    drop(child);
    let answered = answered.expect("a request behind slow bodies got no answer").unwrap();
    assert_eq!(answered.status(), 200);
}

async fn serve_channel(channel: MockChannel) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(channel)).into_future());
    base
}

async fn killed_serve_finishes_the_payment(url: String) {
    let ledger = MockChannel::reliable();
    let slow = serve_channel(ledger.with_config(MockChannelConfig { latency_ms: 1500, ..Default::default() })).await;
    let fast = serve_channel(ledger.clone()).await;
    let client = reqwest::Client::new();
    let (mut first, base) = serve(&["--database-url", &url, "--channel-url", &slow, "--lease-ms", "500"]).await;
    let order = json!({"order_no": "O-k", "amount": 1000, "currency": "CNY"});
    assert_eq!(client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap().status(), 201);
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
    let token = token["token"].as_str().unwrap().to_owned();
    let pay = |base: String, wait: &'static str| {
        let (client, token, order) = (client.clone(), token.clone(), order.clone());
        async move {
            client
                .post(format!("{base}/v1/payments"))
                .header("idempotency-key", token)
                .header("prefer", wait)
                .json(&order)
                .send()
                .await
                .unwrap()
        }
    };
    let accepted = pay(base.clone(), "wait=0").await;
    assert_eq!(accepted.status(), 202);
    first.kill().expect("SIGKILL");
    first.wait().unwrap();

    let (mut second, base) = serve(&["--database-url", &url, "--channel-url", &fast, "--lease-ms", "500"]).await;
    let done = pay(base.clone(), "wait=20").await;
    assert_eq!(done.status(), 201);
    let body: serde_json::Value = done.json().await.unwrap();
    assert_eq!(body["status"], "succeeded");
    let order: serde_json::Value =
        client.get(format!("{base}/v1/orders/O-k")).send().await.unwrap().json().await.unwrap();
    assert_eq!(order["status"], "paid");
    assert_eq!(ledger.ledger().kept_charges("O-k"), 1);
    // SIGTERM: a graceful stop.
    let pid = second.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = second.wait().unwrap();
    assert!(status.success(), "graceful shutdown exits 0: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serve_finishes_the_payment_on_sqlite() {
    killed_serve_finishes_the_payment(database("sqlite").await.unwrap()).await;
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serve_finishes_the_payment_on_postgres() {
    let Some(url) = database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    killed_serve_finishes_the_payment(url).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serve_finishes_the_payment_on_mysql() {
    let Some(url) = database("mysql").await else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    killed_serve_finishes_the_payment(url).await;
}

#[tokio::test]
async fn bad_configuration_is_one_line_and_exit_2() {
    for args in [
        vec!["serve", "--database-url", "mysql://nope", "--channel-url", "mock"],
        vec!["serve", "--api-keys", "acme"],
        vec!["serve", "--listen", "0.0.0.0:0"],
        vec!["mock-channel", "--decline-rate", "2"],
        vec!["serve", "--database-url", "postgres://nobody@127.0.0.1:1/x", "--channel-url", "mock"],
    ] {
        let out = Command::new(ONCEFLOW).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}

/// Without `--channel-url`, only the zero-configuration mode (SQLite, no API keys) charges the in-process mock:
/// a Postgres or MySQL database, or API keys, mean a real deployment, which must not approve every charge.
#[tokio::test]
async fn a_real_deployment_without_a_channel_refuses_to_start() {
    let sqlite = database("sqlite").await.unwrap();
    let mut cases = vec![
        vec![
            "serve".to_owned(),
            "--database-url".into(),
            sqlite.clone(),
            "--api-keys".into(),
            "acme:secret-key-1".into(),
        ],
        vec!["worker".to_owned(), "--database-url".into(), sqlite, "--api-keys".into(), "acme:secret-key-1".into()],
    ];
    for backend in ["postgres", "mysql"] {
        match database(backend).await {
            Some(url) => {
                cases.push(vec!["serve".into(), "--database-url".into(), url.clone()]);
                cases.push(vec!["worker".into(), "--database-url".into(), url]);
            }
            None => eprintln!("{backend} cases skipped: its URL is not set"),
        }
    }
    for args in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = refuses(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains("--channel-url"), "{args:?}: {stderr}");
    }
}

/// `--channel-url mock` asks for the in-process mock by name, with API keys too.
#[tokio::test]
async fn the_mock_channel_is_there_when_asked_for() {
    let url = database("sqlite").await.unwrap();
    let (mut child, base) =
        serve(&["--database-url", &url, "--api-keys", "acme:secret-key-1", "--channel-url", "mock"]).await;
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap().status();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(ready, 200);
}

/// A charge the channel leaves `processing` is retried forever; it shows on `/metrics` and is logged once as a
/// warning when it passes `--unresolved-warn`.
async fn an_unresolved_payment_is_measured_and_warned_about_once(url: String) {
    let channel_port = free_port();
    let channel = format!("http://127.0.0.1:{channel_port}");
    let mut mock = Command::new(ONCEFLOW)
        .args(["mock-channel", "--listen", &format!("127.0.0.1:{channel_port}")])
        .args(["--processing-rate", "1", "--settle-ms", "600000"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start onceflow mock-channel");
    let started = Instant::now();
    while !reqwest::get(format!("{channel}/v1/ledger")).await.is_ok_and(|r| r.status().is_success()) {
        assert!(started.elapsed() < Duration::from_secs(30), "mock-channel did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut child, base) = serve_with_stderr(
        &["--database-url", &url, "--channel-url", &channel, "--unresolved-warn", "1s"],
        Stdio::piped(),
    )
    .await;
    let client = reqwest::Client::new();
    let order = json!({"order_no": "O-u", "amount": 1000, "currency": "CNY"});
    assert_eq!(client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap().status(), 201);
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
    let pay = json!({"order_no": "O-u", "amount": 1000, "currency": "CNY", "request_no": "R-unresolved-1"});
    let accepted = client
        .post(format!("{base}/v1/payments"))
        .header("idempotency-key", token["token"].as_str().unwrap())
        .header("prefer", "wait=0")
        .json(&pay)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    let gauge = |body: &str, name: &str| {
        body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
    };
    let started = Instant::now();
    let body = loop {
        let body = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        if gauge(&body, "onceflow_unresolved_payments") == Some(1.0)
            && gauge(&body, "onceflow_unresolved_payment_oldest_seconds").is_some_and(|s| s >= 1.0)
        {
            break body;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no unresolved payment on /metrics:\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    mock.kill().unwrap();
    mock.wait().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN") && l.contains("R-unresolved-1")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}\n{body}");
    assert!(warnings[0].contains("tenant"), "{}", warnings[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_payment_is_measured_and_warned_about_once_on_sqlite() {
    an_unresolved_payment_is_measured_and_warned_about_once(database("sqlite").await.unwrap()).await;
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_payment_is_measured_and_warned_about_once_on_postgres() {
    let Some(url) = database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    an_unresolved_payment_is_measured_and_warned_about_once(url).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_payment_is_measured_and_warned_about_once_on_mysql() {
    let Some(url) = database("mysql").await else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    an_unresolved_payment_is_measured_and_warned_about_once(url).await;
}
