//! Merchant events (`contracts/events.md`): every final outcome of a payment or refund becomes an event, written
//! by the outcome's own commit (the outbox, `outbox.rs`), kept in the tenant's event log in commit order, and
//! delivered to the tenant's webhook endpoints, signed per Standard Webhooks (`signing.rs`), on a stored retry
//! schedule (`settings.rs`), by the background delivery loop (`delivery.rs`: its slots in `slots.rs`, each
//! attempt in `attempt.rs`), only to addresses the rules allow (`address.rs`). `service.rs` is the front the API
//! uses; `model.rs` what it is all made of; `store/` each backend's SQL.
//!
//! This module sits below the payment store (`crate::store`), whose trait extends [`EventStore`] and whose
//! statement phases take [`outbox::phase_insert`]: nothing here uses the payment store.

pub mod address;
mod attempt;
mod delivery;
mod model;
pub mod outbox;
mod service;
mod settings;
pub mod signing;
mod slots;
mod store;

pub use model::{
    Attempt, AttemptOutcome, AttemptResult, CURSOR_PATTERN, Claimed, Delivery, DeliveryState, ENDPOINT_ID_PATTERN,
    EVENT_ID_PATTERN, Endpoint, EndpointChange, Event, EventType, NewDelivery, NewEvent, Position, rfc3339,
    well_formed,
};
pub use service::{EndpointPatch, EventError, EventPage, Events, MAX_ENDPOINTS, MAX_PAGE, ROTATION_OVERLAP};
pub use settings::{DEFAULT_SCHEDULE, EventSettings, MAX_RETRY_AFTER, retry_wait, wait_after};
pub use store::{EventBatch, EventStore, Holder, LogPage, Scope, Sql};
