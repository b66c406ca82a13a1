//! Retention through the real `onceflow` binary: `onceflow gc --dry-run` counts and deletes nothing, `onceflow
//! gc` deletes and prints what, a replay after that is `404 token_not_found`, and `serve` runs its passes every
//! `--gc-interval`, counted in `/metrics`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::database;
use serde_json::{Value, json};

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `onceflow serve` and waits for `/healthz`. The caller stops and reaps it.
#[allow(clippy::zombie_processes)]
async fn serve(args: &[&str]) -> (Child, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(ONCEFLOW)
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
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve {args:?} exited before it came up: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn stop(mut child: Child) {
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success(), "a graceful stop");
}

/// `onceflow gc args…`: its stdout, after checking it succeeded.
fn gc(args: &[&str]) -> String {
    gc_with(&[], args)
}

/// `onceflow gc args…` with environment variables `env`.
fn gc_with(env: &[(&str, &str)], args: &[&str]) -> String {
    let out = Command::new(ONCEFLOW).arg("gc").args(args).env("RUST_LOG", "warn").envs(env.iter().copied()).output();
    let out = out.unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{printed}\n{}", String::from_utf8_lossy(&out.stderr));
    printed
}

fn counts(verb: &str, unused: u64, used: u64, workflows: u64, steps: u64) -> String {
    format!(
        "{verb} unused_tokens {unused}\n{verb} used_tokens {used}\n{verb} workflows {workflows}\n{verb} steps {steps}\n\
         {verb} events 0\n"
    )
}

/// An order, a token paid with (its response), and a token left unused: the token paid with.
async fn pay_once(base: &str, order_no: &str) -> (String, Value) {
    let client = reqwest::Client::new();
    let order = json!({"order_no": order_no, "amount": 1000, "currency": "CNY"});
    assert_eq!(client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap().status(), 201);
    let token = |client: reqwest::Client| async move {
        let answer: Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
        answer["token"].as_str().unwrap().to_owned()
    };
    let used = token(client.clone()).await;
    token(client.clone()).await;
    let paid = client.post(format!("{base}/v1/payments")).header("idempotency-key", &used).json(&order).send();
    let paid = paid.await.unwrap();
    assert_eq!(paid.status(), 201);
    (used, paid.json().await.unwrap())
}

async fn replay(base: &str, token: &str, order_no: &str) -> (u16, Value) {
    let order = json!({"order_no": order_no, "amount": 1000, "currency": "CNY"});
    let client = reqwest::Client::new();
    let answer = client.post(format!("{base}/v1/payments")).header("idempotency-key", token).json(&order).send();
    let answer = answer.await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_dry_run_counts_then_gc_deletes() {
    let url = database("sqlite").await.unwrap();
    let (child, base) = serve(&["--database-url", &url]).await;
    let (token, paid) = pay_once(&base, "O-g").await;
    stop(child);

    let now = ["--database-url", &url, "--response-retention", "0s", "--history-retention", "0s"];
    let expected = counts("would delete", 0, 1, 1, 5);
    assert_eq!(gc(&[&now[..], &["--dry-run"]].concat()), expected);
    assert_eq!(gc(&[&now[..], &["--dry-run"]].concat()), expected, "the dry run deleted nothing");
    assert_eq!(gc_with(&[("ONCEFLOW_DRY_RUN", "1")], &now), expected, "--dry-run from the environment");
    assert_eq!(gc(&["--database-url", &url]), counts("deleted", 0, 0, 0, 0), "the defaults keep it all");
    assert_eq!(gc(&now), counts("deleted", 0, 1, 1, 5));
    assert_eq!(gc(&now), counts("deleted", 0, 0, 0, 0), "each row once");
    // The unused token lives its 24 h, unless the ttl is counted as if it were shorter.
    assert_eq!(gc(&["--database-url", &url, "--dry-run"]), counts("would delete", 0, 0, 0, 0));

    let (child, base) = serve(&["--database-url", &url]).await;
    let (status, body) = replay(&base, &token, "O-g").await;
    assert_eq!((status, body["code"].as_str()), (404, Some("token_not_found")), "{body}");
    let request_no = paid["request_no"].as_str().unwrap();
    let record: Value = reqwest::get(format!("{base}/v1/payments/{request_no}")).await.unwrap().json().await.unwrap();
    assert_eq!(record["status"], "succeeded", "the payment record is kept: {record}");
    stop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_a_pass_every_gc_interval() {
    let url = database("sqlite").await.unwrap();
    let every = ["--gc-interval", "200ms", "--response-retention", "0s", "--history-retention", "0s"];
    let (child, base) = serve(&[&["--database-url", &url][..], &every].concat()).await;
    let (token, _) = pay_once(&base, "O-i").await;
    let started = Instant::now();
    loop {
        let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
        if metrics.contains("onceflow_gc_deleted_total{kind=\"workflows\"} 1")
            && metrics.contains("onceflow_gc_deleted_total{kind=\"used_tokens\"} 1")
        {
            assert!(metrics.contains("onceflow_gc_last_run_timestamp_seconds"), "{metrics}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no pass deleted the payment's rows: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = replay(&base, &token, "O-i").await;
    assert_eq!((status, body["code"].as_str()), (404, Some("token_not_found")), "{body}");
    stop(child);
}
