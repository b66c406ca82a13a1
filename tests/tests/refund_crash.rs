//! The refund crash matrix with real processes: a refund process is killed with SIGKILL at every point of the
//! refund saga — while its first phase waits at the reservation, after the reservation with the channel call
//! sent but never booked, with the call booked by the channel after the process died, with the refund made but
//! its answer not yet confirmed, while the channel says `processing`, and with a failed refund unconfirmed — and
//! another process resumes the same request. Each refund ends as the channel says (once at the channel, under
//! its one number) with exactly one event saying so (the outbox is written by the outcome's commit, whichever
//! process makes it), nothing stays reserved, and the invariant checker passes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::events::Position;
use onceflow_payments::{
    Channel, EventType, MockChannel, MockChannelConfig, OrderStatus, PaymentStore, Payments, Refund, RefundNo,
    RefundRequest, RefundState, RefundStatus, check_invariants, merchant_refund_no, mock_channel_router,
};
use onceflow_tests::ids::{cny, order_no, pay_request, request_no};
use tokio::sync::{Notify, mpsc};

const WORKER: &str = env!("CARGO_BIN_EXE_refund-worker");

/// Where the refund process is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    /// Its first phase waits for the payment's row (held by the test) to reserve the amount: nothing recorded yet.
    AtReservation,
    /// The channel received the call and never books it.
    CallNeverBooked,
    /// The channel received the call and books it after the process died.
    CallBookedLate,
    /// The channel refunded and holds its answer: the refund is made, unconfirmed.
    RefundedUnconfirmed,
    /// The channel answers `processing` (it settles `succeeded` later).
    Processing,
    /// The channel failed the refund and holds its answer.
    FailedUnconfirmed,
}

/// The faulty channel of one case: how it takes the refund call, and whom it tells.
#[derive(Clone)]
struct Faulty {
    ledger: MockChannel,
    point: Point,
    told: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

async fn faulty_refund(State(f): State<Faulty>, Json(request): Json<RefundRequest>) -> Json<Refund> {
    let book = |ledger: MockChannel, request: RefundRequest| async move { ledger.refund(&request).await.unwrap() };
    let answer = match f.point {
        Point::AtReservation => book(f.ledger.clone(), request).await,
        Point::CallNeverBooked => {
            let _ = f.told.send(());
            std::future::pending().await
        }
        Point::CallBookedLate => {
            let _ = f.told.send(());
            // Booked whatever became of the connection.
            let (ledger, release) = (f.ledger.clone(), f.release.clone());
            tokio::spawn(async move {
                release.notified().await;
                book(ledger, request).await;
            });
            std::future::pending().await
        }
        Point::RefundedUnconfirmed | Point::FailedUnconfirmed => {
            book(f.ledger.clone(), request).await;
            let _ = f.told.send(());
            std::future::pending().await
        }
        Point::Processing => {
            let refund = book(f.ledger.clone(), request).await;
            let _ = f.told.send(());
            refund
        }
    };
    Json(answer)
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, router).into_future());
    base
}

fn worker(url: &str, channel: &str, token: &str, request: &str, refund_no: &str, gate: bool) -> Child {
    let mut command = Command::new(WORKER);
    command.args([url, channel, token, request, "1000", refund_no]).stdout(Stdio::piped()).stderr(Stdio::null());
    if gate {
        command.env("REFUND_WORKER_GATE", "1").stdin(Stdio::piped());
    }
    command.spawn().expect("start the refund worker")
}

