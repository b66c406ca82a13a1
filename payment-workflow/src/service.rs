//! The payment service: orders, tokens, paying with three layers against duplicates, and reading payments.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::clock::{Clock, SystemClock};
use onceflow_engine::{Engine, EngineConfig, Outcome};

use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::model::{
    Currency, Order, OrderNo, OrderStatus, PaymentBody, PaymentRecord, PaymentRequest, PaymentStatus, Problem,
    RequestNo, StoredResponse, Token, TokenRecord, TokenState, hex_sha256, positive_amount,
};
use crate::retention::{Retention, millis};
use crate::saga::{PaymentInput, PaymentSaga};
use crate::store::PaymentStore;

/// How long an unused token lives by default (`--token-ttl`; see [`Retention`]).
pub const TOKEN_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The id of the workflow paying under `token`: derived from it, so repeats find it, without revealing it.
pub fn payment_workflow_id(token: &Token) -> String {
    format!("pay:{}", &hex_sha256(token.as_str().as_bytes())[..32])
}

/// A newly issued idempotency token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IssuedToken {
    /// The token: 256 random bits, hex.
    pub token: Token,
    /// When it expires if unused (ms since the epoch).
    pub expires_at: i64,
}

/// The answer to a payment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body, byte for byte as first sent when replayed.
    pub body: String,
    /// Whether this repeats a response given before (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// `Location` of the payment, on `202`.
    pub location: Option<String>,
}

impl PayResponse {
    fn fresh(r: StoredResponse) -> Self {
        Self { status: r.status, body: r.body, replayed: false, location: None }
    }

    fn problem(status: u16, code: &str, title: &str, detail: &str) -> Self {
        Self::fresh(Problem::new(status, code, title, detail).response())
    }
}

/// The payment service over a store and a channel. Cheap to clone.
pub struct Payments<S: PaymentStore> {
    engine: Engine<S>,
    retention: Retention,
}

impl<S: PaymentStore> Clone for Payments<S> {
    fn clone(&self) -> Self {
        Self { engine: self.engine.clone(), retention: self.retention }
    }
}

impl<S: PaymentStore> Payments<S> {
    /// The service, with its engine (the payment saga registered). Start the engine's background loop with
    /// `payments.engine().spawn_background()`.
    pub fn new(store: S, channel: Arc<dyn Channel>, config: EngineConfig) -> Self {
        Self::with_clock(store, channel, config, SystemClock)
    }

    /// [`Payments::new`] on `clock` (tests: a manual clock), by which tokens are issued and expire, payments
    /// end and retention passes measure ages.
    pub fn with_clock(store: S, channel: Arc<dyn Channel>, config: EngineConfig, clock: impl Clock) -> Self {
        let engine = Engine::builder(store).register(PaymentSaga::new(channel)).config(config).clock(clock).build();
        Self { engine, retention: Retention::default() }
    }

    /// This service with `retention` (the token ttl, and what its retention passes keep).
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How long what is kept, is kept.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// The engine running the payment workflows.
    pub fn engine(&self) -> &Engine<S> {
        &self.engine
    }

    fn token_ttl(&self) -> i64 {
        millis(self.retention.token_ttl)
    }

    /// Whether `token` was never used and has expired: as good as gone (a pass deletes it).
    fn expired_unused(&self, token: &TokenRecord) -> bool {
        token.state == TokenState::Issued && token.expires_at <= self.now()
    }

    fn store(&self) -> &S {
        self.engine.store()
    }

    fn now(&self) -> i64 {
        self.engine.now_ms()
    }

