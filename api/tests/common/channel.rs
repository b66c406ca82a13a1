//! A payment channel written for the tests from `contracts/channel.md` alone (not onceflow's mock): served over
//! HTTP on a loopback port, with a ledger the tests judge by. Two ways to misbehave on purpose: `hold` keeps a
//! new charge request in flight before recording it, `mixed` keeps no merchants apart (as a channel
//! predating merchant ids would), answering one merchant's number with another's charge, and `busy` refuses a
//! charge request while another one under the same number is in flight (`409`, as some channels do); `closeless`
//! answers `404` to a close, as a channel predating it would.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

/// One charge as the channel keeps it.
#[derive(Debug, Clone)]
pub struct Kept {
    pub merchant_id: String,
    pub merchant_request_no: String,
    pub order_no: String,
    pub amount: i64,
    pub currency: String,
    pub charge_id: String,
    pub refunded: bool,
}

impl Kept {
    fn body(&self) -> Value {
        json!({
            "merchant_id": self.merchant_id, "merchant_request_no": self.merchant_request_no,
            "charge_id": self.charge_id, "status": "succeeded", "amount": self.amount,
            "currency": self.currency, "order_no": self.order_no,
        })
    }
}

#[derive(Default)]
struct Book {
    charges: HashMap<(String, String), Kept>,
    closed: HashSet<(String, String)>,
    refunds: HashMap<(String, String), Value>,
    in_flight: HashSet<(String, String)>,
    next: u64,
    closes: u64,
}

/// The channel: cheap to clone, clones share the ledger.
#[derive(Clone)]
pub struct TestChannel {
    book: Arc<Mutex<Book>>,
    hold: Duration,
    mixed: bool,
    busy: bool,
    closeless: bool,
    pub url: String,
}

impl TestChannel {
    /// Serves a channel on a loopback port.
    pub async fn serve(hold: Duration, mixed: bool) -> Self {
        Self::serve_with(hold, mixed, false, false).await
    }

    /// Serves a channel that refuses a charge request while another one under its number is in flight.
    pub async fn serve_busy(hold: Duration) -> Self {
        Self::serve_with(hold, false, true, false).await
    }

    /// Serves a channel without close (`404`).
    pub async fn serve_closeless(hold: Duration) -> Self {
        Self::serve_with(hold, false, false, true).await
    }

    async fn serve_with(hold: Duration, mixed: bool, busy: bool, closeless: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let channel = Self { book: Arc::default(), hold, mixed, busy, closeless, url };
        let app = Router::new()
            .route("/v1/charges", post(charge))
            .route("/v1/charges/{no}", get(query))
            .route("/v1/charges/{no}/close", post(close))
            .route("/v1/refunds", post(refund))
            .with_state(channel.clone());
        tokio::spawn(axum::serve(listener, app).into_future());
        channel
    }

    /// Every charge, in its current state.
    pub fn charges(&self) -> Vec<Kept> {
        let mut all: Vec<Kept> = self.book.lock().unwrap().charges.values().cloned().collect();
        all.sort_by(|a, b| (&a.merchant_id, &a.merchant_request_no).cmp(&(&b.merchant_id, &b.merchant_request_no)));
        all
    }

    /// Succeeded, unrefunded charges of `merchant_id`'s order `order_no` (any merchant's if it sent none).
    pub fn kept(&self, merchant_id: &str, order_no: &str) -> usize {
        self.charges()
            .iter()
            .filter(|c| (c.merchant_id == merchant_id || c.merchant_id.is_empty()) && c.order_no == order_no)
            .filter(|c| !c.refunded)
            .count()
    }

    /// Closes received.
    pub fn closes(&self) -> u64 {
        self.book.lock().unwrap().closes
    }

    fn key(&self, merchant_id: &str, no: &str) -> (String, String) {
        (if self.mixed { String::new() } else { merchant_id.to_owned() }, no.to_owned())
    }
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_owned()
}

fn answer(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap(), Json(body)).into_response()
}

async fn charge(State(c): State<TestChannel>, Json(req): Json<Value>) -> Response {
    let key = c.key(&text(&req, "merchant_id"), &text(&req, "merchant_request_no"));
    let fresh = {
        let mut book = c.book.lock().unwrap();
        if c.busy && !book.in_flight.insert(key.clone()) {
            return answer(409, json!({"error": "in_progress"}));
        }
        !book.charges.contains_key(&key)
    };
    if fresh && !c.hold.is_zero() {
        tokio::time::sleep(c.hold).await;
    }
    let mut book = c.book.lock().unwrap();
    book.in_flight.remove(&key);
    if let Some(kept) = book.charges.get(&key) {
        let same = kept.order_no == text(&req, "order_no")
            && Some(kept.amount) == req["amount"].as_i64()
            && kept.currency == text(&req, "currency")
            && (c.mixed || kept.merchant_id == text(&req, "merchant_id"));
        return if same { answer(200, kept.body()) } else { answer(409, json!({"error": "conflict"})) };
    }
    if book.closed.contains(&key) {
        return answer(409, json!({"error": "closed"}));
    }
    book.next += 1;
    let kept = Kept {
        merchant_id: text(&req, "merchant_id"),
        merchant_request_no: text(&req, "merchant_request_no"),
        order_no: text(&req, "order_no"),
        amount: req["amount"].as_i64().unwrap_or(0),
        currency: text(&req, "currency"),
        charge_id: format!("tc_{}", book.next),
        refunded: false,
    };
    let body = kept.body();
    book.charges.insert(key, kept);
    answer(200, body)
}

async fn query(
    State(c): State<TestChannel>,
    Path(no): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = c.key(q.get("merchant_id").map_or("", String::as_str), &no);
    match c.book.lock().unwrap().charges.get(&key) {
        Some(kept) => answer(200, kept.body()),
        None => answer(404, json!({"error": "not_found"})),
    }
}

async fn close(State(c): State<TestChannel>, Path(no): Path<String>, Json(req): Json<Value>) -> Response {
    if c.closeless {
        return answer(404, json!({"error": "not_found"}));
    }
    let key = c.key(&text(&req, "merchant_id"), &no);
    let mut book = c.book.lock().unwrap();
    book.closes += 1;
    if let Some(kept) = book.charges.get(&key) {
        return answer(409, json!({"error": "charged", "charge": kept.body()}));
    }
    book.closed.insert(key);
    answer(200, json!({"merchant_request_no": no, "status": "closed"}))
}

async fn refund(State(c): State<TestChannel>, Json(req): Json<Value>) -> Response {
    let refund_key = c.key(&text(&req, "merchant_id"), &text(&req, "merchant_refund_no"));
    let charge_key = c.key(&text(&req, "merchant_id"), &text(&req, "merchant_request_no"));
    let mut book = c.book.lock().unwrap();
    if let Some(done) = book.refunds.get(&refund_key) {
        return answer(200, done.clone());
    }
    let Some(kept) = book.charges.get_mut(&charge_key) else {
        return answer(422, json!({"error": "no such charge"}));
    };
    kept.refunded = true;
    let done = json!({"merchant_refund_no": text(&req, "merchant_refund_no"), "refund_id": format!("tr_{}", kept.charge_id), "status": "succeeded"});
    book.refunds.insert(refund_key, done.clone());
    answer(200, done)
}
