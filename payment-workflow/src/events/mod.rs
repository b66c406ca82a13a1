//! Merchant events (`contracts/events.md`): every final outcome of a payment or refund becomes an event, written
//! by the outcome's own commit (the outbox, `outbox.rs`), kept in the tenant's event log in commit order, and
//! delivered to the tenant's webhook endpoints, signed per Standard Webhooks (`signing.rs`), on a stored retry
//! schedule (`settings.rs`), by the background delivery loop (`delivery.rs`), only to addresses the rules allow
//! (`address.rs`). `service.rs` is the front the API uses; `model.rs` what it is all made of; `store/` each
//! backend's SQL.

pub mod address;
mod delivery;
mod model;
pub mod outbox;
mod service;
mod settings;
pub mod signing;
mod store;

pub use model::{
    Attempt, AttemptOutcome, AttemptResult, CURSOR_PATTERN, Claimed, Delivery, DeliveryState, ENDPOINT_ID_PATTERN,
    EVENT_ID_PATTERN, Endpoint, Event, EventType, NewDelivery, NewEvent, Position, rfc3339,
};
pub use service::{EndpointPatch, EventError, EventPage, Events, MAX_ENDPOINTS, MAX_PAGE, ROTATION_OVERLAP};
pub use settings::{DEFAULT_SCHEDULE, EventSettings, wait_after};
pub use store::{EventBatch, EventStore, Scope};