    /// Creates an order; the same `order_no` with the same fields returns the existing one (`created` false),
    /// with other fields it is [`Error::OrderConflict`].
    pub async fn create_order(
        &self,
        tenant: &str,
        order_no: &OrderNo,
        amount: i64,
        currency: &Currency,
    ) -> Result<(Order, bool)> {
        let amount = positive_amount(amount)?;
        let now = self.now();
        let order = Order {
            tenant: tenant.to_owned(),
            order_no: order_no.clone(),
            amount,
            currency: currency.clone(),
            status: OrderStatus::Pending,
            version: 0,
            created_at: now,
            updated_at: now,
        };
        let created = self.store().insert_order(&order).await?;
        let existing = self
            .store()
            .order(tenant, order_no)
            .await?
            .ok_or_else(|| Error::Unavailable("the order vanished after its insert"))?;
        if !created && (existing.amount != amount || existing.currency != *currency) {
            return Err(Error::OrderConflict(order_no.clone()));
        }
        Ok((existing, created))
    }

    /// One order of the tenant.
    pub async fn order(&self, tenant: &str, order_no: &OrderNo) -> Result<Option<Order>> {
        Ok(self.store().order(tenant, order_no).await?)
    }

    /// One payment of the tenant.
    pub async fn payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Option<PaymentRecord>> {
        Ok(self.store().payment(tenant, request_no).await?)
    }

    /// Every payment (each attempt) of the tenant's order, newest first.
    pub async fn payments_of_order(&self, tenant: &str, order_no: &OrderNo) -> Result<Vec<PaymentRecord>> {
        Ok(self.store().payments_of_order(tenant, order_no).await?)
    }

    /// Issues an idempotency token for the tenant.
    pub async fn issue_token(&self, tenant: &str) -> Result<IssuedToken> {
        let token = Token::issue();
        let record = unused_token(tenant, &token, self.now(), self.token_ttl());
        self.store().insert_token(&record).await?;
        Ok(IssuedToken { token, expires_at: record.expires_at })
    }

