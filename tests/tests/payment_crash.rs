//! The payment crash matrix with real processes: a payment process is killed with SIGKILL after the first
//! commit (claim, record, reservation and the channel intent) while the channel call is in flight, and after
//! the channel charged but before `confirm`; a fresh process resumes the same request. The channel, in this
//! test process, must end with exactly one charge, the event log with exactly one `payment.succeeded` of the
//! payment (the outbox is written by the outcome's commit, whichever process makes it), and the invariant
//! checker must pass.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::events::Position;
use onceflow_payments::{
    EventType, MockChannel, MockChannelConfig, OrderStatus, PaymentStore, Payments, check_invariants,
    mock_channel_router,
};

const WORKER: &str = env!("CARGO_BIN_EXE_pay-worker");

async fn serve(channel: MockChannel) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(channel)).into_future());
    base
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The types of the events of the order `order_no`'s payments, once there are `expected` (the Postgres log shows
/// an event once every older write transaction has ended), and a little later (no second one comes).
async fn events_of<S: PaymentStore>(store: &S, order_no: &str, expected: usize) -> Vec<EventType> {
    let read = async || {
        // MySQL numbers committed events after their commit (its sequencer); elsewhere a no-op.
        store.sequence().await.unwrap();
        let page = store.events_after(Some("default"), &Position::start(), &[], 1000).await.unwrap();
        let of = |e: &&onceflow_payments::events::Event| {
            serde_json::from_str::<serde_json::Value>(&e.data).unwrap()["order_no"] == order_no
        };
        page.events.iter().filter(of).map(|e| e.kind).collect::<Vec<_>>()
    };
    let started = Instant::now();
    while read().await.len() < expected && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    read().await
}

async fn crash_matrix<S: PaymentStore>(store: S, url: &str) {
    let ledger = MockChannel::reliable();
    let setup = Payments::new(store.clone(), Arc::new(ledger.clone()), EngineConfig::default());
    let reliable = serve(ledger.clone()).await;
    let cases = [
        ("in-flight", MockChannelConfig { latency_ms: 10_000, ..Default::default() }),
        ("charged-unconfirmed", MockChannelConfig { slow_rate: 1.0, slow_ms: 10_000, ..Default::default() }),
    ];
    for (name, faults) in cases {
        let order_no = format!("crash-{name}");
        let number = onceflow_tests::ids::order_no(order_no.as_str());
        setup.create_order("default", &number, 1000, &onceflow_tests::ids::cny()).await.unwrap();
        let token = setup.issue_token("default").await.unwrap().token;
        let faulty = serve(ledger.with_config(faults)).await;
        let mut child = Command::new(WORKER)
            .args([url, &faulty, token.as_str(), &order_no, "1000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start the worker");
        if name == "in-flight" {
            // The first commit is in: the order is reserved and the channel call has started.
            wait_for("the reservation", async || {
                setup.order("default", &number).await.unwrap().unwrap().status == OrderStatus::Paying
            })
            .await;
        } else {
            wait_for("the charge", async || ledger.ledger().charges.iter().any(|c| c.order_no == order_no)).await;
        }
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        assert_eq!(setup.order("default", &number).await.unwrap().unwrap().status, OrderStatus::Paying);
        let out = Command::new(WORKER).args([url, &reliable, token.as_str(), &order_no, "1000"]).output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(printed.starts_with("status 201"), "{name}: {printed}");
        assert_eq!(ledger.ledger().kept_charges(&order_no), 1, "{name}: exactly one charge");
        assert_eq!(setup.order("default", &number).await.unwrap().unwrap().status, OrderStatus::Paid);
        let events = events_of(&store, &order_no, 1).await;
        assert_eq!(events, [EventType::PaymentSucceeded], "{name}: exactly one event, the payment's success");
    }
    let violations = check_invariants(&store, &ledger.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_on_sqlite() {
    let path = std::env::temp_dir().join(format!("onceflow-paycrash-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", path.display());
    let store = SqliteStore::connect(&url).await.unwrap();
    onceflow_payments::PaymentStore::migrate_payments(&store).await.unwrap();
    crash_matrix(store, &url).await;
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_on_postgres() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let store = PgStore::connect(&url, 4).await.unwrap();
    crash_matrix(store, &url).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_on_mysql() {
    let Some(url) = onceflow_tests::mysql_url().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let store = MySqlStore::connect(&url, 4).await.unwrap();
    crash_matrix(store, &url).await;
}
