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
mod invariants;
mod model;
mod payments;
mod retention;
mod service;
mod settings;
mod store;

pub use channel::{
    Channel, ChannelError, Charge, ChargeRequest, ChargeStatus, Closed, HttpChannel, Ledger, LedgerCharge, MockChannel,
    MockChannelConfig, Refund, RefundRequest, RefundStatus, mock_channel_router,
};
pub use error::{Error, Result};
pub use invariants::{Violation, check_invariants};
pub use model::{
    Currency, InvalidField, KEY_PATTERN, Order, OrderNo, OrderStatus, PaymentBody, PaymentInput, PaymentRecord,
    PaymentRequest, PaymentStatus, Problem, RequestNo, StoredResponse, TOKEN_PATTERN, Token, TokenRecord, TokenState,
    payment_workflow_id, positive_amount, problem,
};
pub use payments::PaymentSaga;
pub use retention::{BATCH as RETENTION_BATCH, PassReport};
pub use service::{COMMAND_ROUTE, IssuedToken, PayResponse, Payments, TOKEN_TTL_MS};
pub use settings::Retention;
pub use store::{PassLock, PaymentCursor, PaymentStore, Reserve, ReserveSteps, TokenKind};
