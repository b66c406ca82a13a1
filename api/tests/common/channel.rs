//! A payment channel written for the tests from `contracts/channel.md` alone (not onceflow's mock): served over
//! HTTP on a loopback port, with a ledger the tests judge by. Two ways to misbehave on purpose: `hold` keeps a
//! new charge request in flight before recording it, `mixed` keeps no merchants apart (as a channel
//! predating merchant ids would), answering one merchant's number with another's charge, and `busy` refuses a
//! charge request while another one under the same number is in flight (`409`, as some channels do); `closeless`
//! answers `404` to a close, as a channel predating it would. Refunds may be partial; how a new refund is
//! answered is set with [`TestChannel::set_refund_mode`] (succeed, fail, refuse, stay processing, lose the reply,
//! refund only half); a new charge may be held `processing` until [`TestChannel::settle_charges`]
//! ([`TestChannel::set_charge_mode`]). Its queries and closes may lag behind its charges
//! ([`TestChannel::set_query_lag`]): a charge is then answered `processing` whatever it became, so that only the
//! channel's notification can tell that it settled.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether a succeeded refund of it exists.
    pub refunded: bool,
    /// What its succeeded refunds add up to.
    pub refunded_amount: i64,
    /// `succeeded`, `processing` or `declined`.
    pub status: &'static str,
}

/// How the channel answers a new refund request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefundMode {
    /// `succeeded` at once.
    #[default]
    Succeed,
    /// `failed` at once: nothing refunded.
    Fail,
    /// `422`: refused, nothing recorded.
    Refuse,
    /// `processing` until [`TestChannel::settle_refunds`].
    Processing,
    /// Refunded (`succeeded`), but answered `500`: the reply is lost.
    LoseReply,
    /// Only half of what was asked is refunded, and the answer says so (`succeeded`, half the amount): a
    /// channel whose answer does not match the request.
    Half,
    /// As [`RefundMode::LoseReply`], and the charge's balance is checked before the number: the same request
    /// again is refused `409 exceeds_charge` when the refund it repeats took the balance (a channel may check
    /// in that order; a refusal then says nothing of the number).
    LoseReplyBalanceFirst,
}

/// How the channel answers a new charge request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChargeMode {
    /// `succeeded` at once.
    #[default]
    Succeed,
    /// `processing` until [`TestChannel::settle_charges`].
    Processing,
}

impl Kept {
    fn body(&self) -> Value {
        json!({
            "merchant_id": self.merchant_id, "merchant_request_no": self.merchant_request_no,
            "charge_id": self.charge_id, "status": self.status, "amount": self.amount,
            "currency": self.currency, "order_no": self.order_no,
        })
    }
}

#[derive(Default)]
struct Book {
    charges: HashMap<(String, String), Kept>,
    closed: HashSet<(String, String)>,
    refunds: HashMap<(String, String), Value>,
    refund_mode: RefundMode,
    refund_hold: Duration,
    charge_mode: ChargeMode,
    in_flight: HashSet<(String, String)>,
    next: u64,
    closes: u64,
    /// The `traceparent` header of every request that carried one, in the order they came.
    traceparents: Vec<String>,
    refund_calls: u64,
    charge_calls: u64,
}

