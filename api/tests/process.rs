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
#[allow(clippy::zombie_processes)]
async fn serve(args: &[&str]) -> (Child, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(ONCEFLOW)
        .arg("serve")
        .args(["--listen", &listen])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
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
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serve_finishes_the_payment_on_postgres() {
    let Some(url) = database("postgres").await else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    killed_serve_finishes_the_payment(url).await;
}

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
        vec!["serve", "--database-url", "mysql://nope"],
        vec!["serve", "--api-keys", "acme"],
        vec!["serve", "--listen", "0.0.0.0:0"],
        vec!["mock-channel", "--decline-rate", "2"],
        vec!["serve", "--database-url", "postgres://nobody@127.0.0.1:1/x"],
    ] {
        let out = Command::new(ONCEFLOW).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}
