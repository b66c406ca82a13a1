//! The payment service, the crate's front: orders, tokens and reads here; paying over HTTP in `pay.rs`, for a
//! queued command in `command.rs`; refunding in `refund.rs`. The sagas it runs live below it (`crate::payments`,
//! `crate::refunds`), on the model and store they share.

use std::sync::Arc;

use onceflow_engine::clock::{Clock, SystemClock};
use onceflow_engine::{Engine, EngineConfig};

use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::events::{EventSettings, Events};
use crate::model::{
    Currency, Order, OrderNo, OrderStatus, PaymentRecord, Problem, RequestNo, StoredResponse, Token, TokenRecord,
    TokenState, positive_amount,
};
use crate::payments::PaymentSaga;
use crate::refunds::RefundSaga;
use crate::settings::{Retention, millis};
use crate::store::PaymentStore;

mod command;
mod pay;
mod refund;

pub use command::COMMAND_ROUTE;
pub use refund::refund_route;

/// How long an unused token lives by default (`--token-ttl`; see [`Retention`]).
pub const TOKEN_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// A newly issued idempotency token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IssuedToken {
    /// The token: 256 random bits, hex.
    pub token: Token,
    /// When it expires if unused (ms since the epoch).
    pub expires_at: i64,
}

/// The answer to a payment or refund request.
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
    events: Arc<EventSettings>,
}

impl<S: PaymentStore> Clone for Payments<S> {
    fn clone(&self) -> Self {
        Self { engine: self.engine.clone(), retention: self.retention, events: self.events.clone() }
    }
}

impl<S: PaymentStore> Payments<S> {
    /// The service, with its engine (the payment and refund sagas registered). Start the engine's background loop with
    /// `payments.engine().spawn_background()`.
    pub fn new(store: S, channel: Arc<dyn Channel>, config: EngineConfig) -> Self {
        Self::with_clock(store, channel, config, SystemClock)
    }

    /// [`Payments::new`] on `clock` (tests: a manual clock), by which tokens are issued and expire, payments
    /// end and retention passes measure ages.
    pub fn with_clock(store: S, channel: Arc<dyn Channel>, config: EngineConfig, clock: impl Clock) -> Self {
        let engine = Engine::builder(store)
            .register(PaymentSaga::new(channel.clone()))
            .register(RefundSaga::new(channel))
            .config(config)
            .clock(clock)
            .build();
        Self { engine, retention: Retention::default(), events: Arc::default() }
    }

    /// This service with `settings` for its merchant events (retention, where webhooks may go, the schedule).
    #[must_use]
    pub fn with_events(mut self, settings: EventSettings) -> Self {
        self.events = Arc::new(settings);
        self
    }

    /// The merchant events of this service: webhook endpoints, the event log, deliveries.
    pub fn events(&self) -> Events<S> {
        Events::new(self.engine.clone(), self.events.clone())
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
            reserved_by: None,
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

    /// A page of the payments of the tenant's order, newest first: at most `limit`, those after `after`.
    pub async fn payments_of_order_page(
        &self,
        tenant: &str,
        order_no: &OrderNo,
        after: Option<&crate::store::PaymentCursor>,
        limit: i64,
    ) -> Result<Vec<PaymentRecord>> {
        Ok(self.store().payments_of_order_page(tenant, order_no, after, limit).await?)
    }

    /// Issues an idempotency token for the tenant.
    pub async fn issue_token(&self, tenant: &str) -> Result<IssuedToken> {
        let token = Token::issue();
        let record = unused_token(tenant, &token, self.now(), self.token_ttl());
        self.store().insert_token(&record).await?;
        Ok(IssuedToken { token, expires_at: record.expires_at })
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
