//! For the webhook tests: the application with its delivery loop and event settings, events written through the
//! outbox into its database, and receivers that answer as a test tells them and remember what they were sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use onceflow_api::{AppState, Auth, OnPayments, app, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::{EventSettings, EventStore, EventType, MockChannel, NewEvent, PaymentStore, Payments};
use tokio::sync::{mpsc, oneshot};

use super::App;

/// What the test asks of the application's database.
pub enum Ask {
    /// Write this event through the outbox, in a transaction of its own; answered once committed.
    Write(NewEvent, oneshot::Sender<()>),
    /// Write these events in one transaction; answered once committed.
    WriteAll(Vec<NewEvent>, oneshot::Sender<()>),
    /// Run one retention pass now; answered with the events it deleted.
    Retention(oneshot::Sender<u64>),
}

/// The running application and a line to its database.
pub struct Hooked {
    pub app: App,
    pub asks: mpsc::UnboundedSender<Ask>,
    /// Its database.
    pub url: String,
}

impl Hooked {
    /// Writes `event` (committed when this returns).
    pub async fn write(&self, event: NewEvent) {
        let (tx, rx) = oneshot::channel();
        self.asks.send(Ask::Write(event, tx)).unwrap();
        rx.await.unwrap();
    }

    /// Writes `events` in one transaction (committed when this returns).
    pub async fn write_all(&self, events: Vec<NewEvent>) {
        let (tx, rx) = oneshot::channel();
        self.asks.send(Ask::WriteAll(events, tx)).unwrap();
        rx.await.unwrap();
    }

    /// One retention pass: the events it deleted.
    pub async fn retention(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        self.asks.send(Ask::Retention(tx)).unwrap();
        rx.await.unwrap()
    }

    /// The API as the holder of `key`.
    pub fn as_key(&self, key: &str) -> App {
        App { base: self.app.base.clone(), client: reqwest::Client::new(), key: Some(key.to_owned()) }
    }
}

/// A clock `offset_ms` away from the system's (a process whose clock is wrong).
struct Skewed(i64);

impl onceflow_engine::clock::Clock for Skewed {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis() + self.0
    }
}

struct Start(Auth, EventSettings, i64);

impl OnPayments for Start {
    type Output = (axum::Router, mpsc::UnboundedSender<Ask>);

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let payments = if self.2 == 0 {
            payments
        } else {
            let channel = Arc::new(MockChannel::reliable());
            let store = payments.engine().store().clone();
            Payments::with_clock(store, channel, EngineConfig::default(), Skewed(self.2))
        };
        let payments = payments.with_events(self.1);
        payments.engine().spawn_background();
        payments.events().spawn();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let p = payments.clone();
        tokio::spawn(async move {
            while let Some(ask) = rx.recv().await {
                match ask {
                    Ask::Write(event, done) => {
                        let mut t = p.engine().store().begin().await.unwrap();
                        <S as EventStore>::write_event(&mut t, &event).await.unwrap();
                        t.commit().await.unwrap();
                        let _ = done.send(());
                    }
                    Ask::WriteAll(events, done) => {
                        let mut t = p.engine().store().begin().await.unwrap();
                        for event in &events {
                            <S as EventStore>::write_event(&mut t, event).await.unwrap();
                        }
                        t.commit().await.unwrap();
                        let _ = done.send(());
                    }
                    Ask::Retention(done) => {
                        let report = p.retention_pass(false).await.unwrap().unwrap();
                        let _ = done.send(report.events);
                    }
                }
            }
        });
        let wait = Duration::from_secs(10);
        (app(AppState { payments, auth: self.0, wait, body_read_timeout: wait, mock_channel: false }), tx)
    }
}

/// The application on `url` with `settings`, its deliveries running.
pub async fn start(url: &str, auth: Auth, settings: EventSettings) -> Hooked {
    start_skewed(url, auth, settings, 0).await
}

/// [`start`] with the process's clock `offset_ms` away from the system's.
pub async fn start_skewed(url: &str, auth: Auth, settings: EventSettings, offset_ms: i64) -> Hooked {
    let channel = Arc::new(MockChannel::reliable());
    let (router, asks) = with_payments(url, channel, EngineConfig::default(), 16, Start(auth, settings, offset_ms))
        .await
        .expect("database");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, router).into_future());
    Hooked { app: App { base, client: reqwest::Client::new(), key: None }, asks, url: url.to_owned() }
}