    /// Pays an order under an idempotency token used on `route`. Waits up to `wait` for the final answer, then
    /// answers `202`. Concurrent and later repeats get the first final response; another request under the
    /// same token gets `422`.
    ///
    /// The payment starts at once: its first phase refuses a start whose token it cannot claim or whose order
    /// does not exist, recording nothing, and only then is the token read (a repeat, a mismatch, an unknown
    /// token or order). A fresh payment costs no read before its first commit.
    pub async fn pay(
        &self,
        tenant: &str,
        token: &Token,
        route: &str,
        request: &PaymentRequest,
        wait: Duration,
    ) -> Result<PayResponse> {
        let input = payment_input(tenant, token, route, request);
        match self.run(&input, wait, false).await {
            // Refused (nothing was recorded), attached to a run that was, or the token's workflow runs another
            // request (perhaps another tenant's: only the token says whose): decide from the token.
            Err(
                onceflow_engine::Error::Refused(_)
                | onceflow_engine::Error::NotFound(_)
                | onceflow_engine::Error::Conflict { .. },
            ) => {}
            // Attached to a workflow recorded before, perhaps ended long ago: a history is kept longer than a
            // response, so the token decides whether there is still an answer to replay (past the response
            // retention there is not). Not so for an outcome announced by a run of this process (a storm of
            // repeats that joined the run): it ended after the request, so no retention can have passed since.
            Ok((response, ended_after_start)) if response.replayed && !ended_after_start => {
                return Ok(match self.store().token_and_order(token, tenant, request.order_no()).await? {
                    Some(_) => response,
                    None => not_found(),
                });
            }
            other => return Ok(other?.0),
        }
        let Some((stored, order_exists)) = self.store().token_and_order(token, tenant, request.order_no()).await?
        else {
            return Ok(not_found());
        };
        if stored.tenant != tenant {
            return Ok(not_found());
        }
        let bound = |f: &Option<String>, r: &Option<String>| {
            f.as_deref() == Some(&input.fingerprint) && r.as_deref() == Some(route)
        };
        match stored.state {
            TokenState::Completed => {
                if !bound(&stored.fingerprint, &stored.route) {
                    return Ok(mismatch());
                }
                return Ok(PayResponse {
                    status: u16::try_from(stored.response_status.unwrap_or(500)).unwrap_or(500),
                    body: stored.response_body.unwrap_or_default(),
                    replayed: true,
                    location: None,
                });
            }
            TokenState::InUse if !bound(&stored.fingerprint, &stored.route) => {
                return Ok(mismatch());
            }
            _ if self.expired_unused(&stored) => return Ok(not_found()),
            _ => {}
        }
        // The order must exist before anything is bound to the token: an unknown order is not stored.
        if !order_exists {
            let detail = format!("order {} does not exist", request.order_no());
            return Ok(PayResponse::problem(404, "order_not_found", "Order not found", &detail));
        }
        match self.run(&input, wait, stored.state != TokenState::Issued).await {
            Ok((response, _)) => Ok(response),
            // The tenant's token, whose workflow runs another request.
            Err(onceflow_engine::Error::Conflict { .. }) => Ok(mismatch()),
            // The token expired or was taken between the check and the first commit: nothing was stored.
            Err(onceflow_engine::Error::Refused(_)) => Ok(not_found()),
            // This request joined another's run of the same request, which stopped with nothing recorded: refused
            // like that (the token expired meanwhile), or stopped by a shutdown or a failing database, when the
            // token is still good and the request may be made again (503).
            Err(e @ onceflow_engine::Error::NotFound(_)) => {
                match self.store().token_and_order(token, tenant, request.order_no()).await? {
                    Some((t, _)) if !self.expired_unused(&t) => Err(e.into()),
                    _ => Ok(not_found()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts (or attaches to) the payment workflow of `input` and answers from its outcome, and whether that
    /// outcome came after the start ([`onceflow_engine::Handle::ended_after_start`]); a workflow of the
    /// token with another request is [`onceflow_engine::Error::Conflict`]. `replayed`: the token was already in
    /// use before this request.
    async fn run(
        &self,
        input: &PaymentInput,
        wait: Duration,
        replayed: bool,
    ) -> onceflow_engine::Result<(PayResponse, bool)> {
        let workflow_id = payment_workflow_id(&input.token);
        let handle = self.engine.start::<PaymentSaga>(&workflow_id, input).await?;
        let replayed = replayed || handle.attached();
        let outcome = handle.wait(wait).await?;
        let response = match outcome {
            Some(Outcome::Completed(value)) => {
                let response: StoredResponse = serde_json::from_value(value)?;
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            Some(Outcome::Failed(f) | Outcome::CompensationFailed(f) | Outcome::Cancelled(f)) => {
                let response = Problem::of_failure(&f).unwrap_or_else(crate::saga::payment_failed).response();
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            None => PayResponse {
                status: 202,
                body: input.payment_body(PaymentStatus::Processing, None).render(),
                replayed: false,
                location: Some(format!("/v1/payments/{}", input.request_no)),
            },
        };
        let (request_no, status) = (&input.request_no, response.status);
        tracing::info!(%workflow_id, %request_no, status, replayed, "payment answered");
        Ok((response, handle.ended_after_start()))
    }
}

/// The route a queued command's token is bound to (an HTTP token is bound to its path).
pub const COMMAND_ROUTE: &str = "amqp";

impl<S: PaymentStore> Payments<S> {
    /// Pays an order for a command from a queue (`contracts/mq.md`), where the tenant and `request_no` (required)
    /// are the payment's identity and there is no client token. Every delivery of one command meets the same
    /// token, derived from them ([`Token::of_command`]), hence the same workflow and the same answer, however
    /// often and concurrently it is delivered; other fields under the same `request_no` are `422`
    /// `idempotency_key_mismatch`. A `request_no` an HTTP payment of the tenant already used is that payment:
    /// its outcome, never a second charge. Invalid commands are `400` `invalid_request`, and nothing is stored.
    pub async fn pay_command(&self, tenant: &str, request: &PaymentRequest, wait: Duration) -> Result<PayResponse> {
        let Some(request_no) = request.request_no() else {
            return Ok(PayResponse::problem(400, "invalid_request", "Invalid request", "request_no is required"));
        };
        let token = Token::of_command(tenant, request_no);
        let now = self.now();
        let unused = unused_token(tenant, &token, now, self.token_ttl());
        // Ensured under the row's lock, which a retention pass deleting expired tokens may hold too (MySQL
        // deadlocks the two; either may be undone): tried again rather than sending the command back.
        crate::error::again_if_transient(|| async { Ok(self.store().ensure_token(&unused).await?) }).await?;
        let mut response = self.pay(tenant, &token, COMMAND_ROUTE, request, wait).await?;
        if problem_code(&response).as_deref() == Some("order_not_found") {
            // The number's own payment, past its retention, was for an order that exists: other fields.
            if self.payment(tenant, request_no).await?.is_some_and(|record| record.token == token) {
                return Ok(command_mismatch(request_no));
            }
            // Nothing was recorded, so over HTTP the token stays usable; a command's answer is kept instead, so
            // that a redelivery after the order appears answers the same bytes rather than paying. A payment
            // that claimed the token meanwhile is the answer.
            let stored = StoredResponse { status: response.status, body: response.body.clone() };
            let fingerprint = request.fingerprint();
            if !self.store().settle_unused_token(&token, &fingerprint, COMMAND_ROUTE, &stored, now).await? {
                response = self.pay(tenant, &token, COMMAND_ROUTE, request, wait).await?;
            }
        }
        match problem_code(&response).as_deref() {
            // The token is the command's own, so say so in the command's terms. Unless the command has the fields
            // of its own payment, whose answer and history were deleted (past their retention) and whose token,
            // made again, a command with other fields took first: the record still answers this one.
            Some("idempotency_key_mismatch") => match self.payment(tenant, request_no).await? {
                Some(record) if record.token == token && same_fields(&record, request) => {
                    Ok(answer_of_record(&record).unwrap_or_else(|| command_mismatch(request_no)))
                }
                _ => Ok(command_mismatch(request_no)),
            },
            // The number is another payment's (an HTTP one): that payment is the answer. Found here rather than
            // looked up before paying: a first delivery costs no read, and a command that meets an HTTP payment
            // only records its own refused attempt (no order reserved, nothing charged), which every later
            // delivery replays and answers from here the same way.
            Some("request_no_conflict") => match self.payment(tenant, request_no).await? {
                Some(record) if record.token != token => self.answer_of_payment(tenant, record, request, wait).await,
                // The command's own payment, and yet a conflict: its answer and its history were deleted (past
                // their retention), so this delivery started afresh and met its own record. With the record's
                // fields, what the record says, unless it failed: then the conflict stands (the record does not
                // hold a failure's answer, and it is also what a payment whose number the channel holds for
                // another answers). With other fields, 422.
                Some(record) if same_fields(&record, request) => Ok(answer_of_record(&record).unwrap_or(response)),
                Some(_) => Ok(command_mismatch(request_no)),
                None => Ok(response),
            },
            _ => Ok(response),
        }
    }

    /// The answer to a command whose `request_no` another payment (an HTTP one) already has: with the same
    /// fields, that payment's outcome — its token's stored response, waited for while it runs; with others,
    /// `422`.
    async fn answer_of_payment(
        &self,
        tenant: &str,
        record: PaymentRecord,
        request: &PaymentRequest,
        wait: Duration,
    ) -> Result<PayResponse> {
        if !same_fields(&record, request) {
            return Ok(command_mismatch(&record.request_no));
        }
        let stored = || async {
            let found = self.store().token_and_order(&record.token, tenant, &record.order_no).await?;
            Ok::<_, Error>(found.and_then(|(t, _)| {
                if t.state != TokenState::Completed || t.tenant != tenant {
                    return None;
                }
                let status = u16::try_from(t.response_status?).ok()?;
                Some(PayResponse { status, body: t.response_body?, replayed: true, location: None })
            }))
        };
        if let Some(response) = stored().await? {
            return Ok(response);
        }
        // A final payment's token holds its response, written by the commit that ended its workflow.
        match self.engine.wait(&payment_workflow_id(&record.token), wait).await {
            Ok(Some(_)) => {
                if let Some(response) = stored().await? {
                    return Ok(response);
                }
            }
            Ok(None) => return Ok(processing(&record)),
            Err(onceflow_engine::Error::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        // Neither the token's response nor the workflow is kept any more: what the record says.
        Ok(answer_of_record(&record).unwrap_or_else(|| {
            let detail = format!("request_no {} is already used by another payment", record.request_no);
            PayResponse::problem(409, "request_no_conflict", "Request number in use", &detail)
        }))
    }
}

/// Whether `request` asks for what the payment of `record` was for (its order, amount and currency).
fn same_fields(record: &PaymentRecord, request: &PaymentRequest) -> bool {
    record.order_no == *request.order_no()
        && record.amount == request.amount()
        && record.currency == *request.currency()
}

/// A payment's answer from its record alone, for when neither its token's stored answer nor its workflow is kept:
/// a charge (`201`, the bytes it was answered with), a decline (`402`, likewise), a payment still running
/// (`202`); `None` for a failed one, whose answer the record does not hold.
fn answer_of_record(record: &PaymentRecord) -> Option<PayResponse> {
    let replayed = |r: StoredResponse| PayResponse { replayed: true, ..PayResponse::fresh(r) };
    match record.status {
        PaymentStatus::Succeeded => Some(replayed(StoredResponse { status: 201, body: record.body().render() })),
        PaymentStatus::Declined => Some(replayed(Problem::declined(record.decline_code.clone()).response())),
        PaymentStatus::Processing => Some(processing(record)),
        PaymentStatus::Failed => None,
    }
}

/// The `code` of a problem answer.
fn problem_code(response: &PayResponse) -> Option<String> {
    if response.status < 400 {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(&response.body).ok()?;
    body.get("code")?.as_str().map(str::to_owned)
}

fn command_mismatch(request_no: &RequestNo) -> PayResponse {
    let detail = format!("request_no {request_no} was used for a different request");
    PayResponse::problem(422, "idempotency_key_mismatch", "Idempotency key reused", &detail)
}

/// `202`: the payment of `record` is not final yet.
fn processing(record: &PaymentRecord) -> PayResponse {
    PayResponse {
        status: 202,
        body: PaymentBody { status: PaymentStatus::Processing, charge_id: None, ..record.body() }.render(),
        replayed: false,
        location: Some(format!("/v1/payments/{}", record.request_no)),
    }
}

/// The workflow input of a request: bound to its token, its fingerprint and route, and the payment's number
/// (the client's, or derived from the token; never replaced).
fn payment_input(tenant: &str, token: &Token, route: &str, request: &PaymentRequest) -> PaymentInput {
    PaymentInput {
        tenant: tenant.to_owned(),
        token: token.clone(),
        route: route.to_owned(),
        fingerprint: request.fingerprint(),
        order_no: request.order_no().clone(),
        amount: request.amount(),
        currency: request.currency().clone(),
        request_no: request.request_no().cloned().unwrap_or_else(|| RequestNo::of_token(token)),
    }
}

/// The tenant's `token`, unused, issued `now` and living `ttl` ms.
fn unused_token(tenant: &str, token: &Token, now: i64, ttl: i64) -> TokenRecord {
    TokenRecord {
        token: token.clone(),
        tenant: tenant.to_owned(),
        state: TokenState::Issued,
        fingerprint: None,
        route: None,
        response_status: None,
        response_body: None,
        created_at: now,
        expires_at: now.saturating_add(ttl),
        updated_at: now,
    }
}
fn not_found() -> PayResponse {
    PayResponse::problem(404, "token_not_found", "Token not found", "the token is unknown or expired")
}

fn mismatch() -> PayResponse {
    PayResponse::problem(
        422,
        "idempotency_key_mismatch",
        "Idempotency key reused",
        "this token was used for a different request",
    )
}
