//! Starting the real application on port 0 against a fresh database, and a small HTTP client.

#![allow(dead_code)]

pub mod channel;
pub mod channel_word;
pub mod mq;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use onceflow_api::{AppState, Auth, OnPayments, app, with_payments};
use onceflow_engine::EngineConfig;
use onceflow_payments::{Channel, MockChannel, PaymentStore, Payments};
use reqwest::{Client, Method, Response};
use serde_json::Value;

/// A fresh database URL on the backend: `sqlite`, `postgres` or `mysql` (`None` when that server is not
/// configured).
pub async fn database(backend: &str) -> Option<String> {
    match backend {
        "sqlite" => {
            let path = std::env::temp_dir().join(format!("onceflow-http-{}.db", uuid::Uuid::new_v4()));
            Some(format!("sqlite://{}", path.display()))
        }
        "mysql" => onceflow_tests::mysql_url().await.expect("mysql"),
        _ => onceflow_tests::pg_url().await.expect("postgres"),
    }
}

/// A running app.
pub struct App {
    pub base: String,
    pub client: Client,
    pub key: Option<String>,
}

pub async fn start(url: &str, channel: Arc<dyn Channel>, auth: Auth) -> App {
    let app = with_payments(url, channel, EngineConfig::default(), 16, Router(auth)).await.expect("database");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, app).into_future());
    App { base, client: Client::new(), key: None }
}

/// The whole API on the service, its engine's background loop running.
struct Router(Auth);

impl OnPayments for Router {
    type Output = axum::Router;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> axum::Router {
        payments.engine().spawn_background();
        let wait = Duration::from_secs(10);
        app(AppState { payments, auth: self.0, wait, body_read_timeout: wait, mock_channel: false })
    }
}

/// Creates `n` orders `O-0…` of 1000 CNY for tenant `default` on the database `url`.
pub async fn create_orders(url: &str, n: usize) {
    struct Orders(usize);
    impl OnPayments for Orders {
        type Output = ();
        async fn run<S: PaymentStore>(self, payments: Payments<S>) {
            let cny = onceflow_payments::Currency::parse("CNY").unwrap();
            for i in 0..self.0 {
                let order_no = onceflow_payments::OrderNo::parse(format!("O-{i}")).unwrap();
                payments.create_order("default", &order_no, 1000, &cny).await.unwrap();
            }
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Orders(n)).await.expect("database");
}

/// The money invariants (`check_invariants`) of the database `url` against `ledger`.
pub async fn invariants(url: &str, ledger: onceflow_payments::Ledger) -> Vec<onceflow_payments::Violation> {
    struct Check(onceflow_payments::Ledger);
    impl OnPayments for Check {
        type Output = Vec<onceflow_payments::Violation>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
            onceflow_payments::check_invariants(payments.engine().store(), &self.0).await.unwrap()
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Check(ledger)).await.expect("database")
}

pub async fn start_reliable(url: &str) -> (App, MockChannel) {
    let channel = MockChannel::reliable();
    (start(url, Arc::new(channel.clone()), Auth::SingleTenant).await, channel)
}

/// A response's status, headers and JSON body.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    }

    /// Asserts the problem+json shape of an error.
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.header("content-type").as_deref(), Some("application/problem+json"), "{}", self.text);
        let body = self.json();
        assert_eq!(body["code"], code, "{}", self.text);
        assert_eq!(body["status"], status);
        assert!(body["title"].is_string() && body["type"].is_string() && body["detail"].is_string());
    }
}

impl App {
    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    pub async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Option<Value>) -> Answer {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            req = req.bearer_auth(key);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        into_answer(req.send().await.expect("request")).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(Method::POST, path, &[], Some(body)).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, &[], None).await
    }

    pub async fn token_answer(&self) -> Answer {
        self.send(Method::POST, "/v1/tokens", &[], None).await
    }

    pub async fn token(&self) -> String {
        let a = self.send(Method::POST, "/v1/tokens", &[], None).await;
        assert_eq!(a.status, 201, "{}", a.text);
        a.json()["token"].as_str().unwrap().to_owned()
    }

    pub async fn order(&self, order_no: &str, amount: i64) {
        let a = self
            .post("/v1/orders", serde_json::json!({"order_no": order_no, "amount": amount, "currency": "CNY"}))
            .await;
        assert!(a.status == 201 || a.status == 200, "{}", a.text);
    }

    pub async fn pay(&self, token: &str, body: Value) -> Answer {
        self.send(Method::POST, "/v1/payments", &[("idempotency-key", token)], Some(body)).await
    }

    /// `POST /v1/payments/{request_no}/refunds` under `token`.
    pub async fn refund(&self, token: &str, request_no: &str, body: Value) -> Answer {
        let path = format!("/v1/payments/{request_no}/refunds");
        self.send(Method::POST, &path, &[("idempotency-key", token)], Some(body)).await
    }
}

pub async fn into_answer(r: Response) -> Answer {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    Answer { status, headers, text }
}