/// Runs `statement` on the database at `url` from a connection of the test's own (what the application could
/// not be made to do through its API); the rows it changed.
pub async fn sql(url: &str, statement: &str) -> u64 {
    use sqlx::Connection;
    let statement = sqlx::AssertSqlSafe(statement.to_owned());
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap().rows_affected()
    } else if url.starts_with("mysql") {
        let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap().rows_affected()
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut c).await.unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap().rows_affected()
    }
}

/// The count `query` (`SELECT count(*) …`) answers on the database at `url`.
pub async fn count(url: &str, query: &str) -> i64 {
    use sqlx::Connection;
    let query = sqlx::AssertSqlSafe(query.to_owned());
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
    } else if url.starts_with("mysql") {
        let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut c).await.unwrap();
        sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
    }
}

/// Settings for a local receiver: plain http to loopback allowed, short waits.
pub fn local(schedule: &[u64]) -> EventSettings {
    EventSettings {
        rules: onceflow_payments::events::address::Rules { allow_http: true, allow_private: true },
        schedule: schedule.iter().map(|ms| Duration::from_millis(*ms)).collect(),
        poll: Duration::from_millis(50),
        ..EventSettings::default()
    }
}

/// A payment's event for `tenant`, now.
pub fn event(tenant: &str, request_no: &str) -> NewEvent {
    let now = chrono::Utc::now().timestamp_millis();
    let data = serde_json::json!({ "request_no": request_no, "status": "succeeded", "amount": 1000 }).to_string();
    NewEvent::payment(tenant, request_no, EventType::PaymentSucceeded, data, now)
}

/// How a receiver answers one request.
#[derive(Debug, Clone, Copy)]
pub enum Reply {
    /// At once, with this status.
    Status(u16),
    /// At once, with this status and `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// After this long, `200`.
    Slow(Duration),
    /// Never (holds the request open).
    Hang,
}

/// A request a receiver got.
#[derive(Debug, Clone)]
pub struct Hit {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    /// Its `traceparent` header (empty when none).
    pub traceparent: String,
    pub body: Bytes,
    pub at: Instant,
}

type Plan = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// A webhook receiver on loopback.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    pub port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    /// The most requests of one `webhook-id` it held at once.
    pub overlap: Arc<AtomicUsize>,
}

impl Receiver {
    /// A receiver answering the `n`th request (0, 1, …) of an event id as `plan(id, n)` says.
    pub async fn start(plan: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = Self {
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            hits: Arc::default(),
            in_flight: Arc::default(),
            overlap: Arc::default(),
        };
        let plan: Plan = Arc::new(plan);
        let r = receiver.clone();
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (r, plan) = (r.clone(), plan.clone());
                async move { r.answer(&plan, &headers, body).await }
            }),
        );
        tokio::spawn(axum::serve(listener, router).into_future());
        receiver
    }

    async fn answer(&self, plan: &Plan, headers: &HeaderMap, body: Bytes) -> axum::response::Response {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let id = header("webhook-id");
        let n = {
            let mut hits = self.hits.lock().unwrap();
            let n = hits.iter().filter(|h| h.id == id).count();
            let hit = Hit {
                id: id.clone(),
                timestamp: header("webhook-timestamp"),
                signature: header("webhook-signature"),
                traceparent: header("traceparent"),
                body,
                at: Instant::now(),
            };
            hits.push(hit);
            n
        };
        {
            let mut in_flight = self.in_flight.lock().unwrap();
            let now = in_flight.entry(id.clone()).or_default();
            *now += 1;
            self.overlap.fetch_max(*now, Ordering::SeqCst);
        }
        let reply = plan(&id, n);
        let response = match reply {
            Reply::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
            Reply::RetryAfter(s, secs) => {
                (StatusCode::from_u16(s).unwrap(), [("retry-after", secs.to_string())]).into_response()
            }
            Reply::Slow(d) => {
                tokio::time::sleep(d).await;
                StatusCode::OK.into_response()
            }
            Reply::Hang => {
                std::future::pending::<()>().await;
                unreachable!()
            }
        };
        if let Some(n) = self.in_flight.lock().unwrap().get_mut(&id) {
            *n -= 1;
        }
        response
    }

    /// Everything it got so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// The requests of event `id`.
    pub fn hits_of(&self, id: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.id == id).collect()
    }

    /// Waits until `done(hits)` holds (or fails after `within`).
    pub async fn wait_for(&self, within: Duration, what: &str, done: impl Fn(&[Hit]) -> bool) -> Vec<Hit> {
        let started = Instant::now();
        loop {
            let hits = self.hits();
            if done(&hits) {
                return hits;
            }
            assert!(started.elapsed() < within, "{what}: not within {within:?}; got {} requests", hits.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
