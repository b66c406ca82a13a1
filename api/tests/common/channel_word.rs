//! The channel's own word, for the independent test channel (`channel.rs`), written from `contracts/channel.md`
//! alone: statements the test scripts (given lines, repeats and all, complete or not, `404`, or a body that
//! breaks off), and notifications sent now, signed with any secret at any time, or tampered with after signing.
//! Kept apart from the channel's charges and refunds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::channel::TestChannel;

/// How a scripted statement is served.
#[derive(Debug, Clone)]
pub enum Served {
    /// `200`, these lines (in this order, repeats and all), `Statement-Complete` as given.
    Lines { lines: Vec<Value>, complete: bool },
    /// `200`, then the connection breaks off after `after` lines (the channel going down mid-statement).
    BreaksOff { lines: Vec<Value>, after: usize },
}

/// The statements the channel serves, per (merchant, day); a day not scripted is `404`.
#[derive(Clone, Default)]
pub struct Statements(Arc<Mutex<HashMap<(String, String), Served>>>);

impl Statements {
    /// Serves `served` as `merchant_id`'s statement of `day` (`YYYY-MM-DD`).
    pub fn set(&self, merchant_id: &str, day: &str, served: Served) {
        self.0.lock().unwrap().insert((merchant_id.to_owned(), day.to_owned()), served);
    }

    /// `merchant_id`'s `day` is `404` again.
    pub fn remove(&self, merchant_id: &str, day: &str) {
        self.0.lock().unwrap().remove(&(merchant_id.to_owned(), day.to_owned()));
    }
}

/// A charge line of a statement.
pub fn charge_line(no: &str, order_no: &str, amount: i64, status: &str, settled_at: &str) -> Value {
    json!({"kind": "charge", "merchant_request_no": no, "charge_id": format!("tc_{no}"), "order_no": order_no,
        "amount": amount, "currency": "CNY", "status": status, "settled_at": settled_at})
}

/// A refund line of a statement.
pub fn refund_line(refund_no: &str, charge_no: &str, amount: i64, status: &str, settled_at: &str) -> Value {
    json!({"kind": "refund", "merchant_refund_no": refund_no, "merchant_request_no": charge_no,
        "refund_id": format!("tr_{refund_no}"), "amount": amount, "status": status, "settled_at": settled_at})
}

/// `GET /v1/statements/{date}?merchant_id=`, as scripted.
pub async fn statement(
    State(c): State<TestChannel>,
    Path(date): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let merchant = q.get("merchant_id").cloned().unwrap_or_default();
    let served = c.statements.0.lock().unwrap().get(&(merchant, date)).cloned();
    let ndjson = |lines: &[Value]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    match served {
        None => (axum::http::StatusCode::NOT_FOUND, axum::Json(json!({"error": "not_found"}))).into_response(),
        Some(Served::Lines { lines, complete }) => (
            [("content-type", "application/x-ndjson"), ("statement-complete", if complete { "true" } else { "false" })],
            ndjson(&lines),
        )
            .into_response(),
        Some(Served::BreaksOff { lines, after }) => {
            let head = ndjson(&lines[..after.min(lines.len())]);
            let chunks = futures_util::stream::iter(vec![
                Ok::<_, std::io::Error>(head.into_bytes()),
                Err(std::io::Error::other("the channel went down")),
            ]);
            (
                [("content-type", "application/x-ndjson"), ("statement-complete", "true")],
                axum::body::Body::from_stream(chunks),
            )
                .into_response()
        }
    }
}

/// A notification's body.
pub fn notification(id: &str, kind: &str, merchant_id: &str, data: Value) -> Value {
    json!({"id": id, "type": kind, "created_at": "2026-01-01T00:00:00Z", "merchant_id": merchant_id, "data": data})
}

/// The `Channel-Signature` of `body` at `t` with each of `secrets`: `t=…,v1=hex(HMAC-SHA256(secret, "t.body"))`,
/// computed here with the crates the protocol names, not with onceflow's code.
pub fn sign(body: &[u8], t: i64, secrets: &[&str]) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut header = format!("t={t}");
    for secret in secrets {
        let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        header.push_str(&format!(",v1={hex}"));
    }
    header
}

/// Now, in unix seconds.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Sends `body` to `base`'s notification endpoint with `signature` (none when `None`): the status and body.
pub async fn send(base: &str, body: &[u8], signature: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/channel/notifications"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(signature) = signature {
        req = req.header("channel-signature", signature);
    }
    let r = req.send().await.expect("notification sent");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// The whole API on `url` charging `channel`, taking notifications signed with `accounts`' secrets, its engine's
/// background loop running.
pub async fn start_with_accounts(
    url: &str,
    channel: Arc<dyn onceflow_payments::Channel>,
    auth: onceflow_api::Auth,
    accounts: onceflow_payments::ChannelAccounts,
) -> super::App {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    start_on(listener, url, channel, auth, accounts).await;
    super::App { base, client: reqwest::Client::new(), key: None }
}

/// [`start_with_accounts`] on a listener the caller bound (to know its address before the channel is made).
pub async fn start_on(
    listener: tokio::net::TcpListener,
    url: &str,
    channel: Arc<dyn onceflow_payments::Channel>,
    auth: onceflow_api::Auth,
    accounts: onceflow_payments::ChannelAccounts,
) {
    struct Routed(onceflow_api::Auth, onceflow_payments::ChannelAccounts);
    impl onceflow_api::OnPayments for Routed {
        type Output = axum::Router;
        async fn run<S: onceflow_payments::PaymentStore>(
            self,
            payments: onceflow_payments::Payments<S>,
        ) -> axum::Router {
            payments.engine().spawn_background();
            onceflow_payments::spawn_word_delivery(payments.engine().clone(), std::time::Duration::from_secs(1));
            let wait = std::time::Duration::from_secs(10);
            let state =
                onceflow_api::AppState { payments, auth: self.0, wait, body_read_timeout: wait, mock_channel: false };
            onceflow_api::app(state).layer(axum::Extension(Arc::new(self.1)))
        }
    }
    let config = onceflow_engine::EngineConfig::default();
    let app = onceflow_api::with_payments(url, channel, config, 16, Routed(auth, accounts)).await.expect("database");
    tokio::spawn(axum::serve(listener, app).into_future());
}