/// Holds the payment's row where its refund's reservation must write it: a transaction holding the row
/// (Postgres, MySQL) or the database's one write lock (SQLite), until released.
enum Hold {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

impl Hold {
    async fn take(url: &str, request_no: &str) -> Self {
        let write = "UPDATE payments SET updated_at = updated_at WHERE request_no = ";
        if url.starts_with("postgres") {
            let mut tx = sqlx::PgPool::connect(url).await.unwrap().begin().await.unwrap();
            let sql = format!("{write}$1");
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(request_no).execute(&mut *tx).await.unwrap();
            Self::Postgres(tx)
        } else if url.starts_with("mysql") {
            let mut tx = sqlx::MySqlPool::connect(url).await.unwrap().begin().await.unwrap();
            let sql = format!("{write}?");
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(request_no).execute(&mut *tx).await.unwrap();
            Self::MySql(tx)
        } else {
            let mut tx = sqlx::SqlitePool::connect(url).await.unwrap().begin().await.unwrap();
            let sql = format!("{write}$1");
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(request_no).execute(&mut *tx).await.unwrap();
            Self::Sqlite(tx)
        }
    }

    async fn release(self) {
        match self {
            Self::Postgres(tx) => tx.rollback().await.unwrap(),
            Self::MySql(tx) => tx.rollback().await.unwrap(),
            Self::Sqlite(tx) => tx.rollback().await.unwrap(),
        }
    }
}

/// Waits for the gated worker's `ready`, takes the hold, and lets the worker refund.
async fn hold_then_go(child: &mut Child, url: &str, request_no: &str) -> Hold {
    let stdout = child.stdout.take().expect("stdout");
    let first = tokio::task::spawn_blocking(move || BufReader::new(stdout).lines().next())
        .await
        .unwrap()
        .expect("the worker printed")
        .unwrap();
    assert_eq!(first, "ready");
    let hold = Hold::take(url, request_no).await;
    writeln!(child.stdin.as_mut().expect("stdin"), "go").unwrap();
    hold
}

/// The types of the events of refund `refund_no`, once there is one (the Postgres log shows an event once every
/// older write transaction has ended), and a little later (no second one comes).
async fn events_of<S: PaymentStore>(store: &S, refund_no: &str) -> Vec<EventType> {
    let read = async || {
        // MySQL numbers committed events after their commit (its sequencer); elsewhere a no-op.
        store.sequence().await.unwrap();
        let page = store.events_after(Some("default"), &Position::start(), &[], 1000).await.unwrap();
        let of = |e: &&onceflow_payments::events::Event| {
            serde_json::from_str::<serde_json::Value>(&e.data).unwrap()["refund_no"] == refund_no
        };
        page.events.iter().filter(of).map(|e| e.kind).collect::<Vec<_>>()
    };
    let started = Instant::now();
    while read().await.is_empty() && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    read().await
}

async fn crash_matrix<S: PaymentStore>(store: S, url: &str) {
    let ledger = MockChannel::reliable();
    let setup = Payments::new(store.clone(), Arc::new(ledger.clone()), EngineConfig::default());
    let reliable = serve(mock_channel_router(ledger.clone())).await;
    let cases = [
        (Point::AtReservation, RefundState::Succeeded),
        (Point::CallNeverBooked, RefundState::Succeeded),
        (Point::CallBookedLate, RefundState::Succeeded),
        (Point::RefundedUnconfirmed, RefundState::Succeeded),
        (Point::Processing, RefundState::Succeeded),
        (Point::FailedUnconfirmed, RefundState::Failed),
    ];
    for (n, (point, ends)) in cases.into_iter().enumerate() {
        let (order, request, refund_no) = (format!("O-{n}"), format!("R-{n}"), format!("RF-{n}"));
        setup.create_order("default", &order_no(order.as_str()), 1000, &cny()).await.unwrap();
        let pay_token = setup.issue_token("default").await.unwrap().token;
        let pay = pay_request(order.as_str(), 1000, Some(request.as_str()));
        assert_eq!(
            setup.pay("default", &pay_token, "/v1/payments", &pay, Duration::from_secs(10)).await.unwrap().status,
            201
        );
        let token = setup.issue_token("default").await.unwrap().token;

        let config = match point {
            Point::Processing => {
                MockChannelConfig { refund_processing_rate: 1.0, settle_ms: 1_500, ..Default::default() }
            }
            Point::FailedUnconfirmed => MockChannelConfig { refund_fail_rate: 1.0, ..Default::default() },
            _ => MockChannelConfig::default(),
        };
        let (told, mut heard) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let faulty = Faulty { ledger: ledger.with_config(config), point, told, release: release.clone() };
        let faulty = serve(Router::new().route("/v1/refunds", post(faulty_refund)).with_state(faulty)).await;
        let gated = point == Point::AtReservation;
        let mut child = worker(url, &faulty, token.as_str(), &request, &refund_no, gated);
        let hold = if gated { Some(hold_then_go(&mut child, url, &request).await) } else { None };
        if hold.is_some() {
            // Long enough to reach the reservation and wait there.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(child.try_wait().unwrap().is_none(), "{point:?}: the worker is waiting at the reservation");
        } else {
            tokio::time::timeout(Duration::from_secs(30), heard.recv()).await.expect("the call reached the channel");
        }
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        if let Some(hold) = hold {
            hold.release().await;
        }
        release.notify_one();
        if point == Point::CallBookedLate {
            let number = merchant_refund_no(&RefundNo::parse(refund_no.as_str()).unwrap());
            let booked = Instant::now();
            while !ledger.ledger().refunds.iter().any(|r| r.merchant_refund_no == number) {
                assert!(booked.elapsed() < Duration::from_secs(10), "the late call was booked");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        // Another process resumes the same request.
        let out = worker(url, &reliable, token.as_str(), &request, &refund_no, false).wait_with_output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{point:?}: {printed}");
        let expected = if ends == RefundState::Succeeded { "status 201" } else { "status 422" };
        assert!(printed.starts_with(expected), "{point:?}: {printed}");

        let record = setup.refund_record("default", &RefundNo::parse(refund_no.as_str()).unwrap()).await.unwrap();
        let record = record.expect("the refund is recorded");
        assert_eq!(record.status, ends, "{point:?}");
        let at_channel: Vec<_> =
            ledger.ledger().refunds.into_iter().filter(|r| r.merchant_refund_no == record.merchant_refund_no).collect();
        assert_eq!(at_channel.len(), 1, "{point:?}: one refund at the channel");
        let said = if ends == RefundState::Succeeded { RefundStatus::Succeeded } else { RefundStatus::Failed };
        assert_eq!(at_channel[0].status, said, "{point:?}: as the channel says");
        let payment = setup.payment("default", &request_no(request.as_str())).await.unwrap().unwrap();
        let refunded = if ends == RefundState::Succeeded { 1000 } else { 0 };
        assert_eq!(
            (payment.refunded_amount, payment.refund_reserved),
            (refunded, 0),
            "{point:?}: nothing stays reserved"
        );
        let order = setup.order("default", &order_no(order.as_str())).await.unwrap().unwrap();
        let status = if ends == RefundState::Succeeded { OrderStatus::Refunded } else { OrderStatus::Paid };
        assert_eq!(order.status, status, "{point:?}");
        let kind = if ends == RefundState::Succeeded { EventType::RefundSucceeded } else { EventType::RefundFailed };
        assert_eq!(events_of(&store, &refund_no).await, [kind], "{point:?}: exactly one event, the refund's end");
    }
    let violations = check_invariants(&store, &ledger.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_survive_sigkill_on_sqlite() {
    let path = std::env::temp_dir().join(format!("onceflow-refundcrash-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", path.display());
    let store = SqliteStore::connect(&url).await.unwrap();
    store.migrate_payments().await.unwrap();
    crash_matrix(store, &url).await;
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_survive_sigkill_on_postgres() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let store = PgStore::connect(&url, 4).await.unwrap();
    crash_matrix(store, &url).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_survive_sigkill_on_mysql() {
    let Some(url) = onceflow_tests::mysql_url().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let store = MySqlStore::connect(&url, 4).await.unwrap();
    crash_matrix(store, &url).await;
}