/// The channel: cheap to clone, clones share the ledger.
#[derive(Clone)]
pub struct TestChannel {
    book: Arc<Mutex<Book>>,
    hold: Duration,
    mixed: bool,
    busy: bool,
    closeless: Arc<AtomicBool>,
    query_lag: Arc<AtomicBool>,
    pub url: String,
    /// The statements it serves (`channel_word.rs`).
    pub statements: super::channel_word::Statements,
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
        let statements = super::channel_word::Statements::default();
        let closeless = Arc::new(AtomicBool::new(closeless));
        let query_lag = Arc::default();
        let channel = Self { book: Arc::default(), hold, mixed, busy, closeless, query_lag, url, statements };
        let app = Router::new()
            .route("/v1/charges", post(charge))
            .route("/v1/charges/{no}", get(query))
            .route("/v1/charges/{no}/close", post(close))
            .route("/v1/refunds", post(refund))
            .route("/v1/refunds/{no}", get(query_refund))
            .route("/v1/statements/{date}", get(super::channel_word::statement))
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
            .filter(|c| c.status == "succeeded" && c.refunded_amount < c.amount)
            .count()
    }

    /// From now on, new refund requests are answered as `mode` says.
    pub fn set_refund_mode(&self, mode: RefundMode) {
        self.book.lock().unwrap().refund_mode = mode;
    }

    /// From now on, every refund reply is held this long after the refund is recorded (a reply in flight when the
    /// asker dies).
    pub fn set_refund_hold(&self, hold: Duration) {
        self.book.lock().unwrap().refund_hold = hold;
    }

    /// From now on, new charges are answered as `mode` says.
    pub fn set_charge_mode(&self, mode: ChargeMode) {
        self.book.lock().unwrap().charge_mode = mode;
    }

    /// Settles every `processing` charge as `status` (`succeeded` or `declined`).
    pub fn settle_charges(&self, status: &'static str) {
        let mut book = self.book.lock().unwrap();
        for charge in book.charges.values_mut().filter(|c| c.status == "processing") {
            charge.status = status;
        }
    }

    /// Every refund, as the channel answers for it now.
    pub fn refunds(&self) -> Vec<Value> {
        let mut all: Vec<Value> = self.book.lock().unwrap().refunds.values().cloned().collect();
        all.sort_by_key(|r| text(r, "merchant_refund_no"));
        all
    }

    /// Settles every `processing` refund as `status` (`succeeded` or `failed`).
    pub fn settle_refunds(&self, status: &str) {
        let mut book = self.book.lock().unwrap();
        let book = &mut *book;
        for refund in book.refunds.values_mut().filter(|r| r["status"] == "processing") {
            refund["status"] = json!(status);
            if status == "succeeded" {
                let key = (text(refund, "merchant_id"), text(refund, "merchant_request_no"));
                let key = if self.mixed { (String::new(), key.1) } else { key };
                if let Some(kept) = book.charges.get_mut(&key) {
                    kept.refunded = true;
                    kept.refunded_amount += refund["amount"].as_i64().unwrap_or(0);
                }
            }
        }
    }

    /// The `traceparent` headers received, in order.
    pub fn traceparents(&self) -> Vec<String> {
        self.book.lock().unwrap().traceparents.clone()
    }

    /// The channel's ledger in the shape the invariants judge by (`onceflow_payments::check_invariants`).
    pub fn ledger(&self) -> onceflow_payments::Ledger {
        let status = |s: &str| match s {
            "succeeded" => onceflow_payments::ChargeStatus::Succeeded,
            "declined" => onceflow_payments::ChargeStatus::Declined,
            _ => onceflow_payments::ChargeStatus::Processing,
        };
        let charges = self
            .charges()
            .into_iter()
            .map(|c| onceflow_payments::LedgerCharge {
                merchant_id: c.merchant_id,
                merchant_request_no: c.merchant_request_no,
                order_no: c.order_no,
                amount: c.amount,
                status: status(c.status),
                refunded: c.refunded,
                refunded_amount: c.refunded_amount,
            })
            .collect();
        let refunds = self.refunds().into_iter().filter_map(|r| serde_json::from_value(r).ok()).collect();
        onceflow_payments::Ledger { charges, refunds, refund_calls: self.refund_calls(), ..Default::default() }
    }

    /// From now on, whether close is answered `404` (as by a channel predating it).
    pub fn set_closeless(&self, closeless: bool) {
        self.closeless.store(closeless, Ordering::SeqCst);
    }

    /// From now on, whether queries and closes answer every charge `processing`, whatever it became (a channel
    /// whose queries lag behind its settlements).
    pub fn set_query_lag(&self, lag: bool) {
        self.query_lag.store(lag, Ordering::SeqCst);
    }

    /// A charge as a query or close answers it now.
    fn as_queried(&self, kept: &Kept) -> Value {
        let mut body = kept.body();
        if self.query_lag.load(Ordering::SeqCst) {
            body["status"] = json!("processing");
        }
        body
    }

    /// Closes received.
    pub fn closes(&self) -> u64 {
        self.book.lock().unwrap().closes
    }

    /// Refund requests received (repeats included).
    pub fn refund_calls(&self) -> u64 {
        self.book.lock().unwrap().refund_calls
    }

    /// Charge requests received (repeats included).
    pub fn charge_calls(&self) -> u64 {
        self.book.lock().unwrap().charge_calls
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

async fn charge(State(c): State<TestChannel>, headers: axum::http::HeaderMap, Json(req): Json<Value>) -> Response {
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        c.book.lock().unwrap().traceparents.push(tp.to_owned());
    }
    let key = c.key(&text(&req, "merchant_id"), &text(&req, "merchant_request_no"));
    let fresh = {
        let mut book = c.book.lock().unwrap();
        book.charge_calls += 1;
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
        refunded_amount: 0,
        status: if book.charge_mode == ChargeMode::Processing { "processing" } else { "succeeded" },
    };
    let body = kept.body();
    book.charges.insert(key, kept);
    answer(200, body)
}

