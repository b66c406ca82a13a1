//! onceflow's payment service: a payment saga on the durable-step engine that never charges twice.
//!
//! Three layers stand against duplicate payments: an idempotency token bound to the request's fingerprint and
//! route (its final response stored and replayed), `request_no` unique per tenant forever, and an order state
//! machine moved only by conditional updates. Every step of a payment is durable, so after any crash the
//! payment resumes or compensates, and the channel — asked again only by the same `request_no` — sees one
//! charge.
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use onceflow_engine::{EngineConfig, SqliteStore};
//! use onceflow_payments::{Currency, MockChannel, OrderNo, PaymentRequest, PaymentStore, Payments};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://pay.db").await?;
//! store.migrate_payments().await?;
//! let payments = Payments::new(store, Arc::new(MockChannel::reliable()), EngineConfig::default());
//! let (order_no, currency) = (OrderNo::parse("O-1")?, Currency::parse("CNY")?);
//! payments.create_order("default", &order_no, 1000, &currency).await?;
//! let token = payments.issue_token("default").await?;
//! let request = PaymentRequest::new(order_no, 1000, currency, None)?;
//! let response = payments.pay("default", &token.token, "/v1/payments", &request, Duration::from_secs(10)).await?;
//! assert_eq!(response.status, 201);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod channel;
mod error;
pub mod events;
mod invariants;
mod model;
mod notifications;
mod payments;
mod reconcile;
mod refunds;
mod retention;
mod service;
mod settings;
mod store;

pub use channel::{
    Channel, ChannelError, Charge, ChargeRequest, ChargeStatus, Closed, HttpChannel, Ledger, LedgerCharge, MockChannel,
    MockChannelConfig, Refund, RefundRequest, RefundStatus, mock_channel_router,
};
pub use channel::{
    DEFAULT_NOTIFY_SCHEDULE, EntryKind, Notification, Statement, StatementLine, StatementSource, signature,
    with_notify_url,
};
pub use error::{Error, Result};
pub use events::{EventSettings, EventStore, EventType, Events, NewEvent};
pub use invariants::{Violation, check_invariants};
pub use model::{
    Currency, InvalidField, KEY_PATTERN, MAX_REASON_CHARS, MERCHANT_REFUND_PREFIX, NewRefund, Order, OrderNo,
    OrderStatus, PaymentBody, PaymentInput, PaymentRecord, PaymentRequest, PaymentStatus, Problem, RefundBody,
    RefundInput, RefundNo, RefundRecord, RefundRecorded, RefundState, RequestNo, StoredResponse, TOKEN_PATTERN, Token,
    TokenRecord, TokenState, merchant_refund_no, payment_workflow_id, positive_amount, problem, refund_no_of,
    refund_workflow_id,
};
pub use notifications::{
    ChannelAccounts, Delivered, NotTaken, Taken, WordOutcome, deliver_word, spawn_word_delivery, take_notification,
};
pub use payments::PaymentSaga;
pub use reconcile::{
    Class, ReconcileError, ReconcileReport, ReconciledException, Reconciler, Reconciliation, reconciliations,
};
pub use refunds::RefundSaga;
pub use retention::{BATCH as RETENTION_BATCH, PassReport};
pub use service::{COMMAND_ROUTE, IssuedToken, PayResponse, Payments, TOKEN_TTL_MS, refund_route};
pub use settings::Retention;
pub use store::{
    ChannelWord, ChannelWordStore, ExceptionRow, PassLock, PaymentCursor, PaymentStore, PhaseDialect,
    ReconciliationRow, RefundEnd, RefundPhase, RefundReserve, RefundSteps, RefundStore, Reserve, ReserveSteps,
    StagedLine, StatementCopy, TokenKind,
};
