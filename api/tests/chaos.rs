//! The chaos run: three `onceflow serve` processes and one `onceflow worker` on one Postgres (and again on one
//! MySQL), a mock channel with every fault on, a load
//! client sending payments (a third of them duplicated, concurrently, under the same token) to random
//! processes, and a killer that SIGKILLs a random process every few seconds and restarts it. An operator cancels
//! one payment in seven shortly after it is sent (the channel fails, holds or loses the reply of a share of the
//! refunds that follow), and asks the channel now (`query-channel`) for whatever is compensating. Afterwards it
//! waits for recovery and checks, from the channel's ledger and the database: at most one kept charge per
//! order, every order paid exactly when charged, every duplicate answered like its original, nothing left
//! `paying`/`processing`, every accepted request final, no payment left with no way out. Bounded in time and
//! requests; loopback only.
//!
//! CI runs a short form. The long form:
//! `ONCEFLOW_CHAOS_SECS=300 ONCEFLOW_CHAOS_KILL_MS=2500 DATABASE_URL=postgres://… cargo test --release -p onceflow-api --test chaos -- --nocapture`
//! (`MYSQL_URL=mysql://…` for the MySQL run; `postgres` or `mysql` after `--` picks one).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use onceflow_engine::store::WorkflowState;
use onceflow_engine::{MySqlStore, PgStore};
use onceflow_payments::{
    MockChannel, MockChannelConfig, OrderNo, PaymentStore, Token, TokenState, check_invariants, mock_channel_router,
};
use serde_json::json;
use tokio::sync::Mutex;

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");
/// `serve` processes taking requests; one `worker` process more only recovers.
const PROCESSES: usize = 3;
const CLIENTS: u64 = 8;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Fleet {
    db: String,
    channel: String,
    ports: Vec<u16>,
    children: Mutex<Vec<Child>>,
}

impl Fleet {
    /// Starts process `i`: a `serve` on its port, or (past the servers) the `worker`.
    fn spawn(&self, i: usize) -> Child {
        let command = if i < PROCESSES { "serve" } else { "worker" };
        let port = self.ports.get(i).copied().unwrap_or(0);
        Command::new(ONCEFLOW)
            .arg(command)
            .args(["--database-url", &self.db, "--listen", &format!("127.0.0.1:{port}")])
            .args(["--channel-url", &self.channel, "--channel-timeout-ms", "400"])
            .args(["--lease-ms", "1000", "--wait-ms", "2000"])
            // Two `serve` processes and the worker with one commit slot: commits that arrive together go as
            // batches (group commit on Postgres), which the killer cuts short; the third `serve` with none, each
            // commit alone.
            .args(["--commit-slots", if i == 2 { "0" } else { "1" }])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start onceflow serve")
    }

    fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i % self.ports.len()])
    }

    async fn wait_up(&self, client: &reqwest::Client, i: usize) {
        let started = Instant::now();
        while !client.get(format!("{}/readyz", self.base(i))).send().await.is_ok_and(|r| r.status().is_success()) {
            assert!(started.elapsed() < Duration::from_secs(30), "process {i} did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    duplicates: AtomicU64,
    retries: AtomicU64,
    cancels: AtomicU64,
    kills: AtomicU64,
    /// Batches of commits the killed `serve` processes had sent (group commit), read just before each kill.
    batches: AtomicU64,
    violations: Mutex<Vec<String>>,
    /// Final answers per token, as each request finally got them.
    answers: Mutex<HashMap<String, Vec<(u16, String)>>>,
}

/// Sends one payment request until it has a final answer, retrying the same token on other processes after
/// a connection error, a `503` or a `202`.
async fn pay_until_final(fleet: &Fleet, client: &reqwest::Client, tally: &Tally, token: &str, order: &str, salt: u64) {
    let body = json!({"order_no": order, "amount": 1000, "currency": "CNY"});
    let started = Instant::now();
    for attempt in 0u64.. {
        if started.elapsed() > Duration::from_secs(90) {
            tally.violations.lock().await.push(format!("token {token}: no final answer in 90 s"));
            return;
        }
        if attempt > 0 {
            tally.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let base = fleet.base((salt + attempt) as usize);
        let sent = client
            .post(format!("{base}/v1/payments"))
            .header("idempotency-key", token)
            .header("prefer", "wait=2")
            .json(&body)
            .send()
            .await;
        let Ok(response) = sent else { continue };
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        // A payment an operator cancelled answers `502 payment_failed`: final, stored, replayed.
        let cancelled = status == 502 && text.contains("\"payment_failed\"");
        match status {
            201 | 402 | 409 | 422 => {
                tally.answers.lock().await.entry(token.to_owned()).or_default().push((status, text));
                return;
            }
            _ if cancelled => {
                tally.answers.lock().await.entry(token.to_owned()).or_default().push((status, text));
                return;
            }
            202 | 503 => {}
            other => {
                tally.violations.lock().await.push(format!("token {token}: answered {other}: {text}"));
                return;
            }
        }
    }
}

/// An operator cancels the payment `workflow_id` a moment after it was sent (through any live process): at any
/// step of it, its charge perhaps in flight or its reply lost. A cancel that finds it ended is refused, which is
/// fine.
async fn cancel_soon(fleet: &Fleet, client: &reqwest::Client, tally: &Tally, workflow_id: &str, job: u64) {
    tokio::time::sleep(Duration::from_millis(20 + job * 37 % 300)).await;
    for attempt in 0..20u64 {
        let base = fleet.base((job + attempt) as usize);
        let sent = client
            .post(format!("{base}/v1/workflows/{workflow_id}/cancel"))
            .header("content-type", "application/json")
            .send()
            .await;
        match sent.map(|r| r.status().as_u16()) {
            Ok(200) => {
                tally.cancels.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // Ended, or not there yet: nothing to cancel.
            Ok(404 | 409) => return,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// An operator asks the channel now, every half second, for every workflow that is compensating (through any
/// live process): the wake claims it, finds it held by another process, or cuts a wait of its own short.
async fn ask_the_channel(fleet: &Fleet, client: &reqwest::Client, stop: &AtomicBool) {
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        round += 1;
        let base = fleet.base(round);
        let Ok(page) = client.get(format!("{base}/v1/workflows?state=compensating&limit=20")).send().await else {
            continue;
        };
        let Ok(page) = page.json::<serde_json::Value>().await else { continue };
        for w in page["workflows"].as_array().into_iter().flatten() {
            let id = w["workflow_id"].as_str().unwrap_or_default();
            let _ = client
                .post(format!("{base}/v1/workflows/{id}/query-channel"))
                .header("content-type", "application/json")
                .send()
                .await;
        }
    }
}

/// Creates an order and a token through any live process.
async fn setup_payment(fleet: &Fleet, client: &reqwest::Client, order: &str, salt: u64) -> Option<String> {
    let started = Instant::now();
    let mut made_order = false;
    for attempt in 0u64.. {
        if started.elapsed() > Duration::from_secs(30) {
            return None;
        }
        let base = fleet.base((salt + attempt) as usize);
        if !made_order {
            let body = json!({"order_no": order, "amount": 1000, "currency": "CNY"});
            match client.post(format!("{base}/v1/orders")).json(&body).send().await {
                Ok(r) if r.status().is_success() => made_order = true,
                _ => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        if let Ok(r) = client.post(format!("{base}/v1/tokens")).send().await
            && r.status().as_u16() == 201
            && let Ok(v) = r.json::<serde_json::Value>().await
        {
            return v["token"].as_str().map(str::to_owned);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_nothing_lost_nothing_charged_twice_postgres() {
    let Some(db) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let store = PgStore::connect(&db, 2).await.unwrap();
    chaos(db, store).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_nothing_lost_nothing_charged_twice_mysql() {
    let Some(db) = onceflow_tests::mysql_url().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let store = MySqlStore::connect(&db, 2).await.unwrap();
    chaos(db, store).await;
}

/// The run against the database `db`, checked afterwards through `store`.
async fn chaos<S: PaymentStore>(db: String, store: S) {
    let secs = env_u64("ONCEFLOW_CHAOS_SECS", 12);
    let kill_every = Duration::from_millis(env_u64("ONCEFLOW_CHAOS_KILL_MS", 1500));
    let max_payments = env_u64("ONCEFLOW_CHAOS_MAX_PAYMENTS", 100_000);

    let ledger = MockChannel::new(MockChannelConfig {
        latency_ms: 5,
        decline_rate: 0.1,
        error_before_rate: 0.05,
        error_after_rate: 0.05,
        slow_rate: 0.05,
        slow_ms: 1_000,
        processing_rate: 0.1,
        settle_ms: 300,
        seed: 42,
        hold_ms: 0,
        // Refunds come only from cancels: a third fail (the payment rolls forward), some are held processing,
        // some answered 500 after they were made.
        refund_fail_rate: 0.3,
        refund_processing_rate: 0.2,
        refund_error_after_rate: 0.1,
        ..MockChannelConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(ledger.clone())).into_future());

    let ports: Vec<u16> = (0..PROCESSES)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
        .collect();
    let fleet = Arc::new(Fleet { db: db.clone(), channel, ports: ports.clone(), children: Mutex::new(Vec::new()) });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    {
        let mut children = fleet.children.lock().await;
        for i in 0..=PROCESSES {
            children.push(fleet.spawn(i));
            if i == 0 {
                // The first process migrates alone; the others find the schema ready.
                fleet.wait_up(&client, 0).await;
            }
        }
    }
    for i in 0..PROCESSES {
        fleet.wait_up(&client, i).await;
    }

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(secs);

    let killer = {
        let (fleet, tally, stop, client) = (fleet.clone(), tally.clone(), stop.clone(), client.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(kill_every).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                n += 1;
                let victim = (n * 7 + 1) % (PROCESSES + 1);
                if victim < PROCESSES {
                    tally.batches.fetch_add(batches_sent(&client, &fleet.base(victim)).await, Ordering::Relaxed);
                }
                {
                    let mut children = fleet.children.lock().await;
                    let _ = children[victim].kill();
                    let _ = children[victim].wait();
                    children[victim] = fleet.spawn(victim);
                }
                tally.kills.fetch_add(1, Ordering::Relaxed);
                if victim < PROCESSES {
                    fleet.wait_up(&client, victim).await;
                }
            }
        })
    };

    let next = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (fleet, tally, client, next) = (fleet.clone(), tally.clone(), client.clone(), next.clone());
        clients.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let job = next.fetch_add(1, Ordering::Relaxed);
                if job >= max_payments {
                    break;
                }
                let order = format!("chaos-{job}");
                let Some(token) = setup_payment(&fleet, &client, &order, job).await else {
                    tally.violations.lock().await.push(format!("could not set up payment {job}"));
                    continue;
                };
                let copies = if job % 3 == 0 { 3 } else { 1 };
                tally.requests.fetch_add(copies, Ordering::Relaxed);
                tally.duplicates.fetch_add(copies - 1, Ordering::Relaxed);
                if job % 7 == 3 {
                    let (fleet, client, tally) = (fleet.clone(), client.clone(), tally.clone());
                    let workflow_id = onceflow_payments::payment_workflow_id(&Token::parse(token.as_str()).unwrap());
                    tokio::spawn(async move { cancel_soon(&fleet, &client, &tally, &workflow_id, job).await });
                }
                let sends = (0..copies).map(|c| pay_until_final(&fleet, &client, &tally, &token, &order, job + c));
                futures_join_all(sends).await;
            }
        }));
    }
    let operator = {
        let (fleet, client, stop) = (fleet.clone(), client.clone(), stop.clone());
        tokio::spawn(async move { ask_the_channel(&fleet, &client, &stop).await })
    };
    for c in clients {
        c.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    killer.await.unwrap();
    operator.await.unwrap();
    for i in 0..PROCESSES {
        fleet.wait_up(&client, i).await;
    }

    // Recovery: every workflow reaches a final state.
    let started = Instant::now();
    loop {
        let in_state = |state| onceflow_engine::store::WorkflowFilter { state: Some(state), ..Default::default() };
        let mut open = store.list(in_state(WorkflowState::Running), 1).await.unwrap();
        open.extend(store.list(in_state(WorkflowState::Compensating), 1).await.unwrap());
        if open.is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "workflows still open after 60 s: {open:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut violations = tally.violations.lock().await.clone();
    // Every duplicate got the same answer as its original: the one stored with the token, which is final.
    let answers = tally.answers.lock().await.clone();
    for (token, got) in &answers {
        let (key, none) = (Token::parse(token.as_str()).unwrap(), OrderNo::parse("none").unwrap());
        let stored = store.token_and_order(&key, "default", &none).await.unwrap().map(|(t, _)| t);
        let Some((status, body)) = stored.as_ref().and_then(|t| Some((t.response_status?, t.response_body.clone()?)))
        else {
            violations.push(format!("token {token}: answered {got:?} but stored nothing"));
            continue;
        };
        if stored.is_some_and(|t| t.state == TokenState::InUse) {
            violations.push(format!("token {token} left in_use"));
        }
        for (s, b) in got {
            if i32::from(*s) != status || *b != body {
                violations.push(format!("token {token}: answered {s} {b}, stored {status} {body}"));
            }
        }
    }
    let snapshot = ledger.ledger();
    violations.extend(check_invariants(&store, &snapshot).await.unwrap().into_iter().map(|v| v.0));

    {
        let mut children = fleet.children.lock().await;
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let charged = snapshot.charges.iter().filter(|c| c.status == onceflow_payments::ChargeStatus::Succeeded).count();
    let declined = snapshot.charges.iter().filter(|c| c.status == onceflow_payments::ChargeStatus::Declined).count();
    println!(
        "chaos: {secs} s, {} payments, {} requests ({} duplicates, {} retries), {} kills ({} batches of commits \
         before them), {} cancels, {} charge calls, {charged} succeeded charges, {declined} declined, {} refunds \
         ({} failed), {} violations",
        answers.len(),
        tally.requests.load(Ordering::Relaxed),
        tally.duplicates.load(Ordering::Relaxed),
        tally.retries.load(Ordering::Relaxed),
        tally.kills.load(Ordering::Relaxed),
        tally.batches.load(Ordering::Relaxed),
        tally.cancels.load(Ordering::Relaxed),
        snapshot.charge_calls,
        snapshot.refunds.len(),
        snapshot.refunds.iter().filter(|r| r.status == onceflow_payments::RefundStatus::Failed).count(),
        violations.len(),
    );
    assert!(violations.is_empty(), "violations:\n{}", violations.join("\n"));
    assert!(tally.kills.load(Ordering::Relaxed) > 0, "the run killed nothing");
    if onceflow_engine::Store::backend(&store) == "postgres" {
        assert!(tally.batches.load(Ordering::Relaxed) > 0, "no process sent a batch of commits before its kill");
    }
}

/// `onceflow_commit_batches_total` of the process at `base` (0 when it cannot be read).
async fn batches_sent(client: &reqwest::Client, base: &str) -> u64 {
    let Ok(response) = client.get(format!("{base}/metrics")).send().await else { return 0 };
    let text = response.text().await.unwrap_or_default();
    let line = text.lines().find_map(|l| l.strip_prefix("onceflow_commit_batches_total "));
    line.and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Waits for every future (a few, so sequential polling through a join set is plenty).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let futures: Vec<_> = futures.map(Box::pin).collect();
    let mut pending = futures;
    std::future::poll_fn(move |cx| {
        pending.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pending.is_empty() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
}
