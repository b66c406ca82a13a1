//! Where events, endpoints, deliveries and attempts are kept: the [`EventStore`] trait, implemented once for the
//! two backends that share SQL text (`standard.rs`, with what differs in `postgres.rs` and `sqlite.rs`: how the
//! log is ordered in commit order, how a claim skips locked rows) and once for MySQL (`mysql.rs`).

use std::future::Future;

use onceflow_engine::{Conn, Store};

use super::model::{
    Attempt, AttemptResult, Claimed, Delivery, Endpoint, Event, EventType, NewDelivery, NewEvent, Position,
};
use crate::store::Sql;

mod mysql;
mod postgres;
mod sqlite;
mod standard;

/// Whose rows a read covers: one tenant's, or every tenant's (an operator).
pub type Scope<'a> = Option<&'a str>;

/// What one retention batch of events did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventBatch {
    /// Events deleted (with their deliveries and attempts).
    pub deleted: u64,
    /// Whether the batch reached events too young (or not yet dispatched): the pass stops there.
    pub done: bool,
}

/// A store that also keeps merchant events: the outbox, the event log, webhook endpoints and deliveries.
///
/// The outbox is written inside the transaction of the outcome it reports: [`EventStore::write_event`] in a
/// closure step's transaction (every backend), or `events::outbox::phase_write` in a statement phase (Postgres,
/// SQLite). Everything else runs outside any payment's transaction, in the background or on request.
pub trait EventStore: Store {
    /// Writes `event` in the caller's transaction (a transactional step's connection), unless an event for its
    /// outcome exists (the same id): whether it wrote it.
    fn write_event<'c>(conn: &'c mut Conn<Self>, event: &NewEvent) -> Sql<'c, bool>;

    /// Gives log positions to events committed without one (MySQL's sequencer: see its migration); how many. A
    /// no-op elsewhere, where the position is known at commit.
    fn sequence(&self) -> impl Future<Output = Result<u64, sqlx::Error>> + Send {
        async { Ok(0) }
    }

    /// Up to `limit` events of `scope` after `after` in commit order (of `types`, when not empty), only among
    /// those no later commit can precede.
    fn events_after(
        &self,
        scope: Scope<'_>,
        after: &Position,
        types: &[EventType],
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Event>, sqlx::Error>> + Send;

    /// One event.
    fn event(&self, id: &str) -> impl Future<Output = Result<Option<Event>, sqlx::Error>> + Send;

    /// The position of the newest event of `scope` the retention pass deleted.
    fn horizon(&self, scope: Scope<'_>) -> impl Future<Output = Result<Option<Position>, sqlx::Error>> + Send;

    /// Stores a new endpoint.
    fn insert_endpoint(&self, endpoint: &Endpoint) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// One endpoint.
    fn endpoint(&self, id: &str) -> impl Future<Output = Result<Option<Endpoint>, sqlx::Error>> + Send;

    /// The endpoints of `scope`, oldest first, at most `limit`.
    fn endpoints(
        &self,
        scope: Scope<'_>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Endpoint>, sqlx::Error>> + Send;

    /// Writes an endpoint's changeable fields (url, events, secrets, enabled, why disabled, updated).
    fn update_endpoint(&self, endpoint: &Endpoint) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes an endpoint; its pending deliveries fail. Whether it existed.
    fn delete_endpoint(&self, id: &str, now: i64) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Makes deliveries (one already made under an id is left as it is); how many it made.
    fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// An event's deliveries, oldest first.
    fn deliveries_of(&self, event_id: &str) -> impl Future<Output = Result<Vec<Delivery>, sqlx::Error>> + Send;

    /// An endpoint's attempts, newest first, before `(started_at, delivery_id, attempt)` when given.
    fn attempts_of(
        &self,
        endpoint_id: &str,
        before: Option<&(i64, String, i32)>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Attempt>, sqlx::Error>> + Send;

    /// The dispatcher's pass: turns up to `limit` events after its cursor (in commit order) into deliveries to
    /// the enabled endpoints of their tenant subscribed to them (created before the event), due at `now` with
    /// `schedule`, and moves the cursor past them — in one transaction, one process at a time. How many
    /// events it dispatched.
    fn dispatch(&self, limit: i64, now: i64, schedule: &str) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The enabled endpoints with a delivery due at `now`.
    fn due_endpoints(&self, now: i64) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;

    /// Claims up to `limit` deliveries of `endpoint_id` due at `now` for one attempt each, leased until
    /// `lease_until` (another process's claim skips them, and takes them again only once that has passed); each
    /// attempt is recorded in flight, and one a stopped process left in flight is recorded abandoned.
    fn claim(
        &self,
        endpoint_id: &str,
        limit: i64,
        now: i64,
        lease_until: i64,
    ) -> impl Future<Output = Result<Vec<Claimed>, sqlx::Error>> + Send;

    /// Records how a claimed attempt ended; the delivery moves on (delivered, due again, failed) only while the
    /// claim holds. A `410` disables the endpoint and fails its pending deliveries. Whether the claim held.
    fn finish(
        &self,
        claimed: &Claimed,
        result: &AttemptResult,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// How many deliveries are pending, and the oldest one's creation time (ms).
    fn pending(&self) -> impl Future<Output = Result<(i64, Option<i64>), sqlx::Error>> + Send;

    /// One retention batch: of the (at most `limit`) oldest events in log order after `from`, deletes those
    /// created at or before `by` that the dispatcher has passed and that have no pending delivery, with their
    /// deliveries and attempts, and moves each tenant's horizon past them. `from` is moved past the batch.
    fn delete_events(
        &self,
        from: &mut Position,
        by: i64,
        limit: i64,
        dry_run: bool,
    ) -> impl Future<Output = Result<EventBatch, sqlx::Error>> + Send;
}

/// The deliveries the dispatcher makes for `events`: each to every enabled endpoint of its tenant subscribed to
/// its type and created no later than it.
pub(crate) fn plan(events: &[Event], endpoints: &[Endpoint], now: i64, schedule: &str) -> Vec<NewDelivery> {
    let mut deliveries = Vec::new();
    for event in events {
        for endpoint in endpoints {
            if endpoint.enabled
                && endpoint.tenant == event.tenant
                && endpoint.created_at <= event.created_at
                && endpoint.wants(event.kind)
            {
                deliveries.push(NewDelivery::dispatched(&event.id, &endpoint.id, &event.tenant, now, schedule));
            }
        }
    }
    deliveries
}