async fn query(
    State(c): State<TestChannel>,
    Path(no): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        c.book.lock().unwrap().traceparents.push(tp.to_owned());
    }
    let key = c.key(q.get("merchant_id").map_or("", String::as_str), &no);
    match c.book.lock().unwrap().charges.get(&key) {
        Some(kept) => answer(200, c.as_queried(kept)),
        None => answer(404, json!({"error": "not_found"})),
    }
}

async fn query_refund(
    State(c): State<TestChannel>,
    Path(no): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = c.key(q.get("merchant_id").map_or("", String::as_str), &no);
    match c.book.lock().unwrap().refunds.get(&key) {
        Some(done) => answer(200, done.clone()),
        None => answer(404, json!({"error": "not_found"})),
    }
}

async fn close(State(c): State<TestChannel>, Path(no): Path<String>, Json(req): Json<Value>) -> Response {
    if c.closeless.load(Ordering::SeqCst) {
        return answer(404, json!({"error": "not_found"}));
    }
    let key = c.key(&text(&req, "merchant_id"), &no);
    let mut book = c.book.lock().unwrap();
    book.closes += 1;
    if let Some(kept) = book.charges.get(&key) {
        return answer(409, json!({"error": "charged", "charge": c.as_queried(kept)}));
    }
    book.closed.insert(key);
    answer(200, json!({"merchant_request_no": no, "status": "closed"}))
}

async fn refund(State(c): State<TestChannel>, Json(req): Json<Value>) -> Response {
    let (answer, hold) = refund_recorded(&c, &req);
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    answer
}

/// A refund request's answer, recorded, and how long to hold the reply.
fn refund_recorded(c: &TestChannel, req: &Value) -> (Response, Duration) {
    let hold = c.book.lock().unwrap().refund_hold;
    (refund_answer(c, req), hold)
}

fn refund_answer(c: &TestChannel, req: &Value) -> Response {
    let refund_key = c.key(&text(req, "merchant_id"), &text(req, "merchant_refund_no"));
    let charge_key = c.key(&text(req, "merchant_id"), &text(req, "merchant_request_no"));
    let amount = req["amount"].as_i64().unwrap_or(0);
    let mut book = c.book.lock().unwrap();
    book.refund_calls += 1;
    let mode = book.refund_mode;
    if mode == RefundMode::LoseReplyBalanceFirst
        && let Some(kept) = book.charges.get(&charge_key)
    {
        let taken: i64 = book
            .refunds
            .iter()
            .filter(|(k, r)| {
                k.0 == charge_key.0 && text(r, "merchant_request_no") == charge_key.1 && r["status"] != "failed"
            })
            .map(|(_, r)| r["amount"].as_i64().unwrap_or(0))
            .sum();
        if taken + amount > kept.amount {
            return answer(409, json!({"error": "exceeds_charge"}));
        }
    }
    if let Some(done) = book.refunds.get(&refund_key) {
        let same = done["merchant_request_no"] == req["merchant_request_no"] && done["amount"] == req["amount"];
        return if same { answer(200, done.clone()) } else { answer(409, json!({"error": "conflict"})) };
    }
    let Some(kept) = book.charges.get(&charge_key).filter(|c| c.status == "succeeded") else {
        return answer(409, json!({"error": "not_refundable"}));
    };
    let (charge_amount, charge_id) = (kept.amount, kept.charge_id.clone());
    let taken: i64 = book
        .refunds
        .iter()
        .filter(|(k, r)| {
            k.0 == charge_key.0 && text(r, "merchant_request_no") == charge_key.1 && r["status"] != "failed"
        })
        .map(|(_, r)| r["amount"].as_i64().unwrap_or(0))
        .sum();
    if amount <= 0 || taken + amount > charge_amount {
        return answer(409, json!({"error": "exceeds_charge"}));
    }
    if mode == RefundMode::Refuse {
        return answer(422, json!({"error": "refused"}));
    }
    let amount = if mode == RefundMode::Half { amount / 2 } else { amount };
    let status = match mode {
        RefundMode::Fail => "failed",
        RefundMode::Processing => "processing",
        _ => "succeeded",
    };
    book.next += 1;
    let done = json!({
        "merchant_id": text(req, "merchant_id"), "merchant_refund_no": text(req, "merchant_refund_no"),
        "merchant_request_no": text(req, "merchant_request_no"), "refund_id": format!("tr_{}_{}", charge_id, book.next),
        "amount": amount, "status": status,
    });
    if status == "succeeded" {
        let kept = book.charges.get_mut(&charge_key).unwrap();
        kept.refunded = true;
        kept.refunded_amount += amount;
    }
    book.refunds.insert(refund_key, done.clone());
    if matches!(mode, RefundMode::LoseReply | RefundMode::LoseReplyBalanceFirst) {
        return answer(500, json!({"error": "internal"}));
    }
    answer(200, done)
}
